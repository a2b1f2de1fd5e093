//! The BacklogBudget controller: scales a workload to meet its deadline.

mod apply;
pub mod cached;
mod capacity;
pub mod classes;
mod conflict;
pub mod control_document;
pub mod decide;
pub mod document_copy;
pub mod document_writes;
pub mod documents;
pub mod facts;
mod grouping;
pub mod inputs;
pub mod memory;
pub mod news;
pub mod packed;
pub mod packed_status;
pub mod polls;
pub mod reconcile;
pub mod replica_counts;
pub mod status;
pub mod target;
pub mod targets;
mod wakes;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Resource, ResourceExt};
use replica_counts::{DeploymentReplicas, StatefulSetReplicas};

use crate::api::retry_policy::RetryPolicy;
use cached::CachedBudget;

use super::Scope;
use super::context::Context;
use super::error::Error;
use super::listed::{Listed, listed};
use super::reconciler::{self, Failures, Reconciler};
use super::slim;

pub const CONTROLLER: &str = "backlogbudget";

/// What the budget reconciler needs besides the shared context.
pub struct BudgetContext {
    pub base: Arc<Context>,
    /// Every HorizontalPodAutoscaler in scope, for conflict detection.
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// Whether `autoscalers` has listed: a budget must not scale a target an HPA owns, so no
    /// budget is decided before (at startup and at every new term).
    pub autoscalers_listed: Listed,
    /// Every BacklogBudget in scope, for conflict detection.
    pub budgets: Store<CachedBudget>,
    /// The budgets by target, for conflict detection.
    pub targets: targets::TargetIndex,
    /// Every Deployment and StatefulSet in scope: the targets most budgets scale.
    pub workloads: target::WorkloadCaches,
    /// Every RetryPolicy in scope.
    pub policies: Store<RetryPolicy>,
    /// The control documents' ConfigMaps, per namespace that holds budgets.
    pub documents: documents::ControlDocuments,
    /// The control documents this process is writing or wrote lately.
    pub document_writes: Arc<document_writes::DocumentWrites>,
    kinds: target::Kinds,
    failures: Failures,
    /// Each budget's last decided and last written status.
    memory: Arc<memory::DecisionMemory>,
    /// When each budget polls next.
    polls: polls::Polls,
}

impl Reconciler for BudgetContext {
    type Object = CachedBudget;
    const NAME: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.base
    }

    fn failures(&self) -> &Failures {
        &self.failures
    }

    async fn reconcile(
        &self,
        budget: Arc<CachedBudget>,
    ) -> Result<kube::runtime::controller::Action, Error> {
        self.polls.started(&wakes::asker(&*budget));
        let budget = budget.budget().map_err(|source| Error::Cached {
            what: "BacklogBudget spec",
            source,
        })?;
        reconcile::reconcile(&budget, self).await
    }
}

/// Budget reconciles in flight at once, per watched scope: thousands of budgets created
/// together are worked through in a bounded crowd (bounded memory and bursts of API writes)
/// instead of all at once; the others wait on the poll clock as names ([`polls`]).
pub const RECONCILES_AT_ONCE: u16 = 64;

/// What the budget controller shares with the RetryPolicy controller: one watch per kind.
pub struct Shared<BudgetEvents> {
    /// The budget watch, reflected into `budgets` and followed by `targets`; this controller
    /// drives it.
    pub budget_events: BudgetEvents,
    pub budgets: Store<CachedBudget>,
    /// Whether `budgets` has listed, for the poll clock (which waits besides kube's runner).
    pub budgets_listed: Listed,
    pub targets: targets::TargetIndex,
    /// Kept by the RetryPolicy controller's watch.
    pub policies: Store<RetryPolicy>,
    /// The decisions' memory, which the budget watch consults to keep statuses out of its
    /// cache.
    pub memory: Arc<memory::DecisionMemory>,
    /// The control documents being written, which a budget's deletion cancels.
    pub document_writes: Arc<document_writes::DocumentWrites>,
}

/// Asks the poll clock for the budgets whose `scaleTargetRef` names `kind`/`name` in
/// `namespace`.
fn ask_for_target(
    polls: &polls::Polls,
    targets: &targets::TargetIndex,
    namespace: Option<&str>,
    kind: &str,
    name: &str,
) {
    for budget in targets.names_of(namespace, kind, name) {
        polls.ask(&budget);
    }
}

/// Asks the poll clock for the budgets that scale each workload the watch shows.
async fn ask_for_workloads<Workload>(
    changes: impl futures::Stream<Item = Result<Workload, watcher::Error>>,
    polls: &polls::Polls,
    targets: &targets::TargetIndex,
) where
    Workload: Resource<DynamicType = ()>,
{
    let kind = Workload::kind(&());
    changes
        .for_each(|workload| {
            if let Ok(workload) = workload {
                ask_for_target(
                    polls,
                    targets,
                    workload.meta().namespace.as_deref(),
                    &kind,
                    &workload.name_any(),
                );
            }
            futures::future::ready(())
        })
        .await;
}

