//! A budget as the watch cache holds it: its metadata, what is read of every budget without
//! reconciling it (the target and the RetryPolicy it names), and the rest of its spec packed
//! ([`super::packed`]). The cache holds every budget for as long as the operator runs, and
//! a `BacklogBudgetSpec` as Rust values is about a kilobyte of fields and small strings
//! before any query, most of them defaults; packed, a spec is a few hundred bytes. A
//! reconcile unpacks its own budget's spec once, which costs microseconds.

use std::sync::LazyLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::Resource;
use serde::Deserialize;

use super::packed::{Packable, Packed, UnpackError};
use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetSpec, BacklogBudgetStatus};
use crate::api::conditions::StatusConditions;

/// The example budget's spec, as the compressor's dictionary: most budgets spell the same
/// field names and defaults.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    serde_yaml::from_str::<BacklogBudget>(include_str!("../../../examples/backlog-budget.yaml"))
        .ok()
        .and_then(|example| serde_json::to_vec(&example.spec).ok())
        .unwrap_or_default()
});

impl Packable for BacklogBudgetSpec {
    fn dictionary() -> &'static [u8] {
        &DICTIONARY
    }
}

/// A cached BacklogBudget. Watched and listed as a BacklogBudget, read as one by
/// [`CachedBudget::budget`].
#[derive(Resource, Clone, Debug, Deserialize)]
#[resource(inherit = "BacklogBudget")]
#[serde(from = "BacklogBudget")]
pub struct CachedBudget {
    pub metadata: ObjectMeta,
    /// `spec.scaleTargetRef` (read by the index of budgets by target at every watch event)
    /// as its apiVersion, kind and name in one text, the kind starting at `kind_at` and the
    /// name at `name_at`: one allocation, and with it the cached budget fits the allocator's
    /// next smaller size.
    target: Box<str>,
    kind_at: u32,
    name_at: u32,
    /// `spec.retryPolicyRef.name`: the RetryPolicy controller looks for its users among every
    /// budget.
    pub retry_policy: Option<Box<str>>,
    spec: Packed<BacklogBudgetSpec>,
    /// What the watch keeps of the status ([`crate::controller::slim::budget`]).
    pub status: Option<Box<BacklogBudgetStatus>>,
}

impl From<BacklogBudget> for CachedBudget {
    fn from(budget: BacklogBudget) -> Self {
        let target = &budget.spec.scale_target_ref;
        let (kind_at, name_at) = (
            target.api_version.len(),
            target.api_version.len() + target.kind.len(),
        );
        CachedBudget {
            target: [&*target.api_version, &target.kind, &target.name]
                .concat()
                .into(),
            // The API server holds each part to at most 253 bytes.
            kind_at: u32::try_from(kind_at).unwrap_or(u32::MAX),
            name_at: u32::try_from(name_at).unwrap_or(u32::MAX),
            retry_policy: budget
                .spec
                .retry_policy_ref
                .as_ref()
                .map(|r| r.name.as_str().into()),
            spec: Packed::pack(&budget.spec),
            metadata: budget.metadata,
            status: budget.status,
        }
    }
}

impl CachedBudget {
    fn target_part(&self, from: u32, to: Option<u32>) -> &str {
        let at = |offset: u32| usize::try_from(offset).unwrap_or(usize::MAX);
        let end = to.map_or(self.target.len(), at);
        self.target.get(at(from)..end).unwrap_or_default()
    }

    /// `spec.scaleTargetRef.apiVersion`.
    pub fn target_api_version(&self) -> &str {
        self.target_part(0, Some(self.kind_at))
    }

    /// `spec.scaleTargetRef.kind`.
    pub fn target_kind(&self) -> &str {
        self.target_part(self.kind_at, Some(self.name_at))
    }

    /// `spec.scaleTargetRef.name`.
    pub fn target_name(&self) -> &str {
        self.target_part(self.name_at, None)
    }

    /// The budget as the API server sent it (less what the watch leaves out of the cache).
    pub fn budget(&self) -> Result<BacklogBudget, UnpackError> {
        Ok(BacklogBudget {
            metadata: self.metadata.clone(),
            spec: self.spec.unpack()?,
            status: self.status.clone(),
        })
    }

    /// The spec's `completionDeadline`, as written.
    pub fn completion_deadline(&self) -> Result<String, UnpackError> {
        Ok(self.spec.unpack()?.completion_deadline)
    }
}

