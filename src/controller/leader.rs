//! Leader election over a coordination.k8s.io Lease, so that with several operator replicas
//! exactly one writes at a time. The decisions are `core::leadership` (client-go's semantics);
//! this is the I/O around them.
//!
//! Every Lease call goes through a client of its own whose write gate is opened for that call
//! only, until the call's deadline: a renewal can never be sent after the term it would extend.
//! The controllers' client has the other gate, which the leader opens to the end of its term.

use std::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use thiserror::Error;
use tracing::{info, warn};

use crate::api_client::WriteGate;
use crate::core::leadership::{
    Candidacy, Identity, LeaseRecord, Observed, Renewal, Timing, candidacy, observe, renewal,
    still_ours,
};

/// Where the lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: Identity,
    pub timing: Timing,
}

/// Why a Lease call failed.
#[derive(Debug, Error)]
pub enum LeaseError {
    #[error("{action} Lease {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} Lease {namespace}/{name}: no answer before the call's deadline")]
    Deadline {
        action: &'static str,
        namespace: String,
        name: String,
    },
}

/// Why a leader stopped leading.
#[derive(Debug, Error)]
pub enum LostLeadership {
    #[error(
        "the Lease was not renewed within the renew deadline ({deadline:?}); stopped writing before it can expire anywhere"
    )]
    NotRenewed { deadline: std::time::Duration },
    #[error("the Lease is now held by {holder:?}")]
    TakenOver { holder: Option<String> },
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    /// The gate of the Lease client: open during one call, until its deadline.
    call_gate: WriteGate,
    settings: LeaseSettings,
    /// The Lease as last read or written, for its resourceVersion.
    current: Option<Lease>,
    /// Its record and when we saw it change.
    observed: Option<Observed>,
}

fn record_of(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        duration_seconds: spec.lease_duration_seconds,
        acquire_time: spec.acquire_time.map(|t| t.0),
        renew_time: spec.renew_time.map(|t| t.0),
        transitions: spec.lease_transitions,
    }
}

fn spec_of(record: LeaseRecord) -> LeaseSpec {
    LeaseSpec {
        holder_identity: record.holder,
        lease_duration_seconds: record.duration_seconds,
        acquire_time: record.acquire_time.map(MicroTime),
        renew_time: record.renew_time.map(MicroTime),
        lease_transitions: record.transitions,
        ..LeaseSpec::default()
    }
}

fn is_conflict(error: &LeaseError) -> bool {
    matches!(error, LeaseError::Api { source: kube::Error::Api(status), .. } if status.code == 409)
}

