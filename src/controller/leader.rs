//! Leader election over a coordination.k8s.io Lease, so that with several operator replicas
//! exactly one reconciles and writes status. The decision is `core::leadership`; this is the
//! I/O around it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{info, warn};

use super::error::{ApiCall, During, Error, LeadershipLost, Verb};
use crate::core::leadership::{LeaseAction, LeaseState, decide};

/// Where the lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl LeaseSettings {
    /// Renew well within the duration so a slow API call does not lose the lease.
    fn renew_every(&self) -> Duration {
        self.duration / 3
    }
}

fn state_of(lease: &Lease) -> LeaseState {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseState {
        holder: spec.holder_identity,
        renewed: spec.renew_time.map(|t| t.0),
        duration_seconds: i64::from(spec.lease_duration_seconds.unwrap_or(15)),
    }
}

/// Makes one attempt; true when we hold the lease afterwards. Conflicts (someone else wrote
/// the lease in between) mean "not this time".
async fn attempt(api: &Api<Lease>, settings: &LeaseSettings) -> Result<bool, Error> {
    let now = Timestamp::now();
    let current = api
        .get_opt(&settings.name)
        .await
        .during(|| ApiCall::on::<Lease>(Verb::Get, &settings.namespace, &settings.name))?;
    let action = decide(
        current.as_ref().map(state_of).as_ref(),
        &settings.identity,
        now,
    );
    if action == LeaseAction::Wait {
        return Ok(false);
    }
    let previous = current
        .as_ref()
        .and_then(|l| l.spec.clone())
        .unwrap_or_default();
    let transitions = previous.lease_transitions.unwrap_or(0)
        + i32::from(action == LeaseAction::Acquire && current.is_some());
    let spec = LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(settings.duration.as_secs()).unwrap_or(15)),
        acquire_time: if action == LeaseAction::Acquire {
            Some(MicroTime(now))
        } else {
            previous.acquire_time
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let current_exists = current.is_some();
    let result = match current {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(settings.name.clone()),
                    namespace: Some(settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await
        }
        Some(mut lease) => {
            // Replace carries the resourceVersion we read: a concurrent writer makes this fail.
            lease.spec = Some(spec);
            api.replace(&settings.name, &PostParams::default(), &lease)
                .await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(source) => Err(Error::api(
            ApiCall::on::<Lease>(
                if current_exists {
                    Verb::Replace
                } else {
                    Verb::Create
                },
                &settings.namespace,
                &settings.name,
            ),
            source,
        )),
    }
}

/// Waits until this replica holds the lease.
pub async fn acquire(client: Client, settings: &LeaseSettings) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    loop {
        match attempt(&api, settings).await {
            Ok(true) => {
                info!(identity = %settings.identity, lease = %settings.name, "leading");
                return Ok(());
            }
            Ok(false) => {}
            Err(error) => warn!(%error, "leader election attempt failed"),
        }
        tokio::time::sleep(settings.renew_every()).await;
    }
}

/// Renews the lease until it cannot: returns when leadership is lost (the caller stops the
/// controllers, so two replicas never reconcile at once).
pub async fn keep(client: Client, settings: LeaseSettings) -> Error {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(settings.renew_every()).await;
        match attempt(&api, &settings).await {
            Ok(true) => last_renewal = tokio::time::Instant::now(),
            Ok(false) => {
                return LeadershipLost::TakenOver {
                    namespace: settings.namespace.clone(),
                    name: settings.name.clone(),
                }
                .into();
            }
            Err(error) => {
                warn!(%error, "could not renew the lease");
                if last_renewal.elapsed() >= settings.duration {
                    return LeadershipLost::NotRenewed {
                        namespace: settings.namespace.clone(),
                        name: settings.name.clone(),
                        within: settings.duration,
                    }
                    .into();
                }
            }
        }
    }
}
