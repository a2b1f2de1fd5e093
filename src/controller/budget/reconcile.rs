//! One BacklogBudget reconcile: read → decide → apply → status.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tracing::info;

use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetStatus, BudgetPhase};
use crate::api::conditions::{ConditionSpec, Truth};
use crate::api::readiness;
use crate::controller::apply::apply_status;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::core::budget_config::BudgetConfig;
use crate::core::metric_input::Observation;
use crate::core::scaling::{SCALING_ACTIVE, ScalingDecision, ScalingInputs, decide};

use super::{BudgetContext, classes, conflict, control_document, inputs, status, target};

/// How soon a budget whose spec cannot be used is looked at again.
const INVALID_RETRY: Duration = Duration::from_secs(30);

pub async fn reconcile(budget: &BacklogBudget, ctx: &BudgetContext) -> Result<Action, Error> {
    let name = budget.name_any();
    let namespace = budget.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "BacklogBudget",
        name: name.clone(),
    })?;
    let client = &ctx.base.client;
    let budgets: Api<BacklogBudget> = Api::namespaced(client.clone(), &namespace);
    // The decision's memory lives in status. Read it from the API server, not the watch cache:
    // our own scale write triggers a reconcile (the target is watched) before the status we
    // wrote right after it has reached the cache.
    let previous = budgets
        .get_status(&name)
        .await
        .during(|| {
            ApiCall::on::<BacklogBudget>(Verb::Get, &namespace, &name).subresource("status")
        })?
        .status
        .unwrap_or_default();
    let generation = budget.meta().generation;
    let now = Timestamp::now();

    let config = match BudgetConfig::from_spec(&(&budget.spec).into()) {
        Ok(config) => config,
        Err(problem) => {
            let condition = ConditionSpec::new(
                SCALING_ACTIVE,
                Truth::False,
                "InvalidSpec",
                problem.to_string(),
            );
            let next = status::invalid(&previous, condition, generation, now);
            write(budget, &budgets, &previous, next, ctx).await?;
            return Ok(Action::requeue(INVALID_RETRY));
        }
    };
    let poll = Duration::from_secs_f64(config.poll_interval_seconds);

    // A target the spec names wrongly is a status; a failure that may pass (`?`) is retried.
    let target_ref = &budget.spec.scale_target_ref;
    let found = match ctx.kinds.api(client, &namespace, target_ref).await? {
        Ok(api) => target::read(&api, &namespace, target_ref)
            .await?
            .map(|workload| (api, workload)),
        Err(problem) => Err(problem),
    };
    let (workload_api, workload) = match found {
        Ok(found) => found,
        Err(problem) => {
            let condition = ConditionSpec::new(
                SCALING_ACTIVE,
                Truth::False,
                "TargetUnavailable",
                problem.to_string(),
            );
            let next = status::invalid(&previous, condition, generation, now);
            write(budget, &budgets, &previous, next, ctx).await?;
            return Ok(Action::requeue(poll.max(INVALID_RETRY)));
        }
    };

    let classes = classes::evaluate(budget, &previous, &ctx.base, poll, now).await;
    let other = conflict::other_owner(budget, &ctx.autoscalers.state(), &ctx.budgets.state());
    let scaling_inputs = match other {
        Some(owner) => ScalingInputs {
            conflict: Some(owner),
            ..idle_inputs(workload)
        },
        None => {
            let address =
                inputs::prometheus_address(budget, ctx.base.default_prometheus.as_deref());
            inputs::gather(
                budget,
                &classes.statuses,
                address.as_deref(),
                &ctx.base.queries,
                workload,
                poll,
            )
            .await
        }
    };
    let decision = decide(&config, &scaling_inputs, &status::memory_of(&previous), now);

    if let Some(change) = &decision.change {
        target::scale(&workload_api, &budget.spec.scale_target_ref.name, change.to)
            .await
            .during(|| {
                ApiCall::new(
                    Verb::Apply,
                    target_ref.kind.clone(),
                    &namespace,
                    &target_ref.name,
                )
                .subresource("scale")
            })?;
        info!(budget = %name, namespace = %namespace, from = change.from, to = change.to, reason = %change.reason, "scaled");
        ctx.base
            .publish(
                budget,
                EventType::Normal,
                if change.to > change.from {
                    "ScaledUp"
                } else {
                    "ScaledDown"
                },
                &format!("ScaleTo{}", change.to),
                &format!(
                    "{} → {} replicas: {}",
                    change.from, change.to, change.reason
                ),
            )
            .await;
    }

    let next = status::after_decision(&previous, &decision, generation, now);
    let next = classes.record(next, generation, now);
    let document = control_document::prepare(&ctx.base, budget, &next, now).await;
    let next = document.record(next, generation, now);
    write(budget, &budgets, &previous, next, ctx).await?;
    document.publish(&ctx.base).await?;
    classes.announce(&ctx.base, budget).await;
    export(ctx, &namespace, &name, &decision);
    Ok(Action::requeue(poll))
}

