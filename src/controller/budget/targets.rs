//! Budgets by the target they scale, kept current from the budget watch.
//!
//! Two questions are asked of every budget often: which other budget scales my target (at
//! every poll of every budget) and which budgets scale this workload (at every Deployment or
//! StatefulSet event). Walking every budget to answer them is quadratic in the number of
//! budgets; at 10,000 budgets the walk was the operator's main cost.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::cached::CachedBudget;

/// A target as budgets name it: namespace, kind and name (the API group is compared by the
/// caller, which sees the whole reference).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Target {
    namespace: Option<String>,
    kind: String,
    name: String,
}

/// A budget by namespace and name only: [`ObjectRef::from_obj`] also copies the uid and
/// resourceVersion, which the index does not need (references compare without them).
fn key(budget: &CachedBudget) -> ObjectRef<CachedBudget> {
    let reference = ObjectRef::new(budget.metadata.name.as_deref().unwrap_or_default());
    match budget.metadata.namespace.as_deref() {
        Some(namespace) => reference.within(namespace),
        None => reference,
    }
}

impl Target {
    fn of(budget: &CachedBudget) -> Target {
        Target {
            namespace: budget.metadata.namespace.clone(),
            kind: budget.target.kind.clone(),
            name: budget.target.name.clone(),
        }
    }
}

#[derive(Default)]
struct Index {
    target_of: HashMap<ObjectRef<CachedBudget>, Target>,
    budgets_of: HashMap<Target, Vec<ObjectRef<CachedBudget>>>,
    /// During a relist: what the relist has shown so far; it replaces the index when done,
    /// so budgets deleted while the watch was down leave it.
    relisting: Option<HashMap<ObjectRef<CachedBudget>, Target>>,
}

impl Index {
    fn insert(&mut self, budget: ObjectRef<CachedBudget>, target: Target) {
        if self.target_of.get(&budget) == Some(&target) {
            return;
        }
        self.remove(&budget);
        let budgets = self.budgets_of.entry(target.clone()).or_default();
        budgets.push(budget.clone());
        // Nearly every target has one budget; a first push leaves room for four (about 300
        // bytes a budget at thousands of them).
        budgets.shrink_to_fit();
        self.target_of.insert(budget, target);
    }

    fn remove(&mut self, budget: &ObjectRef<CachedBudget>) {
        let Some(target) = self.target_of.remove(budget) else {
            return;
        };
        if let Some(budgets) = self.budgets_of.get_mut(&target) {
            budgets.retain(|b| b != budget);
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
                index.insert(key(budget), Target::of(budget));
            }
            watcher::Event::Delete(budget) => index.remove(&key(budget)),
            watcher::Event::Init => index.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(budget) => {
                let relisting = index.relisting.get_or_insert_with(HashMap::new);
                relisting.insert(key(budget), Target::of(budget));
            }
            watcher::Event::InitDone => {
                let listed = index.relisting.take().unwrap_or_default();
                *index = Index::default();
                for (budget, target) in listed {
                    index.insert(budget, target);
                }
            }
        }
    }

    /// The budgets whose `scaleTargetRef` names `kind`/`name` in `namespace`.
    pub fn budgets_of(
        &self,
        namespace: Option<&str>,
        kind: &str,
        name: &str,
    ) -> Vec<ObjectRef<CachedBudget>> {
        let target = Target {
            namespace: namespace.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
        };
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .budgets_of
            .get(&target)
            .cloned()
            .unwrap_or_default()
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
