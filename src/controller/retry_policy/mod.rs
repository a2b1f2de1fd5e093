//! The RetryPolicy controller: normalizes each policy and publishes its hash, worst case and
//! amplification, the budgets that use it, `Ready`, and `DeadlineConflict` when a budget that
//! uses it promises less time than its retries may take.
//!
//! Budgets are read from the budget controller's watch cache (one watch of budgets per
//! process). A budget event re-evaluates the policies only when something the status depends on
//! changed (a budget appearing, leaving, or changing its `retryPolicyRef` or
//! `completionDeadline`): a budget's status write alone must not re-evaluate every policy.

pub mod decide;
mod reconcile;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};

use super::budget::cached::CachedBudget;
use crate::api::retry_policy::RetryPolicy;

use super::context::Context;
use super::error::Error;
use super::listed::Listed;
use super::reconciler::{self, Failures, Reconciler};

pub const CONTROLLER: &str = "retrypolicy";

/// What the policy reconciler needs besides the shared context.
pub struct PolicyContext {
    pub base: Arc<Context>,
    /// Every BacklogBudget in scope.
    pub budgets: Store<CachedBudget>,
    /// Whether `budgets` has listed (every reconcile waits for it).
    pub budgets_listed: Listed,
    failures: Failures,
}

impl Reconciler for PolicyContext {
    type Object = RetryPolicy;
    const NAME: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.base
    }

    fn failures(&self) -> &Failures {
        &self.failures
    }

    async fn reconcile(
        &self,
        policy: Arc<RetryPolicy>,
    ) -> Result<kube::runtime::controller::Action, Error> {
        reconcile::reconcile(&policy, self).await
    }
}

/// What a policy's status reads from a budget that names a policy: the policy and the
/// budget's `completionDeadline` (`None` if it cannot be read).
type Relevant = (String, Option<String>);

fn relevant(budget: &CachedBudget) -> Option<Relevant> {
    let policy = budget.retry_policy.as_deref()?.to_owned();
    Some((policy, budget.completion_deadline().ok()))
}

/// Whether a budget watch event can change some policy's status; keeps `seen` current. Only
/// budgets that name a policy are kept: the others are no policy's user.
fn changes_policies(
    seen: &mut HashMap<ObjectRef<CachedBudget>, Relevant>,
    event: &watcher::Event<CachedBudget>,
) -> bool {
    match event {
        watcher::Event::Apply(budget) | watcher::Event::InitApply(budget) => {
            let key = ObjectRef::from_obj(budget);
            let now = relevant(budget);
            let before = match &now {
                Some(now) => seen.insert(key, now.clone()),
                None => seen.remove(&key),
            };
            before != now
        }
        watcher::Event::Delete(budget) => seen.remove(&ObjectRef::from_obj(budget)).is_some(),
        // A relist: what was deleted while the watch was down only shows as missing.
        watcher::Event::Init => {
            seen.clear();
            false
        }
        watcher::Event::InitDone => true,
    }
}

/// Tells the policy controller that a budget changed in a way a policy's status reads, from
/// the budget watch (which the budget controller drives). Notices coalesce: many budget
/// changes before the controller looks make one re-evaluation.
pub struct BudgetNotices {
    seen: HashMap<ObjectRef<CachedBudget>, Relevant>,
    sender: tokio::sync::watch::Sender<()>,
}

/// The receiving end of [`BudgetNotices`].
pub struct BudgetNoticesReceived(tokio::sync::watch::Receiver<()>);

pub fn budget_notices() -> (BudgetNotices, BudgetNoticesReceived) {
    let (sender, receiver) = tokio::sync::watch::channel(());
    (
        BudgetNotices {
            seen: HashMap::new(),
            sender,
        },
        BudgetNoticesReceived(receiver),
    )
}

impl BudgetNotices {
    /// Follows one budget watch event, after the budget store has.
    pub fn note(&mut self, event: &watcher::Event<CachedBudget>) {
        if changes_policies(&mut self.seen, event) {
            self.sender.send_replace(());
        }
    }
}

impl BudgetNoticesReceived {
    fn into_stream(self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.0, |mut receiver| async move {
            receiver.changed().await.ok().map(|()| ((), receiver))
        })
    }
}