impl StatusConditions for CachedBudget {
    fn status_conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map_or(&[], |status| status.conditions.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backlog_budget::ScaleTargetRef;

    fn example() -> BacklogBudget {
        let mut budget: BacklogBudget =
            serde_yaml::from_str(include_str!("../../../examples/backlog-budget.yaml"))
                .expect("the example BacklogBudget");
        budget.metadata.namespace = Some("shop".to_owned());
        budget
    }

    #[test]
    fn a_cached_budget_reads_back_as_the_budget() {
        let budget = example();
        let json = serde_json::to_value(&budget).expect("serializes");
        let cached: CachedBudget = serde_json::from_value(json).expect("reads as cached");
        assert_eq!(cached.budget().expect("unpacks"), budget);
        let target = &budget.spec.scale_target_ref;
        assert_eq!(
            (
                cached.target_api_version(),
                cached.target_kind(),
                cached.target_name()
            ),
            (
                target.api_version.as_str(),
                target.kind.as_str(),
                target.name.as_str()
            )
        );
        assert_eq!(
            cached.retry_policy.as_deref(),
            budget
                .spec
                .retry_policy_ref
                .as_ref()
                .map(|r| r.name.as_str())
        );
        // One size class below a whole `ObjectMeta` and a spec's fields in jemalloc's classes.
        assert!(std::mem::size_of::<CachedBudget>() + 16 <= 448);
        assert_eq!(
            cached.completion_deadline().expect("unpacks"),
            budget.spec.completion_deadline
        );
        // Watched, listed and written as what it is.
        assert_eq!(CachedBudget::kind(&()), "BacklogBudget");
        assert_eq!(CachedBudget::api_version(&()), "backlog.dev/v1alpha1");
        assert_eq!(CachedBudget::plural(&()), "backlogbudgets");
    }

    #[test]
    fn any_target_reads_back_in_its_parts() {
        for (api_version, kind, name) in [
            ("apps/v1", "Deployment", "orders"),
            ("", "", ""),
            ("v1", "Kind\nwith a line", "naïve-✓"),
            ("argoproj.io/v1alpha1", "Rollout", "a"),
        ] {
            let mut budget = example();
            budget.spec.scale_target_ref = ScaleTargetRef {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
            };
            let cached = CachedBudget::from(budget);
            assert_eq!(
                (
                    cached.target_api_version(),
                    cached.target_kind(),
                    cached.target_name()
                ),
                (api_version, kind, name)
            );
        }
    }

    #[test]
    fn a_spec_unlike_the_example_reads_back_whole() {
        let mut budget = example();
        budget.spec.metrics.backlog = "sum(lag{group=\"ünïcode ✓\"})".to_owned();
        budget.spec.metrics.group_by = Some("group".to_owned());
        budget.spec.event_classes.clear();
        budget.spec.partition_count = Some(7);
        budget.spec.metrics.partitions = None;
        budget.spec.capacity = None;
        let cached = CachedBudget::from(budget.clone());
        assert_eq!(cached.budget().expect("unpacks"), budget);
    }

    #[test]
    fn a_packed_spec_is_a_small_share_of_its_text() {
        assert!(!DICTIONARY.is_empty(), "the example parses as a budget");
        // Another workload than the example's, with its own queries and numbers.
        let spec: BacklogBudgetSpec = serde_json::from_value(serde_json::json!({
            "scaleTargetRef": {"kind": "Deployment", "name": "payments-settlement"},
            "minReplicas": 2, "maxReplicas": 48, "completionDeadline": "20m",
            "partitionCount": 48, "pollInterval": "30s",
            "metrics": {
                "backlog": "sum(kafka_consumergroup_lag{consumergroup=\"payments-settlement\"})",
                "oldestUnfinishedAge": "max(oldest_unfinished_age_seconds{group=\"payments-settlement\"})",
                "produceRate": "sum(rate(kafka_topic_partition_current_offset{topic=\"payments\"}[2m]))",
                "groupBy": "consumergroup",
            },
            "capacity": {"perReplicaRate": 120},
        }))
        .expect("a spec");
        let json = serde_json::to_vec(&spec).expect("serializes");
        let packed = Packed::pack(&spec).packed_bytes();
        assert!(packed * 2 < json.len(), "{packed} of {} bytes", json.len());
        let without_dictionary = lz4_flex::block::compress_prepend_size(&json).len();
        assert!(
            packed < without_dictionary,
            "{packed} against {without_dictionary}"
        );
    }
}
