//! Who leads: the decision of leader election, from a Lease's state and the time.
//!
//! Only the leader reconciles (and so writes status); the others wait. A lease not renewed
//! within its duration is free to take.

use jiff::Timestamp;

/// The fields of a coordination.k8s.io Lease that matter here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration_seconds: i64,
}

/// What this replica should do about the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Nobody holds it (or the holder stopped renewing): take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renews it: stand by.
    Wait,
}

pub fn decide(lease: Option<&LeaseState>, me: &str, now: Timestamp) -> LeaseAction {
    let Some(lease) = lease else {
        return LeaseAction::Acquire;
    };
    match lease.holder.as_deref() {
        Some(holder) if holder == me => LeaseAction::Renew,
        None | Some("") => LeaseAction::Acquire,
        Some(_) => {
            let expired = lease.renewed.is_none_or(|renewed| {
                now.as_second() - renewed.as_second() > lease.duration_seconds
            });
            if expired {
                LeaseAction::Acquire
            } else {
                LeaseAction::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseState {
        LeaseState {
            holder: Some(holder.into()),
            renewed: Some(at(renewed)),
            duration_seconds: 15,
        }
    }

    #[test]
    fn a_missing_or_empty_lease_is_taken() {
        assert_eq!(decide(None, "a", at(0)), LeaseAction::Acquire);
        let empty = LeaseState {
            holder: None,
            renewed: None,
            duration_seconds: 15,
        };
        assert_eq!(decide(Some(&empty), "a", at(0)), LeaseAction::Acquire);
    }

    #[test]
    fn the_holder_renews_and_others_wait_until_it_expires() {
        let lease = held_by("a", 100);
        assert_eq!(decide(Some(&lease), "a", at(110)), LeaseAction::Renew);
        assert_eq!(decide(Some(&lease), "b", at(110)), LeaseAction::Wait);
        assert_eq!(decide(Some(&lease), "b", at(115)), LeaseAction::Wait);
        assert_eq!(decide(Some(&lease), "b", at(116)), LeaseAction::Acquire);
    }
}
