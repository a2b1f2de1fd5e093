//! The reconcile wrapper every controller shares: timing and counting reconciles, the error
//! policy — transient failures retried with exponential backoff and jitter per object, the
//! count reset by the object's next success — and the `Synced` condition that reports a
//! failure streak once it matters (see [`super::synced`]).

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::context::Context;
use super::error::Error;
use super::retry;
use super::synced::{self, SYNCED_MANAGER, Streak};
use crate::api::conditions::{ConditionSpec, StatusConditions, merge_conditions};

/// One controller's reconcile: read → decide → apply for one object.
pub trait Reconciler: Send + Sync + 'static {
    type Object: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + StatusConditions
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;

    /// The controller's name in metrics and logs.
    const NAME: &'static str;

    /// The shared context.
    fn context(&self) -> &Context;

    /// Consecutive failures per object.
    fn failures(&self) -> &Failures;

    /// One pass over `object`.
    fn reconcile(
        &self,
        object: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Error>> + Send;
}

/// The longest one reconcile may take: every call in it has its own timeout, and this bounds
/// their sum, so an object whose reconcile hangs is retried instead of held forever.
pub const RECONCILE_DEADLINE: Duration = Duration::from_secs(120);

/// Objects whose failures are counted at most: an object deleted while failing is never
/// reconciled again to be forgotten, so the oldest counts go first beyond this.
const MAX_COUNTED: usize = 10_000;

/// One object's failure streak.
#[derive(Clone, Copy, Debug)]
struct Counted {
    failures: u32,
    since: Instant,
}

/// Consecutive failures per object (`namespace/name`), for the backoff and the `Synced`
/// condition.
#[derive(Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, Counted>>,
}

impl Failures {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Counted>> {
        // A poisoned lock only means a panic elsewhere; the counts are still usable.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one more failure of `key` at `now` and returns the streak.
    pub fn failed(&self, key: &str, now: Instant) -> Streak {
        let mut counts = self.counts();
        if counts.len() >= MAX_COUNTED && !counts.contains_key(key) {
            // Any one will do: a forgotten count only restarts that object's backoff.
            if let Some(victim) = counts.keys().next().cloned() {
                counts.remove(&victim);
            }
        }
        let counted = counts.entry(key.to_owned()).or_insert(Counted {
            failures: 0,
            since: now,
        });
        counted.failures = counted.failures.saturating_add(1);
        Streak {
            failures: counted.failures,
            failing_for: now.saturating_duration_since(counted.since),
        }
    }

    /// The failures counted for `key` so far.
    pub fn count(&self, key: &str) -> u32 {
        self.counts().get(key).map_or(0, |c| c.failures)
    }

    /// Forgets `key` (it succeeded, or it is gone).
    pub fn forget(&self, key: &str) {
        self.counts().remove(key);
    }

