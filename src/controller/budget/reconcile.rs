//! One BacklogBudget reconcile, in one pass: read the decision's memory and every fact once →
//! decide (pure, [`super::decide`]) → apply the plan's steps in order → export the numbers.

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use crate::api::backlog_budget::{BacklogBudget, BudgetPhase};
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::plan::execute;
use crate::core::scaling::ScalingDecision;

use super::BudgetContext;
use super::apply::BudgetEffects;
use super::decide::{BudgetSettings, decide};
use super::facts::{BudgetFacts, gather};

/// How soon a budget reconciled before the budgets were listed is looked at again.
const BUDGETS_NOT_LISTED: std::time::Duration = std::time::Duration::from_secs(1);

pub async fn reconcile(budget: &BacklogBudget, ctx: &BudgetContext) -> Result<Action, Error> {
    let name = budget.name_any();
    let namespace = budget.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "BacklogBudget",
        name: name.clone(),
    })?;
    // Until every budget is listed, an older budget on the same target would be missed and
    // both would scale it (at startup and at every new term, the store is new).
    if ctx.budgets.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(BUDGETS_NOT_LISTED));
    }
    // Read.
    let budgets: Api<BacklogBudget> = Api::namespaced(ctx.base.client.clone(), &namespace);
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
    let settings = BudgetSettings::of(budget);
    let (facts, target_api) = match settings.poll() {
        Some(poll) => gather(budget, &namespace, poll, ctx).await?,
        // An unusable spec needs no facts: the plan only says why.
        None => (BudgetFacts::Unread, None),
    };
    // Decide.
    let plan = decide(&settings, &facts, &previous, Timestamp::now());
    // Apply.
    let effects = BudgetEffects {
        ctx: &ctx.base,
        budget,
        namespace: &namespace,
        target: &target_api,
    };
    execute(&plan.steps, &effects).await.into_result()?;
    if let Some(decision) = &plan.decision {
        export(ctx, &namespace, &name, decision);
    }
    Ok(Action::requeue(plan.requeue))
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
