//! Budgets by the target they scale, kept current from the budget watch.
//!
//! Two questions are asked of every budget often: which other budget scales my target (at
//! every poll of every budget) and which budgets scale this workload (at every Deployment or
//! StatefulSet event). Walking every budget to answer them is quadratic in the number of
//! budgets; at 10,000 budgets the walk was the operator's main cost.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, PoisonError, RwLock};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::cached::CachedBudget;
use super::wakes;

/// A budget by `namespace/name`: one allocation, shared by both maps. (An `ObjectRef` per map
/// was four strings and a hundred bytes of fields, twice per budget.)
pub type BudgetName = Arc<str>;

/// A target as budgets name it (namespace, kind and name; the API group is compared by the
/// caller, which sees the whole reference), by a keyed digest of those. Two targets sharing a
/// key only make a lookup answer a budget of the other target too, which every caller
/// tolerates: conflict detection compares the whole targets, and a workload event reconciles
/// one budget more. The key is random per process, so no one can make two targets share it.
type TargetKey = u64;

fn budget_name(budget: &CachedBudget) -> BudgetName {
    wakes::asker(budget).into()
}

struct Index {
    keys: RandomState,
    target_of: HashMap<BudgetName, TargetKey>,
    budgets_of: HashMap<TargetKey, Vec<BudgetName>>,
    /// During a relist: what the relist has shown so far; it replaces the index when done,
    /// so budgets deleted while the watch was down leave it.
    relisting: Option<HashMap<BudgetName, TargetKey>>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            keys: RandomState::new(),
            target_of: HashMap::new(),
            budgets_of: HashMap::new(),
            relisting: None,
        }
    }
}

impl Index {
    fn target_key(&self, namespace: Option<&str>, kind: &str, name: &str) -> TargetKey {
        self.keys.hash_one((namespace, kind, name))
    }

    fn target_of(&self, budget: &CachedBudget) -> TargetKey {
        self.target_key(
            budget.metadata.namespace.as_deref(),
            budget.target_kind(),
            budget.target_name(),
        )
    }

    fn insert(&mut self, budget: BudgetName, target: TargetKey) {
        if self.target_of.get(&budget) == Some(&target) {
            return;
        }
        self.remove(&budget);
        let budgets = self.budgets_of.entry(target).or_default();
        budgets.push(Arc::clone(&budget));
        // Nearly every target has one budget; a first push leaves room for four.
        budgets.shrink_to_fit();
        self.target_of.insert(budget, target);
    }

    fn remove(&mut self, budget: &str) {
        let Some(target) = self.target_of.remove(budget) else {
            return;
        };
        if let Some(budgets) = self.budgets_of.get_mut(&target) {
            budgets.retain(|b| &**b != budget);
            if budgets.is_empty() {
                self.budgets_of.remove(&target);
            }
        }
    }
}

/// Shared between the watch that keeps it and the reconciles that read it.
#[derive(Clone, Default)]
pub struct TargetIndex(Arc<RwLock<Index>>);

impl TargetIndex {
    /// Follows one watch event (after the budget store has).
    pub fn apply(&self, event: &watcher::Event<CachedBudget>) {
        let mut index = self.0.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(budget) => {
                let target = index.target_of(budget);
                index.insert(budget_name(budget), target);
            }
            watcher::Event::Delete(budget) => index.remove(&budget_name(budget)),
            watcher::Event::Init => index.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(budget) => {
                let target = index.target_of(budget);
                let relisting = index.relisting.get_or_insert_with(HashMap::new);
                relisting.insert(budget_name(budget), target);
            }
            watcher::Event::InitDone => {
                let listed = index.relisting.take().unwrap_or_default();
                index.target_of = HashMap::with_capacity(listed.len());
                index.budgets_of = HashMap::with_capacity(listed.len());
                for (budget, target) in listed {
                    index.insert(budget, target);
                }
            }
        }
    }

    /// The budgets whose `scaleTargetRef` names `kind`/`name` in `namespace` (and, rarely,
    /// budgets of a target with the same key: see [`TargetKey`]).
    pub fn budgets_of(
        &self,
        namespace: Option<&str>,
        kind: &str,
        name: &str,
    ) -> Vec<ObjectRef<CachedBudget>> {
        self.names_of(namespace, kind, name)
            .iter()
            .filter_map(|budget| wakes::budget_of(budget))
            .collect()
    }

    /// The same, as `namespace/name`.
    pub fn names_of(&self, namespace: Option<&str>, kind: &str, name: &str) -> Vec<BudgetName> {
        let index = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let target = index.target_key(namespace, kind, name);
        index.budgets_of.get(&target).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(name: &str, target: &str) -> CachedBudget {
        let spec: crate::api::BacklogBudgetSpec = serde_yaml::from_str(&format!(
            "{{scaleTargetRef: {{kind: Deployment, name: {target}}}, minReplicas: 1, maxReplicas: 2, completionDeadline: 1m, metrics: {{backlog: x}}, partitionCount: 2, capacity: {{perReplicaRate: 1}}}}"
        ))
        .unwrap();
        let mut budget = crate::api::BacklogBudget::new(name, spec);
        budget.metadata.namespace = Some("ns".into());
        budget.into()
    }

    fn names(index: &TargetIndex, target: &str) -> Vec<String> {
        let mut names: Vec<String> = index
            .budgets_of(Some("ns"), "Deployment", target)
            .into_iter()
            .map(|r| r.name)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn follows_applies_retargets_and_deletes() {
        let index = TargetIndex::default();
        index.apply(&watcher::Event::Apply(budget("a", "orders")));
        index.apply(&watcher::Event::Apply(budget("b", "orders")));
        assert_eq!(names(&index, "orders"), ["a", "b"]);
        // Answered as the references the controller queues the budgets under.
        assert!(
            index
                .budgets_of(Some("ns"), "Deployment", "orders")
                .contains(&ObjectRef::from_obj(&budget("a", "orders")))
        );
        // The same event again changes nothing.
        index.apply(&watcher::Event::Apply(budget("a", "orders")));
        assert_eq!(names(&index, "orders"), ["a", "b"]);
        index.apply(&watcher::Event::Apply(budget("b", "refunds")));
        assert_eq!(names(&index, "orders"), ["a"]);
        assert_eq!(names(&index, "refunds"), ["b"]);
        index.apply(&watcher::Event::Delete(budget("a", "orders")));
        assert!(names(&index, "orders").is_empty());
        assert!(
            index
                .budgets_of(Some("other"), "Deployment", "refunds")
                .is_empty()
        );
        assert!(
            index
                .budgets_of(Some("ns"), "StatefulSet", "refunds")
                .is_empty()
        );
    }

    #[test]
    fn a_relist_forgets_budgets_deleted_while_the_watch_was_down() {
        let index = TargetIndex::default();
        index.apply(&watcher::Event::Apply(budget("gone", "orders")));
        index.apply(&watcher::Event::Apply(budget("kept", "orders")));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(budget("kept", "orders")));
        // Until the relist is done the index answers as before.
        assert_eq!(names(&index, "orders"), ["gone", "kept"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(&index, "orders"), ["kept"]);
    }
}