    /// Objects currently failing.
    pub fn len(&self) -> usize {
        self.counts().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn key_of<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

/// Runs one reconcile of `object` and records it.
pub async fn reconcile<R: Reconciler>(
    object: Arc<R::Object>,
    reconciler: Arc<R>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let what = || {
        format!(
            "reconciling {} {}",
            R::Object::kind(&()),
            key_of(object.as_ref())
        )
    };
    let result = within(
        RECONCILE_DEADLINE,
        what,
        reconciler.reconcile(object.clone()),
    )
    .await;
    reconciler
        .context()
        .metrics
        .reconciled(R::NAME, started.elapsed().as_secs_f64());
    let key = key_of(object.as_ref());
    let synced = match &result {
        Ok(_) => {
            reconciler.failures().forget(&key);
            synced::after_success(object.status_conditions())
        }
        Err(error) => {
            let streak = reconciler.failures().failed(&key, Instant::now());
            synced::after_failure(
                error,
                streak,
                reconciler.context().report_failures_after,
                object.status_conditions(),
            )
        }
    };
    if let Some(condition) = synced {
        report::<R>(reconciler.context(), &object, &condition).await;
    }
    result
}

/// An apply body that holds the `Synced` condition and nothing else.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SyncedPatch<'a> {
    api_version: &'a str,
    kind: &'a str,
    status: SyncedStatus,
}

#[derive(Debug, Serialize)]
struct SyncedStatus {
    conditions: Vec<Condition>,
}

/// Writes `condition` to the object's status under its own field manager. A failure is only
/// logged: the next reconcile says it again, and an unreachable API server is the usual cause.
async fn report<R: Reconciler>(context: &Context, object: &R::Object, condition: &ConditionSpec) {
    let (Some(namespace), Some(name)) = (
        object.meta().namespace.as_deref(),
        object.meta().name.as_deref(),
    ) else {
        return;
    };
    let conditions = merge_conditions(
        object.status_conditions(),
        std::slice::from_ref(condition),
        object.meta().generation,
        Timestamp::now(),
    );
    let Some(synced) = conditions.into_iter().find(|c| c.type_ == condition.type_) else {
        return;
    };
    let api_version = R::Object::api_version(&());
    let kind = R::Object::kind(&());
    let patch = SyncedPatch {
        api_version: &api_version,
        kind: &kind,
        status: SyncedStatus {
            conditions: vec![synced],
        },
    };
    let api: Api<R::Object> = Api::namespaced(context.client.clone(), namespace);
    let params = PatchParams::apply(SYNCED_MANAGER).force();
    if let Err(error) = api.patch_status(name, &params, &Patch::Apply(&patch)).await {
        warn!(controller = R::NAME, %namespace, %name, %error, "could not write the Synced condition");
    }
}

/// `work`, or a timeout error naming `what` when it takes longer than `deadline`.
async fn within<T>(
    deadline: Duration,
    what: impl FnOnce() -> String,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                what: what(),
                seconds: deadline.as_secs(),
            })
        })
}

/// After a failed reconcile: try again after a backoff that grows with the object's
/// consecutive failures, sooner for transient errors than for permanent ones.
pub fn error_policy<R: Reconciler>(
    object: Arc<R::Object>,
    error: &Error,
    reconciler: Arc<R>,
) -> Action {
    // Counted by the wrapper, which ran just before.
    let failures = reconciler.failures().count(&key_of(object.as_ref())).max(1);
    let persistence = error.persistence();
    let wait = retry::after_failure(persistence, failures, retry::unit_random());
    warn!(
        controller = R::NAME,
        kind = %R::Object::kind(&()),
        name = %object.name_any(),
        namespace = object.namespace().unwrap_or_default(),
        %error,
        ?persistence,
        failures,
        retry_in = ?wait,
        "reconcile failed"
    );
    reconciler.context().metrics.failed(R::NAME, error.kind());
    Action::requeue(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hung_reconcile_ends_as_a_transient_timeout() {
        let hung = std::future::pending::<Result<(), Error>>();
        let result = within(
            Duration::from_millis(10),
            || "reconciling X a/b".into(),
            hung,
        )
        .await;
        let Err(error) = result else {
            panic!("a hung reconcile should time out");
        };
        assert!(error.to_string().contains("reconciling X a/b"), "{error}");
        assert_eq!(
            error.persistence(),
            super::super::error::Persistence::Transient
        );
        let quick = within(Duration::from_secs(5), || unreachable!(), async { Ok(7) }).await;
        assert_eq!(quick.ok(), Some(7));
    }

    #[test]
    fn failure_counts_stay_bounded() {
        let failures = Failures::default();
        let start = Instant::now();
        for i in 0..MAX_COUNTED + 50 {
            failures.failed(&format!("ns/{i}"), start);
        }
        assert_eq!(failures.len(), MAX_COUNTED);
        // A counted object keeps counting, from its first failure.
        let kept = failures.counts().keys().next().cloned().unwrap();
        let before = failures.count(&kept);
        let streak = failures.failed(&kept, start + Duration::from_secs(7));
        assert_eq!(streak.failures, before + 1);
        assert_eq!(streak.failing_for, Duration::from_secs(7));
        assert_eq!(failures.len(), MAX_COUNTED);
        failures.forget(&kept);
        assert_eq!(failures.count(&kept), 0);
    }
}
