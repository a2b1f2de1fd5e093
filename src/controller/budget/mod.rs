//! The BacklogBudget controller: scales a workload to meet its deadline.

mod apply;
mod capacity;
pub mod classes;
mod conflict;
pub mod control_document;
pub mod decide;
pub mod documents;
pub mod facts;
mod grouping;
pub mod inputs;
pub mod memory;
pub mod news;
mod reconcile;
pub mod status;
pub mod target;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, Predicate, WatchStreamExt, controller, predicates, watcher};
use kube::{Resource, ResourceExt};

use crate::api::backlog_budget::BacklogBudget;
use crate::api::retry_policy::RetryPolicy;

use super::Scope;
use super::context::Context;
use super::error::Error;
use super::reconciler::{self, Failures, Reconciler};
use super::slim;

pub const CONTROLLER: &str = "backlogbudget";

/// What the budget reconciler needs besides the shared context.
pub struct BudgetContext {
    pub base: Arc<Context>,
    /// Every HorizontalPodAutoscaler in scope, for conflict detection.
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// Every BacklogBudget in scope, for conflict detection.
    pub budgets: Store<BacklogBudget>,
    /// Every Deployment and StatefulSet in scope: the targets most budgets scale.
    pub workloads: target::WorkloadCaches,
    /// Every RetryPolicy in scope.
    pub policies: Store<RetryPolicy>,
    /// The control documents' ConfigMaps, per namespace that holds budgets.
    pub documents: documents::ControlDocuments,
    kinds: target::Kinds,
    failures: Failures,
    /// Each budget's last decided and last written status.
    memory: memory::DecisionMemory,
}

impl Reconciler for BudgetContext {
    type Object = BacklogBudget;
    const NAME: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.base
    }

    fn failures(&self) -> &Failures {
        &self.failures
    }

    async fn reconcile(
        &self,
        budget: Arc<BacklogBudget>,
    ) -> Result<kube::runtime::controller::Action, Error> {
        reconcile::reconcile(&budget, self).await
    }
}

/// Budget reconciles in flight at once, per watched scope: thousands of budgets created
/// together are worked through in a bounded crowd (bounded memory and bursts of API writes)
/// instead of all at once; the others wait in the controller's queue, which costs nothing.
const RECONCILES_AT_ONCE: u16 = 64;

/// The budgets whose target is this workload.
fn budgets_for(
    store: &Store<BacklogBudget>,
    kind: &str,
    namespace: Option<String>,
    name: &str,
) -> Vec<ObjectRef<BacklogBudget>> {
    store
        .state()
        .iter()
        .filter(|b| {
            b.metadata.namespace == namespace
                && b.spec.scale_target_ref.kind == kind
                && b.spec.scale_target_ref.name == name
        })
        .map(|b| ObjectRef::from_obj(b.as_ref()))
        .collect()
}

pub async fn run(ctx: Arc<Context>, scope: Scope) {
    let client = ctx.client.clone();
    let (autoscalers, writer) = reflector::store();
    let autoscaler_feed = reflector::reflector(
        writer,
        watcher(
            scope.api::<HorizontalPodAutoscaler>(&client),
            watcher::Config::default(),
        )
        .modify(slim::autoscaler),
    )
    .default_backoff()
    .touched_objects()
    .for_each(|_| futures::future::ready(()));

    // Every change reaches the store, but only a change of the spec, labels or annotations
    // triggers a reconcile: our own status writes must not (the poll's requeue drives the
    // loop), or each write would cost another reconcile.
    let (budgets, writer) = reflector::store();
    let budget_changes = watcher(
        scope.api::<BacklogBudget>(&client),
        watcher::Config::default(),
    )
    .modify(slim::bookkeeping)
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(
        predicates::generation
            .combine(predicates::labels)
            .combine(predicates::annotations),
        Default::default(),
    );
    let controller = Controller::for_stream(budget_changes, budgets.clone())
        .with_config(controller::Config::default().concurrency(RECONCILES_AT_ONCE));
    let hpa_store = budgets.clone();
    let deployment_store = budgets.clone();
    let statefulset_store = budgets.clone();
    let autoscalers_listed = autoscalers.clone();
    // One watch per kind: each feeds its cache and triggers the budgets it concerns.
    let (deployments, writer) = reflector::store();
    let deployment_changes = watcher(scope.api::<Deployment>(&client), watcher::Config::default())
        .modify(slim::deployment)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let (statefulsets, writer) = reflector::store();
    let statefulset_changes = watcher(
        scope.api::<StatefulSet>(&client),
        watcher::Config::default(),
    )
    .modify(slim::statefulset)
    .default_backoff()
    .reflect(writer)
    .applied_objects();
    let (policies, writer) = reflector::store();
    let policy_feed = watcher(
        scope.api::<RetryPolicy>(&client),
        watcher::Config::default(),
    )
    .modify(slim::bookkeeping)
    .default_backoff()
    .reflect(writer)
    .touched_objects()
    .for_each(|_| futures::future::ready(()));
    let context = Arc::new(BudgetContext {
        base: ctx,
        autoscalers,
        budgets: budgets.clone(),
        workloads: target::WorkloadCaches {
            deployments,
            statefulsets,
        },
        policies,
        documents: documents::ControlDocuments::new(client.clone()),
        kinds: target::Kinds::default(),
        failures: Failures::default(),
        memory: memory::DecisionMemory::default(),
    });
    let controller = controller
        .watches(
            scope.api::<HorizontalPodAutoscaler>(&client),
            watcher::Config::default(),
            move |hpa: HorizontalPodAutoscaler| {
                let Some(spec) = hpa.spec.as_ref() else {
                    return Vec::new();
                };
                budgets_for(
                    &hpa_store,
                    &spec.scale_target_ref.kind,
                    hpa.namespace(),
                    &spec.scale_target_ref.name,
                )
            },
        )
        .watches_stream(deployment_changes, move |d: Deployment| {
            budgets_for(
                &deployment_store,
                &Deployment::kind(&()),
                d.namespace(),
                &d.name_any(),
            )
        })
        .watches_stream(statefulset_changes, move |s: StatefulSet| {
            budgets_for(
                &statefulset_store,
                &StatefulSet::kind(&()),
                s.namespace(),
                &s.name_any(),
            )
        })
        .shutdown_on_signal()
        .run(reconciler::reconcile, reconciler::error_policy, context)
        .for_each(|_| futures::future::ready(()));
    // A budget must not scale a target an HPA owns: no reconcile before the HPAs are listed,
    // at startup and at every new term.
    let controller = async move {
        if autoscalers_listed.wait_until_ready().await.is_ok() {
            controller.await;
        }
    };
    // The HPA and RetryPolicy feeds live exactly as long as the controller: a replica that
    // stops leading leaves no watch behind.
    tokio::select! {
        () = controller => {}
        () = autoscaler_feed => {}
        () = policy_feed => {}
    }
}
