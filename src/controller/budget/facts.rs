//! Gathering: everything one budget decision reads, read once into [`BudgetFacts`] — the
//! target's replicas, another owner of the target, the queries' results, the RetryPolicy the
//! spec names and the control document's ConfigMap. Targets (Deployments, StatefulSets),
//! RetryPolicies and control documents come from watch caches (the ConfigMaps from one watch
//! per namespace, [`super::documents`]); a GET answers what a cache does not hold yet.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::api::backlog_budget::BacklogBudget;
use crate::api::retry_policy::RetryPolicy;
use crate::controller::error::Error;

use super::classes::ClassObservations;
use super::control_document::{ConfigMapFact, PolicyFact, configmap_name, resolve_policy};
use super::document_copy::DocumentCopy;
use super::documents::Cached;
use super::grouping::{GroupingReport, Groupings};
use super::inputs::{MetricObservations, observe_classes, observe_metrics, prometheus_address};
use super::target::{TargetProblem, Workload, read};
use super::{BudgetContext, conflict};

/// What one decision reads about a budget whose target is usable.
#[derive(Debug)]
pub struct Observed {
    pub workload: Workload,
    pub scaling: ScalingFacts,
    /// Each class's queries, in spec order.
    pub classes: Vec<ClassObservations>,
    pub policy: PolicyFact,
    pub configmap: ConfigMapFact,
    /// What `metrics.groupBy` made of the queries; `None` without it.
    pub grouping: Option<GroupingReport>,
}

/// Who scales the target, and what the scaling queries returned.
#[derive(Debug)]
pub enum ScalingFacts {
    /// Another autoscaler owns the target (named); nothing was asked.
    OwnedElsewhere(String),
    /// The budget owns it; the queries' results.
    Observed(Box<MetricObservations>),
}

/// Everything one decision reads.
#[derive(Debug)]
pub enum BudgetFacts {
    /// Nothing was read: the spec is unusable, and that is all the decision needs.
    Unread,
    /// The target cannot be used; nothing else was read.
    TargetUnusable(TargetProblem),
    Observed(Box<Observed>),
}

/// The target's API, for the plan's scale step.
pub type TargetApi = Option<Api<DynamicObject>>;

/// Reads everything a decision about `budget` needs. `Err` is a failure worth retrying (the
/// status is left as it is); a target the spec names wrongly is a fact.
pub async fn gather(
    budget: &BacklogBudget,
    namespace: &str,
    poll: Duration,
    own_document: Option<Arc<ConfigMap>>,
    ctx: &BudgetContext,
) -> Result<(BudgetFacts, TargetApi), Error> {
    let client = &ctx.base.client;
    let target = &budget.spec.scale_target_ref;
    let api = match ctx.kinds.api(client, namespace, target).await? {
        Ok(api) => api,
        Err(problem) => return Ok((BudgetFacts::TargetUnusable(problem), None)),
    };
    ctx.workloads.wait_listed(target).await;
    let workload = match ctx.workloads.workload(namespace, target) {
        Some(workload) => workload,
        None => match read(&api, namespace, target).await? {
            Ok(workload) => workload,
            Err(problem) => return Ok((BudgetFacts::TargetUnusable(problem), Some(api))),
        },
    };
    let same_target: Vec<_> = ctx
        .targets
        .budgets_of(
            budget.metadata.namespace.as_deref(),
            &target.kind,
            &target.name,
        )
        .iter()
        .filter_map(|other| ctx.budgets.get(other))
        .collect();
    let conflict = conflict::other_owner(budget, &ctx.autoscalers.state(), &same_target);
    let address = prometheus_address(budget, ctx.base.default_prometheus.as_deref());
    let queries = &ctx.base.queries;
    let groupings = Groupings::of(budget, queries);
    let scaling = async {
        match conflict {
            Some(owner) => ScalingFacts::OwnedElsewhere(owner),
            None => ScalingFacts::Observed(Box::new(
                observe_metrics(budget, address.as_deref(), queries, &groupings, poll).await,
            )),
        }
    };
    let (scaling, classes, policy, configmap) = tokio::join!(
        scaling,
        observe_classes(budget, address.as_deref(), queries, &groupings, poll),
        read_policy(budget, namespace, ctx),
        read_configmap(budget, namespace, own_document, ctx),
    );
    let observed = Observed {
        workload,
        scaling,
        classes,
        policy,
        configmap,
        grouping: groupings.report(budget, queries),
    };
    Ok((BudgetFacts::Observed(Box::new(observed)), Some(api)))
}