pub async fn run<BudgetEvents>(ctx: Arc<Context>, scope: Scope, shared: Shared<BudgetEvents>)
where
    BudgetEvents: futures::Stream<Item = Result<CachedBudget, watcher::Error>> + Send + 'static,
{
    let client = ctx.client.clone();
    // Every change reaches the store, but only a change of the spec, labels or annotations
    // triggers a reconcile: our own status writes must not (the poll clock drives the
    // loop), or each write would cost another reconcile.
    let budget_changes = super::changed::only_changed(shared.budget_events);
    // One watch per kind: each feeds its cache and triggers the budgets it concerns.
    let (autoscalers, writer) = reflector::store();
    let (mark_autoscalers_listed, autoscalers_listed) = listed();
    let autoscaler_changes = watcher(
        scope.api::<HorizontalPodAutoscaler>(&client),
        watcher::Config::default(),
    )
    .modify(slim::autoscaler)
    .default_backoff()
    .reflect(writer)
    .inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            mark_autoscalers_listed.mark();
        }
    })
    .applied_objects();
    // The counts are updated before the event triggers the budgets that scale the workload.
    let (deployments, writer) = replica_counts::replica_counts();
    let deployment_changes = watcher(
        scope.api::<DeploymentReplicas>(&client),
        watcher::Config::default(),
    )
    .modify(replica_counts::slim)
    .default_backoff()
    .inspect(move |event| {
        if let Ok(event) = event {
            writer.apply(event);
        }
    })
    .applied_objects();
    let (statefulsets, writer) = replica_counts::replica_counts();
    let statefulset_changes = watcher(
        scope.api::<StatefulSetReplicas>(&client),
        watcher::Config::default(),
    )
    .modify(replica_counts::slim)
    .default_backoff()
    .inspect(move |event| {
        if let Ok(event) = event {
            writer.apply(event);
        }
    })
    .applied_objects();
    let context = Arc::new(BudgetContext {
        base: ctx,
        autoscalers,
        autoscalers_listed,
        budgets: shared.budgets.clone(),
        targets: shared.targets.clone(),
        workloads: target::WorkloadCaches::new(deployments, statefulsets),
        policies: shared.policies,
        documents: documents::ControlDocuments::new(client.clone()),
        kinds: target::Kinds::default(),
        failures: Failures::default(),
        memory: shared.memory,
        document_writes: shared.document_writes,
        polls: polls::Polls::default(),
    });
    // Every trigger asks the poll clock, which hands budgets to kube's scheduler as reconciles
    // start ([`polls`]): a start's lists of thousands of budgets and workloads stay names.
    let polls = &context.polls;
    let targets = &shared.targets;
    let budget_triggers = budget_changes.for_each(|budget| {
        if let Ok(budget) = budget {
            polls.ask(&wakes::asker(&budget));
        }
        futures::future::ready(())
    });
    let autoscaler_triggers = autoscaler_changes.for_each(|hpa| {
        if let Ok(HorizontalPodAutoscaler {
            metadata,
            spec: Some(spec),
            ..
        }) = hpa
        {
            ask_for_target(
                polls,
                targets,
                metadata.namespace.as_deref(),
                &spec.scale_target_ref.kind,
                &spec.scale_target_ref.name,
            );
        }
        futures::future::ready(())
    });
    let deployment_triggers = ask_for_workloads(deployment_changes, polls, targets);
    let statefulset_triggers = ask_for_workloads(statefulset_changes, polls, targets);
    // A renewed grouped answer wakes the budgets whose value changed.
    let wake_triggers = wakes::woken(context.base.queries.wakes()).for_each(|budget| {
        polls.ask(&budget);
        futures::future::ready(())
    });
    let no_triggers = futures::stream::empty::<Result<CachedBudget, watcher::Error>>();
    let controller = Controller::for_stream(no_triggers, shared.budgets.clone())
        .with_config(controller::Config::default().concurrency(RECONCILES_AT_ONCE))
        .reconcile_on(context.polls.due(shared.budgets, shared.budgets_listed))
        .shutdown_on_signal()
        .run(
            reconciler::reconcile,
            reconciler::error_policy,
            context.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    // Documents are written on the capacity the reconciles leave, for as long as they run.
    let write_documents =
        context
            .document_writes
            .write_handed(context.base.spare.clone(), |namespace, configmap| {
                let client = context.base.client.clone();
                async move { apply::apply_document(client, &namespace, &configmap).await }
            });
    // The trigger streams are watches, which end only with the controller's shutdown.
    tokio::select! {
        () = controller => {}
        () = write_documents => {}
        () = budget_triggers => {}
        () = autoscaler_triggers => {}
        () = deployment_triggers => {}
        () = statefulset_triggers => {}
        () = wake_triggers => {}
    }
}
