//! The reconcile wrapper every controller shares: timing and counting reconciles, and the error
//! policy — transient failures retried with exponential backoff and jitter per object, the
//! count reset by the object's next success.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    let result = reconciler.reconcile(object.clone()).await;
    reconciler
        .context()
        .metrics
        .reconciled(R::NAME, started.elapsed().as_secs_f64());
    if result.is_ok() {
        reconciler.failures().forget(&key_of(object.as_ref()));
    }
    result
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
