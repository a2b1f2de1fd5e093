//! The ReplayJob controller: freezes the scope, waits for a second person's approval of exactly
//! that scope, runs the canary batch, checks its effects, then runs the rest — as Indexed Jobs,
//! one index per batch.
//!
//! Thin: the decisions are `core::replay_plan`; this module reads the replay, its ConfigMap and
//! Jobs, asks Prometheus when the decision needs it, and writes what was decided. Children are
//! trusted only by the uid the API server answered the operator's create with.

pub(crate) mod adopt;
pub mod audit;
mod facts;
pub(crate) mod job;
mod memory;
mod plan;
pub mod pod_policy;
mod reconcile;
mod scope;
mod status;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};

use crate::api::replay_job::{ReplayJob, ReplayPhase};

use super::Scope;
use super::context::Context;
use super::error::Error;
use super::reconciler::{self, Failures, Reconciler};
use memory::{ChildMemory, KeyedLocks};

pub use job::{EVENT_IDS_FILE, EVENT_IDS_KEY, LABEL_REPLAY, LABEL_STAGE};

pub const CONTROLLER: &str = "replayjob";

/// What the replay reconciler needs besides the shared context.
pub struct ReplayContext {
    pub base: Arc<Context>,
    /// Serializes the decision to start a replay, per namespace and source queue: under it the
    /// replays of the queue are listed from the API server (not the cache) and the start is
    /// recorded, so two replays of one queue approved at the same moment cannot both start.
    /// Replays of other queues never wait for it.
    queue_locks: KeyedLocks,
    /// Children this process created, until the status records them.
    children: ChildMemory,
    failures: Failures,
}

impl Reconciler for ReplayContext {
    type Object = ReplayJob;
    const NAME: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.base
    }

    fn failures(&self) -> &Failures {
        &self.failures
    }

    async fn reconcile(
        &self,
        replay: Arc<ReplayJob>,
    ) -> Result<kube::runtime::controller::Action, Error> {
        reconcile::reconcile(&replay, self).await
    }
}

/// Phases in which a replay has ended for good (for its queue, at least).
pub fn ended(phase: Option<ReplayPhase>) -> bool {
    matches!(
        phase,
        Some(ReplayPhase::Succeeded | ReplayPhase::Halted | ReplayPhase::Failed)
    )
}

/// Replays waiting for the queue of `changed` once `changed` has ended: they are looked at
/// again at once instead of at their next periodic check.
fn waiting_behind(store: &Store<ReplayJob>, changed: &ReplayJob) -> Vec<ObjectRef<ReplayJob>> {
    let phase = changed.status.as_ref().and_then(|s| s.phase);
    if !ended(phase) && changed.metadata.deletion_timestamp.is_none() {
        return Vec::new();
    }
    let queue = facts::queue_key(changed);
    store
        .state()
        .iter()
        .filter(|other| {
            facts::queue_key(other) == queue
                && other.uid() != changed.uid()
                && other.status.as_ref().and_then(|s| s.phase) == Some(ReplayPhase::Approved)
        })
        .map(|other| ObjectRef::from_obj(other.as_ref()))
        .collect()
}

/// The replay a Job's label names, in the Job's namespace.
fn replay_of_job(job: Job) -> Option<ObjectRef<ReplayJob>> {
    let namespace = job.namespace()?;
    let replay = job.labels().get(LABEL_REPLAY)?;
    Some(ObjectRef::new(replay).within(&namespace))
}

pub async fn run(ctx: Arc<Context>, scope: Scope) {
    let client = ctx.client.clone();
    // One watch of ReplayJobs both triggers each replay and wakes the replays queued behind
    // one that ended.
    let (replays, writer) = reflector::store();
    let queue_store = replays.clone();
    let (wake_waiting, waiting) = futures::channel::mpsc::unbounded();
    let replay_changes = watcher(scope.api::<ReplayJob>(&client), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .inspect(move |changed| {
            if let Ok(changed) = changed {
                for waiting in waiting_behind(&queue_store, changed) {
                    // The receiver lives as long as the controller that reads it.
                    let _ = wake_waiting.unbounded_send(waiting);
                }
            }
        });
    let context = Arc::new(ReplayContext {
        base: ctx,
        queue_locks: KeyedLocks::default(),
        children: ChildMemory::default(),
        failures: Failures::default(),
    });
    Controller::for_stream(replay_changes, replays)
        // Only the Jobs this controller made carry the label: no watch on every Job. A Job
        // maps to its replay by that label, not its owner reference, so a Job whose owner
        // reference was removed still wakes the replay it would outlive.
        .watches(
            scope.api::<Job>(&client),
            watcher::Config::default().labels(LABEL_REPLAY),
            replay_of_job,
        )
        .reconcile_on(waiting)
        .shutdown_on_signal()
        .run(reconciler::reconcile, reconciler::error_policy, context)
        .for_each(|_| futures::future::ready(()))
        .await;
}
