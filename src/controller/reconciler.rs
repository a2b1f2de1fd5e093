//! The reconcile wrapper every controller shares: timing and counting reconciles, and the error
//! policy — transient failures retried with exponential backoff and jitter per object, the
//! count reset by the object's next success.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::context::Context;
use super::error::Error;
use super::retry;

/// One controller's reconcile: read → decide → apply for one object.
pub trait Reconciler: Send + Sync + 'static {
    type Object: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static;

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

/// Consecutive failures per object (`namespace/name`), for the backoff.
#[derive(Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // A poisoned lock only means a panic elsewhere; the counts are still usable.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one more failure of `key` and returns the count.
    pub fn failed(&self, key: &str) -> u32 {
        let mut counts = self.counts();
        if counts.len() >= MAX_COUNTED && !counts.contains_key(key) {
            // Any one will do: a forgotten count only restarts that object's backoff.
            if let Some(victim) = counts.keys().next().cloned() {
                counts.remove(&victim);
            }
        }
        let count = counts.entry(key.to_owned()).or_insert(0);
        *count = count.saturating_add(1);
        *count
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
    if result.is_ok() {
        reconciler.failures().forget(&key_of(object.as_ref()));
    }
    result
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
    let failures = reconciler.failures().failed(&key_of(object.as_ref()));
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
        for i in 0..MAX_COUNTED + 50 {
            failures.failed(&format!("ns/{i}"));
        }
        assert_eq!(failures.len(), MAX_COUNTED);
        // A counted object keeps counting.
        let kept = failures.counts().keys().next().cloned().unwrap();
        let before = failures.counts()[&kept];
        assert_eq!(failures.failed(&kept), before + 1);
        assert_eq!(failures.len(), MAX_COUNTED);
    }
}