/// What the policy controller shares with the budget controller: one watch per kind.
pub struct Shared<PolicyEvents> {
    /// The RetryPolicy watch, reflected into `policies`; this controller drives it.
    pub policy_events: PolicyEvents,
    pub policies: Store<RetryPolicy>,
    /// Every budget in scope, kept by the budget controller's watch.
    pub budgets: Store<CachedBudget>,
    pub budgets_listed: Listed,
    pub budget_notices: BudgetNoticesReceived,
}

pub async fn run<PolicyEvents>(ctx: Arc<Context>, shared: Shared<PolicyEvents>)
where
    PolicyEvents: futures::Stream<Item = Result<RetryPolicy, watcher::Error>> + Send + 'static,
{
    let context = Arc::new(PolicyContext {
        base: ctx,
        budgets: shared.budgets,
        budgets_listed: shared.budgets_listed,
        failures: Failures::default(),
    });
    Controller::for_stream(shared.policy_events, shared.policies)
        .reconcile_all_on(shared.budget_notices.into_stream())
        .shutdown_on_signal()
        .run(reconciler::reconcile, reconciler::error_policy, context)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The budgets in `namespace` that reference the policy `name`.
fn users(budgets: &[Arc<CachedBudget>], namespace: &str, name: &str) -> Vec<status::BudgetUse> {
    budgets
        .iter()
        .filter(|budget| {
            budget.metadata.namespace.as_deref() == Some(namespace)
                && budget.retry_policy.as_deref() == Some(name)
        })
        .map(|budget| status::BudgetUse {
            name: budget.name_any(),
            // Never unreadable (the cache packed it); empty says so if it were.
            completion_deadline: budget.completion_deadline().unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backlog_budget::LocalRef;

    fn budget(namespace: &str, name: &str, policy: Option<&str>, deadline: &str) -> CachedBudget {
        let mut budget: crate::api::BacklogBudget = serde_json::from_value(serde_json::json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "BacklogBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "w"},
                "minReplicas": 1,
                "maxReplicas": 2,
                "completionDeadline": deadline,
                "metrics": {"backlog": "x"},
                "partitionCount": 2,
                "capacity": {"perReplicaRate": 1.0}
            }
        }))
        .unwrap();
        budget.spec.retry_policy_ref = policy.map(|p| LocalRef { name: p.into() });
        budget.into()
    }

    #[test]
    fn only_changes_that_matter_re_evaluate_policies() {
        let mut seen = HashMap::new();
        let orders = budget("shop", "orders", Some("standard"), "10m");
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::InitApply(orders.clone())
        ));
        assert!(changes_policies(&mut seen, &watcher::Event::InitDone));
        // A status write: nothing a policy reads.
        let mut written = orders.clone();
        written.status = Some(Default::default());
        assert!(!changes_policies(
            &mut seen,
            &watcher::Event::Apply(written)
        ));
        let shorter = budget("shop", "orders", Some("standard"), "1s");
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::Apply(shorter.clone())
        ));
        let elsewhere = budget("shop", "orders", Some("other"), "1s");
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::Apply(elsewhere.clone())
        ));
        // Naming no policy any more leaves the policy it named.
        let none = budget("shop", "orders", None, "1s");
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::Apply(none.clone())
        ));
        assert!(seen.is_empty());
        // A budget that names no policy is no policy's user, coming or going.
        let unused = budget("shop", "loose", None, "1s");
        assert!(!changes_policies(
            &mut seen,
            &watcher::Event::Apply(unused.clone())
        ));
        assert!(!changes_policies(
            &mut seen,
            &watcher::Event::Delete(unused)
        ));
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::Apply(elsewhere.clone())
        ));
        assert!(changes_policies(
            &mut seen,
            &watcher::Event::Delete(elsewhere)
        ));
        assert!(seen.is_empty());
    }

    #[test]
    fn users_are_the_referencing_budgets_of_the_namespace() {
        let budgets: Vec<Arc<CachedBudget>> = vec![
            Arc::new(budget("shop", "a", Some("standard"), "1m")),
            Arc::new(budget("shop", "b", Some("other"), "1m")),
            Arc::new(budget("other", "c", Some("standard"), "1m")),
            Arc::new(budget("shop", "d", None, "1m")),
        ];
        let found = users(&budgets, "shop", "standard");
        assert_eq!(
            found,
            [status::BudgetUse {
                name: "a".into(),
                completion_deadline: "1m".into()
            }]
        );
    }
}
