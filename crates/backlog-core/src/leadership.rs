//! Who leads, and until when: the decisions of leader election over a Lease, with client-go's
//! semantics.
//!
//! - Every time here is a reading of the *local monotonic clock* (an [`Instant`]) passed in by
//!   the caller. The time stamps inside a Lease were written by another machine's wall clock and
//!   are never compared with ours: a standby measures a holder's lease from the moment it *saw
//!   the record change*, so clock offsets between machines cannot move a takeover early.
//! - A leader counts its term from the moment it *sent* the write that renewed the Lease and
//!   stops writing after `renew_deadline`, strictly before `lease`: the record a standby sees
//!   was written after that send, so the standby's count starts later and lasts longer. The gap
//!   (`lease − renew_deadline`) absorbs clock-rate differences and requests still in flight.
//! - An identity is required and must be unique per replica (the pod's name): two processes
//!   with one identity would both believe they hold the Lease.

use std::fmt;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use thiserror::Error;

/// The three durations of leader election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    lease: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TimingError {
    #[error(
        "--lease-duration {0:?} must be a whole number of seconds, at least 1s (a Lease stores whole seconds)"
    )]
    LeaseNotWholeSeconds(Duration),
    #[error(
        "--lease-renew-deadline {renew_deadline:?} must be shorter than --lease-duration {lease:?}: a leader stops writing at its renew deadline, before a standby may take over"
    )]
    RenewDeadlineNotBelowLease {
        lease: Duration,
        renew_deadline: Duration,
    },
    #[error(
        "--lease-retry-period {retry_period:?} must be above zero and shorter than --lease-renew-deadline {renew_deadline:?}, or a leader cannot retry a failed renewal before its deadline"
    )]
    RetryPeriodNotBelowRenewDeadline {
        renew_deadline: Duration,
        retry_period: Duration,
    },
}

impl Timing {
    pub fn new(
        lease: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Timing, TimingError> {
        if lease < Duration::from_secs(1) || lease.subsec_nanos() != 0 {
            return Err(TimingError::LeaseNotWholeSeconds(lease));
        }
        if renew_deadline >= lease {
            return Err(TimingError::RenewDeadlineNotBelowLease {
                lease,
                renew_deadline,
            });
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(TimingError::RetryPeriodNotBelowRenewDeadline {
                renew_deadline,
                retry_period,
            });
        }
        Ok(Timing {
            lease,
            renew_deadline,
            retry_period,
        })
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    pub fn retry_period(&self) -> Duration {
        self.retry_period
    }

    /// What a Lease written by us says its duration is.
    pub fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease.as_secs()).unwrap_or(i32::MAX)
    }

    /// The last moment a leader may write, given when it sent its last successful renewal.
    pub fn leads_until(&self, renewal_sent_at: Instant) -> Instant {
        renewal_sent_at + self.renew_deadline
    }

    /// The deadline of one Lease call made by a standby: it gives up within a renew deadline.
    pub fn standby_call_deadline(&self, now: Instant) -> Instant {
        now + self.renew_deadline
    }
}

/// Who this replica is: the holder identity it writes into the Lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity(String);

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum IdentityError {
    #[error(
        "leader election needs a stable identity unique to this replica: set POD_NAME (the chart passes the pod's name from the downward API) or --identity"
    )]
    Missing,
    #[error(
        "identity {0:?} must be 1 to 253 printable characters without spaces (use the pod's name)"
    )]
    Unusable(String),
}