fn idle_inputs(workload: target::Workload) -> ScalingInputs {
    ScalingInputs {
        backlog: Observation::Samples(vec![]),
        oldest_age: None,
        produce_rate: None,
        completion_rate: None,
        retry_rate: None,
        quarantine_rate: None,
        partitions: None,
        paused_class_backlogs: vec![],
        current_replicas: workload.replicas,
        ready_replicas: workload.ready,
        conflict: None,
    }
}

/// Writes the status when it says something new, with an Event when the phase changed.
async fn write(
    budget: &BacklogBudget,
    api: &Api<BacklogBudget>,
    previous: &BacklogBudgetStatus,
    mut next: BacklogBudgetStatus,
    ctx: &BudgetContext,
) -> Result<(), Error> {
    // Ready and Stalled, for GitOps tools (kstatus); transition times stay when unchanged.
    let readiness = readiness::of_budget(next.phase, next.explanation.as_deref());
    next.conditions = readiness::merged(
        &next.conditions,
        &readiness,
        next.observed_generation,
        Timestamp::now(),
    );
    if !status::differs(previous, &next) {
        return Ok(());
    }
    let name = budget.name_any();
    let namespace = budget.namespace().unwrap_or_default();
    apply_status(api, &name, &next).await.during(|| {
        ApiCall::on::<BacklogBudget>(Verb::Apply, &namespace, &name).subresource("status")
    })?;
    if previous.phase != next.phase
        && let Some(phase) = next.phase
    {
        let warning = !matches!(phase, BudgetPhase::Healthy);
        ctx.base
            .publish(
                budget,
                if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                &format!("{phase:?}"),
                "Reconcile",
                next.explanation.as_deref().unwrap_or_default(),
            )
            .await;
    }
    Ok(())
}

fn export(ctx: &BudgetContext, namespace: &str, name: &str, decision: &ScalingDecision) {
    use crate::telemetry::{BudgetLabels, PhaseLabels};
    let metrics = &ctx.base.metrics;
    for phase in [
        BudgetPhase::Healthy,
        BudgetPhase::AtRisk,
        BudgetPhase::Breaching,
        BudgetPhase::Undrainable,
        BudgetPhase::MetricsUnavailable,
        BudgetPhase::Conflict,
        BudgetPhase::Invalid,
    ] {
        metrics
            .budget_phase
            .get_or_create(&PhaseLabels {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                phase: format!("{phase:?}"),
            })
            .set(i64::from(phase == decision.phase));
    }
    let labels = BudgetLabels {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    metrics
        .desired_replicas
        .get_or_create(&labels)
        .set(i64::from(decision.desired));
    metrics
        .drain_time_seconds
        .get_or_create(&labels)
        .set(decision.drain_time_seconds.unwrap_or(f64::NAN));
}
