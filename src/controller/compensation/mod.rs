//! The Compensation controller: freezes the request and claims its compensationId, waits for a
//! second person's approval of exactly that request, runs the team's worker once as a Job, and
//! records what the worker reports, sub-action by sub-action.
//!
//! Thin: the decisions are `core::compensation_plan`; this module reads the claim, the Job and
//! the worker's report, and writes what was decided.

mod job;
mod job_pod;
mod plan;
mod reconcile;
mod request;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::{Controller, watcher};

use crate::api::compensation::Compensation;

use super::Scope;
use super::context::Context;
use super::error::Error;
use super::reconciler::{self, Failures, Reconciler};

pub use job::{LABEL_COMPENSATION, REQUEST_FILE};
pub use request::{LABEL_ID, id_label};

pub const CONTROLLER: &str = "compensation";

/// What the compensation reconciler needs besides the shared context.
pub struct CompensationContext {
    pub base: Arc<Context>,
    /// Job uids this process created, by Compensation uid, until the status records them.
    created: Mutex<HashMap<String, String>>,
    failures: Failures,
}

impl CompensationContext {
    fn remember(&self, compensation: &str, job: &str) {
        self.created_jobs()
            .insert(compensation.to_owned(), job.to_owned());
    }

    fn remembered(&self, compensation: &str) -> Option<String> {
        self.created_jobs().get(compensation).cloned()
    }

    fn forget(&self, compensation: &str) {
        self.created_jobs().remove(compensation);
    }

    fn created_jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A poisoned lock only means a panic elsewhere; the map is still usable.
        self.created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Reconciler for CompensationContext {
    type Object = Compensation;
    const NAME: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.base
    }

    fn failures(&self) -> &Failures {
        &self.failures
    }

    async fn reconcile(
        &self,
        compensation: Arc<Compensation>,
    ) -> Result<kube::runtime::controller::Action, Error> {
        reconcile::reconcile(&compensation, self).await
    }
}

pub async fn run(ctx: Arc<Context>, scope: Scope) {
    let client = ctx.client.clone();
    let context = Arc::new(CompensationContext {
        base: ctx,
        created: Mutex::default(),
        failures: Failures::default(),
    });
    Controller::new(
        scope.api::<Compensation>(&client),
        watcher::Config::default(),
    )
    // Only the Jobs this controller made carry the label: no watch on every Job.
    .owns(
        scope.api::<Job>(&client),
        watcher::Config::default().labels(LABEL_COMPENSATION),
    )
    .shutdown_on_signal()
    .run(reconciler::reconcile, reconciler::error_policy, context)
    .for_each(|_| futures::future::ready(()))
    .await;
}