impl Identity {
    pub fn new(value: Option<&str>) -> Result<Identity, IdentityError> {
        let value = value.map(str::trim).filter(|v| !v.is_empty());
        let Some(value) = value else {
            return Err(IdentityError::Missing);
        };
        if value.len() > 253 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(IdentityError::Unusable(value.to_owned()));
        }
        Ok(Identity(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fields of a Lease's spec that make up its record. Any change to them is a renewal or a
/// change of holder; the times are kept only to tell versions apart, never compared with ours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub duration_seconds: Option<i32>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: Option<i32>,
}

impl LeaseRecord {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }

    /// The record of `me` taking the Lease over from this one.
    pub fn taken_over_by(&self, me: &Identity, timing: &Timing, now: Timestamp) -> LeaseRecord {
        let changes_hands = self.holder() != Some(me.as_str());
        LeaseRecord {
            holder: Some(me.as_str().to_owned()),
            duration_seconds: Some(timing.lease_seconds()),
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: Some(
                self.transitions.unwrap_or(0) + i32::from(changes_hands && self.holder.is_some()),
            ),
        }
    }

    /// The record of the holder renewing it.
    pub fn renewed(&self, me: &Identity, timing: &Timing, now: Timestamp) -> LeaseRecord {
        LeaseRecord {
            holder: Some(me.as_str().to_owned()),
            duration_seconds: Some(timing.lease_seconds()),
            acquire_time: self.acquire_time.or(Some(now)),
            renew_time: Some(now),
            transitions: Some(self.transitions.unwrap_or(0)),
        }
    }

    /// The record a leader leaves behind when it shuts down: no holder, so a standby takes over
    /// at once instead of waiting out a lease.
    pub fn released(&self, now: Timestamp) -> LeaseRecord {
        LeaseRecord {
            holder: None,
            duration_seconds: Some(1),
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: self.transitions,
        }
    }
}

/// A Lease record and the local time at which it was first seen in this form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    pub changed_at: Instant,
}

/// Remembers `record`, read at `now`: the time of change moves only when the record changed.
pub fn observe(previous: Option<&Observed>, record: LeaseRecord, now: Instant) -> Observed {
    match previous {
        Some(previous) if previous.record == record => previous.clone(),
        _ => Observed {
            record,
            changed_at: now,
        },
    }
}

/// What a replica that does not lead should do about the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidacy {
    /// There is no Lease: create it with us as the holder.
    Create,
    /// Nobody holds it, it is ours from an earlier run, or its holder has not renewed it for a
    /// whole lease as we measure it: write ourselves in (on the version we read).
    TakeOver,
    /// Someone else holds it; look again, no sooner than the retry period. `expires_at` is when
    /// it would expire if it is not renewed meanwhile.
    Wait { expires_at: Instant },
}

/// The decision of a standby. A lease with no usable duration counts as our own duration, so a
/// malformed record never shortens a holder's term.
pub fn candidacy(
    observed: Option<&Observed>,
    me: &Identity,
    timing: &Timing,
    now: Instant,
) -> Candidacy {
    let Some(observed) = observed else {
        return Candidacy::Create;
    };
    match observed.record.holder() {
        None => Candidacy::TakeOver,
        Some(holder) if holder == me.as_str() => Candidacy::TakeOver,
        Some(_) => {
            let duration = observed
                .record
                .duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map_or(timing.lease, Duration::from_secs);
            let expires_at = observed.changed_at + duration;
            if now >= expires_at {
                Candidacy::TakeOver
            } else {
                Candidacy::Wait { expires_at }
            }
        }
    }
}

/// What the leader does at a renewal tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Renew now; the call must be over by `call_deadline` (its term's end).
    Renew { call_deadline: Instant },
    /// The term is over: stop writing and stand by.
    StepDown,
}

/// The leader's decision at `now`, given when its last successful renewal was sent.
pub fn renewal(renewal_sent_at: Instant, timing: &Timing, now: Instant) -> Renewal {
    let leads_until = timing.leads_until(renewal_sent_at);
    if now >= leads_until {
        Renewal::StepDown
    } else {
        Renewal::Renew {
            call_deadline: leads_until,
        }
    }
}

/// Whether the record read back after a failed renewal (a conflict) still names us: if not,
/// someone took the Lease and we stand down at once.
pub fn still_ours(record: &LeaseRecord, me: &Identity) -> bool {
    record.holder() == Some(me.as_str())
}

#[cfg(test)]
mod tests;
