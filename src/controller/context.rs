//! What every reconciler shares.

use std::sync::Arc;

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use tracing::warn;

use crate::api_client::SpareCapacity;
use crate::metrics_source::MetricsSource;
use crate::telemetry::Metrics;

use super::plan::PlannedEvent;
use super::replay::audit::{AuditSink, StdoutAudit};
use super::replay::pod_policy::WorkerPolicy;

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub queries: Arc<MetricsSource>,
    pub recorder: Recorder,
    /// The operator's --prometheus-url, used by budgets that name no server.
    pub default_prometheus: Option<String>,
    /// What replay worker pods may be.
    pub worker_policy: WorkerPolicy,
    /// Where replay audit records go (the operator's standard output).
    pub audit: Arc<dyn AuditSink>,
    /// How long transient reconcile failures last before an object's `Synced` condition says so.
    pub report_failures_after: std::time::Duration,
    /// What `client`'s rate limit leaves to writes that may wait.
    pub spare: SpareCapacity,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        queries: Arc<MetricsSource>,
        default_prometheus: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: super::apply::FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            queries,
            default_prometheus,
            worker_policy: WorkerPolicy::default(),
            audit: Arc::new(StdoutAudit),
            report_failures_after: super::synced::DEFAULT_REPORT_AFTER,
            spare: SpareCapacity::default(),
        }
    }

    pub fn with_spare(mut self, spare: SpareCapacity) -> Self {
        self.spare = spare;
        self
    }

    pub fn with_report_failures_after(mut self, after: std::time::Duration) -> Self {
        self.report_failures_after = after;
        self
    }

    pub fn with_worker_policy(mut self, policy: WorkerPolicy) -> Self {
        self.worker_policy = policy;
        self
    }

    pub fn with_audit(mut self, audit: Arc<dyn AuditSink>) -> Self {
        self.audit = audit;
        self
    }
}

/// The Events API caps notes at 1 kB.
const NOTE_LIMIT: usize = 1000;

impl Context {
    /// Publishes an Event about `object`; a failure is logged, never fatal to a reconcile.
    ///
    /// kube's recorder folds Events with the same type, reason and action into one series
    /// that keeps the first note, so callers put what distinguishes occurrences in `action`.
    pub async fn publish<K>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note.chars().take(NOTE_LIMIT).collect()),
            action: action.chars().take(128).collect(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            warn!(kind = %K::kind(&()), name = %object.name_any(), %error, "could not publish an event");
        }
    }

    /// Publishes an Event a plan decided on.
    pub async fn publish_planned<K>(&self, object: &K, event: &PlannedEvent)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(
            object,
            event.type_,
            &event.reason,
            &event.action,
            &event.note,
        )
        .await;
    }
}
