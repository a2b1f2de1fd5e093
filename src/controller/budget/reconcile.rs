//! One BacklogBudget reconcile, in one pass: read the decision's memory and every fact once →
//! decide (pure, [`super::decide`]) → apply the plan's steps in order → export the numbers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetStatus, BudgetPhase};
use crate::controller::error::Error;
use crate::controller::plan::execute;
use crate::core::scaling::ScalingDecision;
use crate::telemetry::Metrics;

use super::BudgetContext;
use super::apply::BudgetEffects;
use super::decide::{BudgetSettings, BudgetStep, decide};
use super::document_writes::DocumentWrites;
use super::facts::{BudgetFacts, gather};
use super::memory::{DecisionMemory, Remembered, UidDigest};
use super::news::{Written, is_news};
use super::packed_status::{PackedStatus, decision_clock};

/// How soon a budget reconciled before the budgets and HPAs were listed is looked at again.
const BUDGETS_NOT_LISTED: std::time::Duration = std::time::Duration::from_secs(1);

pub async fn reconcile(budget: &BacklogBudget, ctx: &BudgetContext) -> Result<Action, Error> {
    let name = budget.name_any();
    let namespace = budget.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "BacklogBudget",
        name: name.clone(),
    })?;
    // Until every budget and HPA is listed, an older budget or an HPA on the same target would
    // be missed and both would scale it (at startup and at every new term, the stores are new).
    if ctx.budgets.wait_until_ready().await.is_err() || ctx.autoscalers_listed.wait().await.is_err()
    {
        return Ok(Action::requeue(BUDGETS_NOT_LISTED));
    }
    // Read. The decision's memory is this process's own (no GET per poll): our own scale
    // write triggers a reconcile (the target is watched) before the status written right
    // after it has reached the cache, and the memory already holds it.
    let uid = budget.uid();
    let remembered = ctx
        .memory
        .recall(&namespace, &name, uid.as_deref(), budget.status.as_deref());
    // A document that could not be written is not ours any more: it is decided and handed
    // again below, and the failure fails this reconcile once everything else is done.
    let document_failure = ctx
        .document_writes
        .take_failure(&namespace, &name, uid.as_deref());
    let own_document =
        ctx.document_writes
            .own_write(&namespace, &name, uid.as_deref(), Timestamp::now());
    let settings = BudgetSettings::of(budget);
    let (facts, target_api) = match settings.poll() {
        Some(poll) => gather(budget, &namespace, poll, own_document, ctx).await?,
        // An unusable spec needs no facts: the plan only says why.
        None => (BudgetFacts::Unread, None),
    };
    // Decide.
    let now = decision_clock();
    let previous = remembered.decided.unpack().unwrap_or_else(|error| {
        // Only this process packs a status; were one ever unreadable, the budget would start
        // afresh, as it does the first time this process sees it without a status.
        tracing::error!(%namespace, %name, %error, "the remembered status is unreadable");
        BacklogBudgetStatus::default()
    });
    let plan = decide(&settings, &facts, &previous, now);
    let next_written = Written::of(&plan.status);
    let (steps, writes) = only_news(plan.steps, &remembered, &plan.status, &next_written, now);
    // Apply.
    let effects = BudgetEffects {
        ctx: &ctx.base,
        budget,
        namespace: &namespace,
        target: &target_api,
        documents: &ctx.document_writes,
    };
    execute(&steps, &effects).await.into_result()?;
    let decided = PackedStatus::pack(&plan.status);
    let (written, written_at) = if writes {
        (next_written, Some(now))
    } else {
        (remembered.written, remembered.written_at)
    };
    let exported_phase = match &plan.decision {
        Some(decision) => {
            export(ctx, &namespace, &name, decision);
            Some(decision.phase)
        }
        None => remembered.exported_phase,
    };
    let remembered_now = Remembered {
        uid: UidDigest::of(uid.as_deref()),
        decided,
        written,
        written_at,
        exported_phase,
    };
    let cache_key = ObjectRef::new(&name).within(&namespace);
    if !ctx.memory.keep(&namespace, &name, remembered_now) {
        // Deleted while this reconcile ran: the watch forgot it before. Its series, just
        // exported, go again, unless a successor under its name has taken them over.
        let successor = ctx.budgets.get(&cache_key).is_some();
        ctx.document_writes
            .forget(&namespace, &name, budget.uid().as_deref());
        if !successor {
            unexport(&ctx.base.metrics, &namespace, &name, exported_phase);
        }
        return Ok(Action::await_change());
    }
    // Deleted before this reconcile recalled it: the watch forgot it first, and the recall
    // made it known again.
    let current = ctx.budgets.get(&cache_key);
    if current.is_none_or(|current| current.uid() != budget.uid()) {
        forget_deleted_budget(
            &ctx.memory,
            &ctx.document_writes,
            &ctx.base.metrics,
            &budget.metadata,
        );
    }
    forget_deleted(ctx);
    if let Some(failure) = document_failure {
        return Err(failure);
    }
    // The next poll is on the controller's own clock, not a requeue: between polls a budget
    // is then a name and a time, not an entry in kube's scheduler ([`super::polls`]).
    ctx.polls
        .schedule(&namespace, &name, jittered(plan.requeue));
    Ok(Action::await_change())
}

/// `poll` stretched by up to a tenth at random: budgets created together drift apart instead of
/// polling (and querying Prometheus) in lock-step for ever.
fn jittered(poll: std::time::Duration) -> std::time::Duration {
    use std::hash::{BuildHasher, RandomState};
    // A fresh RandomState is randomly keyed: hashing anything with it gives a random number.
    let random = RandomState::new().hash_one(std::time::SystemTime::now());
    let share = (random % 1000) as f64 / 10_000.0;
    poll.mul_f64(1.0 + share)
}