impl Elector {
    /// `client` must be one whose connections are gated by `call_gate` and used for nothing
    /// else (see `api_client::build`).
    pub fn new(client: Client, call_gate: WriteGate, settings: LeaseSettings) -> Elector {
        Elector {
            api: Api::namespaced(client, &settings.namespace),
            call_gate,
            settings,
            current: None,
            observed: None,
        }
    }

    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// One Lease call that must be over by `deadline`: the gate lets its bytes out until then.
    async fn call<T>(
        &self,
        action: &'static str,
        deadline: Instant,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        self.call_gate.open_until(deadline);
        let result = tokio::time::timeout_at(deadline.into(), call).await;
        self.call_gate.close();
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(LeaseError::Api {
                action,
                namespace: self.settings.namespace.clone(),
                name: self.settings.name.clone(),
                source,
            }),
            Err(_) => Err(LeaseError::Deadline {
                action,
                namespace: self.settings.namespace.clone(),
                name: self.settings.name.clone(),
            }),
        }
    }

    /// Reads the Lease and remembers when its record changed.
    async fn read(&mut self, deadline: Instant) -> Result<(), LeaseError> {
        let name = self.settings.name.clone();
        let found = self
            .call("reading", deadline, self.api.get_opt(&name))
            .await?;
        let now = Instant::now();
        self.observed = found
            .as_ref()
            .map(|lease| observe(self.observed.as_ref(), record_of(lease), now));
        self.current = found;
        Ok(())
    }

    /// Remembers the Lease we wrote; our own writes count as changes seen when they were sent.
    fn wrote(&mut self, lease: Lease, sent_at: Instant) {
        self.observed = Some(observe(self.observed.as_ref(), record_of(&lease), sent_at));
        self.current = Some(lease);
    }

    /// Waits until this replica leads; returns when the write that made it leader was sent.
    pub async fn acquire(&mut self) -> Instant {
        loop {
            match self.try_acquire().await {
                Ok(Some(sent_at)) => {
                    info!(identity = %self.settings.identity, lease = %self.settings.name, "leading");
                    return sent_at;
                }
                Ok(None) => {}
                Err(error) if is_conflict(&error) => {}
                Err(error) => warn!(%error, "leader election attempt failed"),
            }
            tokio::time::sleep(self.settings.timing.retry_period()).await;
        }
    }

    async fn try_acquire(&mut self) -> Result<Option<Instant>, LeaseError> {
        let timing = self.settings.timing;
        self.read(timing.standby_call_deadline(Instant::now()))
            .await?;
        let now = Instant::now();
        let decision = candidacy(
            self.observed.as_ref(),
            &self.settings.identity,
            &timing,
            now,
        );
        let previous = self.current.as_ref().map(record_of).unwrap_or_default();
        let record = previous.taken_over_by(&self.settings.identity, &timing, Timestamp::now());
        let deadline = timing.standby_call_deadline(now);
        let written = match decision {
            Candidacy::Wait { .. } => return Ok(None),
            Candidacy::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec_of(record)),
                };
                self.call(
                    "creating",
                    deadline,
                    self.api.create(&PostParams::default(), &lease),
                )
                .await?
            }
            Candidacy::TakeOver => {
                let Some(mut lease) = self.current.clone() else {
                    return Ok(None);
                };
                // The version we read: if anyone wrote the Lease since, this is refused.
                lease.spec = Some(spec_of(record));
                let name = self.settings.name.clone();
                self.call(
                    "taking over",
                    deadline,
                    self.api.replace(&name, &PostParams::default(), &lease),
                )
                .await?
            }
        };
        self.wrote(written, now);
        Ok(Some(now))
    }

    /// Renews the Lease while it can, extending `gate` after every renewal; returns why it
    /// stopped leading. `gate` is closed by itself at the term's end if renewals fail; the
    /// caller closes it for good once this returns.
    pub async fn keep(&mut self, mut renewal_sent_at: Instant, gate: &WriteGate) -> LostLeadership {
        let timing = self.settings.timing;
        let mut next_attempt = renewal_sent_at + timing.retry_period();
        loop {
            tokio::time::sleep_until(next_attempt.into()).await;
            let now = Instant::now();
            next_attempt = now + timing.retry_period();
            let call_deadline = match renewal(renewal_sent_at, &timing, now) {
                Renewal::StepDown => {
                    return LostLeadership::NotRenewed {
                        deadline: timing.renew_deadline(),
                    };
                }
                Renewal::Renew { call_deadline } => call_deadline,
            };
            match self.renew(now, call_deadline).await {
                Ok(()) => {
                    renewal_sent_at = now;
                    gate.open_until(timing.leads_until(now));
                }
                Err(error) if is_conflict(&error) => {
                    // Someone else wrote the Lease: read it again and look who holds it.
                    match self.read(call_deadline).await {
                        Ok(()) => {
                            let record = self.current.as_ref().map(record_of).unwrap_or_default();
                            if !still_ours(&record, &self.settings.identity) {
                                return LostLeadership::TakenOver {
                                    holder: record.holder,
                                };
                            }
                            // Still ours (our own write raced): renew again at once.
                            next_attempt = Instant::now();
                        }
                        Err(error) => warn!(%error, "could not read the Lease after a conflict"),
                    }
                }
                Err(error) => warn!(%error, "could not renew the Lease"),
            }
        }
    }

    async fn renew(&mut self, sent_at: Instant, deadline: Instant) -> Result<(), LeaseError> {
        let Some(mut lease) = self.current.clone() else {
            return Ok(());
        };
        let record = record_of(&lease).renewed(
            &self.settings.identity,
            &self.settings.timing,
            Timestamp::now(),
        );
        lease.spec = Some(spec_of(record));
        let name = self.settings.name.clone();
        let written = self
            .call(
                "renewing",
                deadline,
                self.api.replace(&name, &PostParams::default(), &lease),
            )
            .await?;
        self.wrote(written, sent_at);
        Ok(())
    }

    /// Gives the Lease up (on a graceful shutdown, after the controllers stopped and their gate
    /// closed), so that a standby takes over at once instead of after a whole lease.
    pub async fn release(&mut self) {
        let Some(mut lease) = self.current.clone() else {
            return;
        };
        let record = record_of(&lease);
        if !still_ours(&record, &self.settings.identity) {
            return;
        }
        lease.spec = Some(spec_of(record.released(Timestamp::now())));
        let deadline = Instant::now() + self.settings.timing.retry_period();
        let name = self.settings.name.clone();
        match self
            .call(
                "releasing",
                deadline,
                self.api.replace(&name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(written) => {
                info!(lease = %self.settings.name, "released the Lease");
                self.current = Some(written);
            }
            Err(error) => {
                warn!(%error, "could not release the Lease; a standby takes over when it expires")
            }
        }
    }
}
