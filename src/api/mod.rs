//! The public API: the custom resources of group `backlog.dev`, version `v1alpha1`.

pub mod backlog_budget;
pub mod compensation;
pub mod conditions;
pub mod definitions;
pub mod readiness;
pub mod replay_job;
pub mod retry_policy;
pub mod validation;
pub mod worker_template;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use backlog_budget::{BacklogBudget, BacklogBudgetSpec, BacklogBudgetStatus};
pub use compensation::{Compensation, CompensationSpec, CompensationStatus};
pub use replay_job::{ReplayJob, ReplayJobSpec, ReplayJobStatus};
pub use retry_policy::{RetryPolicy, RetryPolicySpec, RetryPolicyStatus};

/// API group of every resource.
pub const GROUP: &str = "backlog.dev";

/// Every CRD, in the order `crds/` and `backlog-operator crd` list them.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        BacklogBudget::crd(),
        Compensation::crd(),
        ReplayJob::crd(),
        RetryPolicy::crd(),
    ]
}

/// The file name under `crds/` for a CRD (e.g. `backlogbudgets.backlog.dev.yaml`).
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// A CRD as the YAML document written to `crds/`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(crd)
}