/// The plan's steps with its status write only if the status is news against what was last
/// written ([`super::news`]); a refresh that is due is written even when this poll decided
/// nothing new. Also says whether the status is written.
fn only_news(
    steps: Vec<BudgetStep>,
    remembered: &Remembered,
    next: &BacklogBudgetStatus,
    next_written: &Written,
    now: Timestamp,
) -> (Vec<BudgetStep>, bool) {
    let news = is_news(
        &remembered.written,
        remembered.written_at,
        next_written,
        now,
    );
    let mut kept: Vec<BudgetStep> = steps
        .into_iter()
        .filter(|step| news || !matches!(step, BudgetStep::WriteStatus(_)))
        .collect();
    if news
        && !kept
            .iter()
            .any(|step| matches!(step, BudgetStep::WriteStatus(_)))
    {
        kept.push(BudgetStep::WriteStatus(Box::new(next.clone())));
    }
    (kept, news)
}

/// Forgets the memory of deleted budgets once they are a fair share of it.
fn forget_deleted(ctx: &BudgetContext) {
    let listed = ctx.budgets.len();
    if ctx.memory.remembered() > listed + listed / 10 + 16 {
        let budgets = ctx.budgets.clone();
        let forgotten = ctx.memory.forget_unless(|namespace, name| {
            budgets
                .get(&ObjectRef::new(name).within(namespace))
                .is_some()
        });
        for ((namespace, name), remembered) in forgotten {
            ctx.document_writes.forget_if(&namespace, &name, |uid| {
                UidDigest::is_of(remembered.uid, uid)
            });
            unexport(
                &ctx.base.metrics,
                &namespace,
                &name,
                remembered.exported_phase,
            );
        }
    }
}

/// Forgets a budget the watch saw deleted and removes its series from `/metrics` at once, so
/// dashboards do not show it until the next sweep. The sweep above still catches deletions
/// the watch did not see (made while it was relisting).
pub fn forget_deleted_budget(
    memory: &DecisionMemory,
    documents: &DocumentWrites,
    metrics: &Metrics,
    budget: &ObjectMeta,
) {
    let (Some(namespace), Some(name)) = (budget.namespace.as_deref(), budget.name.as_deref())
    else {
        return;
    };
    let uid = budget.uid.as_deref();
    documents.forget(namespace, name, uid);
    if let Some(remembered) = memory.forget(namespace, name, uid) {
        unexport(metrics, namespace, name, remembered.exported_phase);
    }
}

/// Drops the budget's series, if this process exported any.
fn unexport(metrics: &Metrics, namespace: &str, name: &str, exported_phase: Option<BudgetPhase>) {
    if exported_phase.is_some() {
        metrics.budget_deleted(namespace, name);
    }
}

fn export(ctx: &BudgetContext, namespace: &str, name: &str, decision: &ScalingDecision) {
    ctx.base.metrics.budget_decided(
        namespace,
        name,
        &phase_label(decision.phase),
        i64::from(decision.desired),
        decision.drain_time_seconds,
    );
}

fn phase_label(phase: BudgetPhase) -> String {
    format!("{phase:?}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::jittered;

    #[test]
    fn a_deleted_budget_leaves_memory_and_metrics_at_once_but_not_its_successor() {
        use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetStatus, BudgetPhase};
        use crate::controller::budget::document_writes::DocumentWrites;
        use crate::controller::budget::memory::{DecisionMemory, Remembered};
        use crate::telemetry::Metrics;

        let (memory, metrics) = (DecisionMemory::default(), Metrics::default());
        metrics.budget_decided("shop", "orders", "AtRisk", 5, None);
        let remembered = |uid: &str| Remembered {
            exported_phase: Some(BudgetPhase::AtRisk),
            ..Remembered::from_cache(Some(uid), None::<&BacklogBudgetStatus>)
        };
        memory.recall("shop", "orders", Some("u-2"), None);
        assert!(memory.keep("shop", "orders", remembered("u-2")));
        let mut deleted: BacklogBudget =
            serde_yaml::from_str(include_str!("../../../examples/backlog-budget.yaml"))
                .expect("the example BacklogBudget");
        deleted.metadata.namespace = Some("shop".to_owned());
        deleted.metadata.name = Some("orders".to_owned());
        // The deletion of a predecessor seen late does not touch its successor.
        deleted.metadata.uid = Some("u-1".to_owned());
        super::forget_deleted_budget(
            &memory,
            &DocumentWrites::default(),
            &metrics,
            &deleted.metadata,
        );
        assert!(memory.knows("shop", "orders", Some("u-2")));
        assert!(metrics.encode().contains("name=\"orders\""));
        deleted.metadata.uid = Some("u-2".to_owned());
        super::forget_deleted_budget(
            &memory,
            &DocumentWrites::default(),
            &metrics,
            &deleted.metadata,
        );
        assert_eq!(memory.remembered(), 0);
        let text = metrics.encode();
        assert!(!text.contains("name=\"orders\""), "{text}");
    }

    #[test]
    fn requeues_stretch_the_poll_by_up_to_a_tenth_and_differ() {
        let poll = Duration::from_secs(15);
        let requeues: Vec<Duration> = (0..64).map(|_| jittered(poll)).collect();
        assert!(
            requeues
                .iter()
                .all(|r| *r >= poll && *r < poll.mul_f64(1.1))
        );
        assert!(requeues.iter().any(|r| *r != requeues[0]), "{requeues:?}");
    }
}