/// The RetryPolicy `spec.retryPolicyRef` names, resolved.
async fn read_policy(budget: &BacklogBudget, namespace: &str, ctx: &BudgetContext) -> PolicyFact {
    let reference = budget
        .spec
        .retry_policy_ref
        .as_ref()
        .map(|r| r.name.as_str());
    let policy = match reference {
        None => None,
        // The watch cache first; a policy it does not hold (yet) is asked for.
        Some(name) => match ctx.policies.get(&ObjectRef::new(name).within(namespace)) {
            Some(cached) => Some(RetryPolicy::clone(&cached)),
            None => {
                Api::<RetryPolicy>::namespaced(ctx.base.client.clone(), namespace)
                    .get_opt(name)
                    .await?
            }
        },
    };
    Ok(resolve_policy(reference, policy.as_ref(), namespace))
}

/// The control document's ConfigMap: from the namespace's watch once it has listed, otherwise
/// asked for; either way as this process is writing it or just wrote it, while the answer does
/// not show that yet.
async fn read_configmap(
    budget: &BacklogBudget,
    namespace: &str,
    own_document: Option<Arc<ConfigMap>>,
    ctx: &BudgetContext,
) -> ConfigMapFact {
    let name = configmap_name(&budget.name_any());
    if let Cached::Known(found) = ctx.documents.get(namespace, &name).await {
        let found = own_write_over_lag(found, own_document.as_deref());
        return ConfigMapFact::of(found.as_deref(), budget.uid().as_deref());
    }
    let api: Api<ConfigMap> = Api::namespaced(ctx.base.client.clone(), namespace);
    match api.get_opt(&name).await {
        // A document still waiting to be written is what the ConfigMap is about to hold.
        Ok(found) => {
            let found = found.map(|configmap| Arc::new(DocumentCopy::of(&configmap)));
            let found = own_write_over_lag(found, own_document.as_deref());
            ConfigMapFact::of(found.as_deref(), budget.uid().as_deref())
        }
        Err(error) => ConfigMapFact::Unreadable(error),
    }
}

/// What the watch shows of the ConfigMap, or what this process is writing there or just wrote
/// ([`super::document_writes`]) when the watch does not show that yet (pure).
fn own_write_over_lag(
    found: Option<Arc<DocumentCopy>>,
    own_document: Option<&ConfigMap>,
) -> Option<Arc<DocumentCopy>> {
    let Some(own) = own_document.map(DocumentCopy::of) else {
        return found;
    };
    let shows_it = found.as_ref().is_some_and(|copy| copy.same_text(&own));
    if shows_it { found } else { Some(Arc::new(own)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::CONTROL_DOCUMENT_CONFIGMAP_KEY;

    fn configmap(document: &str) -> ConfigMap {
        ConfigMap {
            data: Some(
                [(
                    CONTROL_DOCUMENT_CONFIGMAP_KEY.to_owned(),
                    document.to_owned(),
                )]
                .into(),
            ),
            ..ConfigMap::default()
        }
    }

    fn copy(document: &str) -> Option<Arc<DocumentCopy>> {
        Some(Arc::new(DocumentCopy::of(&configmap(document))))
    }

    #[test]
    fn our_own_write_counts_until_the_watch_shows_it() {
        let rev_2 = configmap("rev 2");
        // The watch has not delivered the write: absent or the old revision.
        assert_eq!(own_write_over_lag(None, Some(&rev_2)), copy("rev 2"));
        assert_eq!(
            own_write_over_lag(copy("rev 1"), Some(&rev_2)),
            copy("rev 2")
        );
        // It has.
        assert_eq!(
            own_write_over_lag(copy("rev 2"), Some(&rev_2)),
            copy("rev 2")
        );
        // No write of ours counts (none, or past its grace): the watch is right, also when the
        // ConfigMap was deleted or edited by someone else.
        assert_eq!(own_write_over_lag(None, None), None);
        assert_eq!(own_write_over_lag(copy("edited"), None), copy("edited"));
    }
}
