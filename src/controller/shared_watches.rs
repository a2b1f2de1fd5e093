//! The watches two controllers read, opened once per scope and term: BacklogBudgets and
//! RetryPolicies are read by both the budget and the RetryPolicy controller. A second watch
//! of a kind would make the API server send every change twice and the operator hold every
//! object twice; at thousands of budgets the budgets are most of what the operator holds.
//!
//! Each watch is driven by the controller it triggers (budgets by the budget controller,
//! policies by the policy controller); the other controller reads its cache.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use super::budget::cached::CachedBudget;
use crate::api::retry_policy::RetryPolicy;
use crate::telemetry::Metrics;

use super::listed::listed;
use super::{Scope, budget, retry_policy, slim};

type Events<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// Opens the shared watches in `scope`: the budget controller's part and the policy
/// controller's part.
pub fn open(
    client: &Client,
    scope: &Scope,
    metrics: Arc<Metrics>,
) -> (
    budget::Shared<Events<CachedBudget>>,
    retry_policy::Shared<Events<RetryPolicy>>,
) {
    let (budgets, writer) = reflector::store();
    let memory = Arc::new(budget::memory::DecisionMemory::default());
    let document_writes = Arc::new(budget::document_writes::DocumentWrites::default());
    let known = Arc::clone(&memory);
    let writing = Arc::clone(&document_writes);
    let strip_known = Arc::clone(&memory);
    let (mark_budgets_listed, budgets_listed) = listed();
    let targets = budget::targets::TargetIndex::default();
    let (mut notices, budget_notices) = retry_policy::budget_notices();
    let index = targets.clone();
    // The reflector updates the store before it yields an event, so whatever the event
    // triggers already sees the change.
    let budget_events = watcher(
        scope.api::<CachedBudget>(client),
        watcher::Config::default(),
    )
    .modify(move |budget| {
        slim::budget(budget, |namespace, name, uid| {
            strip_known.knows(namespace, name, uid)
        })
    })
    .default_backoff()
    .reflect(writer)
    .inspect(move |event| {
        if let Ok(event) = event {
            index.apply(event);
            notices.note(event);
            if let watcher::Event::Delete(deleted) = event {
                budget::reconcile::forget_deleted_budget(
                    &known,
                    &writing,
                    &metrics,
                    &deleted.metadata,
                );
            }
            if let watcher::Event::InitDone = event {
                mark_budgets_listed.mark();
            }
        }
    })
    .applied_objects()
    .boxed();
    let (policies, writer) = reflector::store();
    let policy_events = watcher(scope.api::<RetryPolicy>(client), watcher::Config::default())
        .modify(slim::bookkeeping)
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .boxed();
    (
        budget::Shared {
            budget_events,
            budgets: budgets.clone(),
            budgets_listed: budgets_listed.clone(),
            targets,
            policies: policies.clone(),
            memory,
            document_writes,
        },
        retry_policy::Shared {
            policy_events,
            policies,
            budgets,
            budgets_listed,
            budget_notices,
        },
    )
}
