//! `ReplayJob` (`rj`): a scoped, approved, audited replay of quarantined events.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::validation::{
    DNS_SUBDOMAIN, INVISIBLE_CHARACTER, duration_at_most, is_trimmed, no_edge_space,
    non_negative_duration, not_blank,
};

pub use crate::core::phase::ReplayPhase;

/// RFC 3339 timestamps as CEL's `timestamp()` accepts them, with months, days, hours,
/// minutes and seconds in range so `timestamp()` is not asked to convert a 13th month.
const RFC3339_PATTERN: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

/// Largest inline `scope.eventIds` list; longer lists go through `scope.eventIdsFrom`.
pub const MAX_INLINE_EVENT_IDS: usize = 5000;

/// A scoped, approved, rate-limited replay of dead-lettered events, run as Kubernetes Jobs.
// kube-derive repeats `printcolumn(type_ = ...)` attributes by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "backlog.dev",
    version = "v1alpha1",
    kind = "ReplayJob",
    namespaced,
    status = "ReplayJobStatus",
    shortname = "rj",
    category = "backlog",
    derive = "PartialEq",
    doc = "A scoped replay of quarantined events: frozen scope, four-eyes approval, a canary batch, then rate-limited batches.",
    validation = Rule::new("self.metadata.name.size() <= 45").message("metadata.name must be at most 45 characters: a Job's pods are named <Job>-<index> within the 63 characters of a DNS label, and the main stage's Job is <name>-main-<6 characters>"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS label (lowercase letters, digits and '-', no '.'): a Job's pods take their host name from the Job, which is named after the replay"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Source", type_ = "string", json_path = ".spec.source.queue"),
    printcolumn(name = "Events", type_ = "integer", json_path = ".status.scope.count"),
    printcolumn(
        name = "Batches",
        type_ = "integer",
        json_path = ".status.batchesTotal"
    ),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.batchesSucceeded"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.batchesFailed"
    ),
    printcolumn(
        name = "Requested By",
        type_ = "string",
        json_path = ".spec.requestedBy"
    ),
    printcolumn(
        name = "Approved By",
        type_ = "string",
        json_path = ".spec.approval.approvedBy"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.message",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new("!has(self.approval) || self.approval.approvedBy.lowerAscii() != self.requestedBy.lowerAscii()").message("approval.approvedBy must differ from requestedBy, also in letter case: a replay needs a second person's approval").field_path(".approval.approvedBy"))]
#[x_kube(validation = Rule::new("!has(self.destination) || self.destination.queue != self.source.queue").message("destination.queue must differ from source.queue: replaying into the queue the events are read from would loop them").field_path(".destination.queue"))]
#[x_kube(validation = Rule::new("self.requestedBy == oldSelf.requestedBy").message("requestedBy is immutable after creation").field_path(".requestedBy"))]
#[serde(rename_all = "camelCase")]
pub struct ReplayJobSpec {
    /// Where the quarantined events are read from.
    pub source: QueueRef,
    /// Where they are replayed to; default: the original topic or queue (the worker decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<QueueRef>,
    /// Which events; frozen at admission and immutable afterwards.
    #[x_kube(validation = Rule::new("self == oldSelf").message("scope is immutable after creation; create a new ReplayJob for a different scope"))]
    pub scope: ReplayScope,
    /// Why the replay is needed.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = not_blank("reason", "say why these events are replayed"))]
    pub reason: String,
    /// The user asking for the replay; must be the user creating it.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = no_edge_space("requestedBy", "it is a user name, compared with the creating user and with approval.approvedBy"))]
    pub requested_by: String,
    /// The fix that makes the replay safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_cause_fix: Option<RootCauseFix>,
    /// A second person's approval; set only by a member of the approvers group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Batching and rate limits.
    pub batches: BatchSettings,
    /// Suspends the running Job; false resumes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// PromQL checks that must hold after the canary (each must return a single sample that is
    /// not 0, e.g. `sum(duplicate_side_effects_total) == 0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub verification: Vec<VerificationCheck>,
    /// How long after the canary the verification checks wait, so the canary's effects are
    /// in the metrics (consumers handled the events, Prometheus scraped them); default 30s.
    /// A check asked sooner holds on numbers from before the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("verificationDelay"))]
    #[x_kube(validation = duration_at_most("verificationDelay", "1h", "the canary's effects show within minutes, and an approved replay waits meanwhile"))]
    pub verification_delay: Option<String>,
    /// Prometheus for the verification checks; defaults to the operator's --prometheus-url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<super::backlog_budget::PrometheusSource>,
    /// The worker's pod template: the team's replay tool image.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: super::worker_template::WorkerTemplate,
}

/// The pod template is validated by the API server when the operator creates the Job, so the
/// CRD keeps it open instead of embedding the whole PodSpec schema (half a megabyte per CRD,
/// past what client-side `kubectl apply` can annotate). What every worker needs is checked
/// here, so a template that cannot run is refused before anyone approves it rather than by the
/// Job's dry run after; and the fields a template is most often written with get their types,
/// so a YAML slip there (`value: 5`) is refused at once. A slip elsewhere is stored, and the
/// operator refuses that one object ([`super::worker_template`]).
pub(crate) fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let strings = serde_json::json!({"type": "array", "items": {"type": "string"}});
    let string_map =
        serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}});
    let quantities = serde_json::json!({
        "type": "object",
        "additionalProperties": {"x-kubernetes-int-or-string": true}
    });
    let container = serde_json::json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["name", "image"],
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "maxLength": 63,
                "x-kubernetes-validations": [{
                    "rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                    "message": "a container's name must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit"
                }]
            },
            "image": {
                "type": "string",
                "minLength": 1,
                "maxLength": 4096,
                "x-kubernetes-validations": [{
                    "rule": is_trimmed("self"),
                    "message": "a container's image must not begin or end with a space or an invisible character: the Job is accepted, but none of its pods would be, and the replay would wait for the Job's deadline"
                }]
            },
            "command": strings,
            "args": strings,
            "workingDir": {"type": "string"},
            "imagePullPolicy": {"type": "string"},
            "env": {
                "type": "array",
                "items": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "value": {"type": "string"},
                        "valueFrom": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }
            },
            "ports": {
                "type": "array",
                "items": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "required": ["containerPort"],
                    "properties": {
                        "containerPort": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
                        "hostPort": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 65535},
                        "name": {"type": "string"},
                        "protocol": {"type": "string"}
                    }
                }
            },
            "resources": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"limits": quantities, "requests": quantities}
            }
        }
    });
    schemars::json_schema!({
        "type": "object",
        "description": "A PodTemplateSpec for the replay worker; it must have at least one container, each with a distinct name and an image.",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["spec"],
        "properties": {
            "metadata": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"labels": string_map, "annotations": string_map}
            },
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "required": ["containers"],
                "x-kubernetes-validations": [{
                    "rule": "!has(self.initContainers) || self.initContainers.all(i, !self.containers.exists(c, c.name == i.name))",
                    "message": "template.spec.initContainers and containers need distinct names"
                }],
                "properties": {
                    "containers": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 64,
                        "items": container,
                        "x-kubernetes-validations": [{
                            "rule": "self.all(c, self.exists_one(d, d.name == c.name))",
                            "message": "template.spec.containers need distinct names"
                        }]
                    },
                    "initContainers": {
                        "type": "array",
                        "maxItems": 64,
                        "items": container,
                        "x-kubernetes-validations": [{
                            "rule": "self.all(c, self.exists_one(d, d.name == c.name))",
                            "message": "template.spec.initContainers need distinct names"
                        }]
                    },
                    "serviceAccountName": {"type": "string"},
                    "nodeSelector": string_map
                }
            }
        }
    })
}

/// A topic or queue.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueRef {
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("!self.matches('{INVISIBLE_CHARACTER}')")).message("queue must be a queue or topic name without whitespace or invisible characters (a no-break or zero-width space), such as orders.quarantine: workers may trim it, and a name that differs from another only in spaces passes the source/destination check"))]
    pub queue: String,
}

/// Which events a replay covers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.eventIds) && size(self.eventIds) > 0) || has(self.eventIdsFrom)").message("scope needs eventIds or eventIdsFrom: a replay replays a frozen list of event ids, and timeRange, eventType and tenant only describe it; resolve the ids (e.g. from the dead-letter store) into a ConfigMap and name it in scope.eventIdsFrom"))]
#[x_kube(validation = Rule::new("!(has(self.eventIds) && size(self.eventIds) > 0 && has(self.eventIdsFrom))").message("scope.eventIds and scope.eventIdsFrom are alternatives; give one of them"))]
pub struct ReplayScope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub event_type: Option<String>,
    /// The exact event ids to replay (at most 5000; use eventIdsFrom for more).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000), inner(length(min = 1, max = 253)))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Set)]
    // The same ids read from a ConfigMap are refused on the same classes (whitespace,
    // separators, control, format, private-use, unassigned): an id that differs from a stored
    // one only in those matches nothing, or the wrong event once a worker strips it.
    #[x_kube(validation = Rule::new(format!("self.all(id, !id.matches('{INVISIBLE_CHARACTER}'))")).message("scope.eventIds: every id must be one token without whitespace, separators or invisible characters (control, format such as a zero-width space, private-use, unassigned), exactly as the dead-letter store holds it"))]
    pub event_ids: Vec<String>,
    /// A ConfigMap key holding the ids, one per line; copied at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_ids_from: Option<ConfigMapKeyRef>,
    /// Events created in [from, to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_range: Option<TimeRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub tenant: Option<String>,
}

/// A key of a ConfigMap in the replay's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConfigMapKeyRef {
    // A name no ConfigMap can have would leave the replay waiting for one forever.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('^{DNS_SUBDOMAIN}$')")).message("scope.eventIdsFrom.name must be a ConfigMap's name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && !self.startsWith('..')").message("scope.eventIdsFrom.key must be a ConfigMap data key: letters, digits, '-', '_' and '.', neither '.' nor starting with '..'"))]
    pub key: String,
}

/// A time window, RFC 3339.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[x_kube(validation = Rule::new(format!("!(self.from.matches('{RFC3339_PATTERN}') && self.to.matches('{RFC3339_PATTERN}')) || timestamp(self.from) < timestamp(self.to)")).message("scope.timeRange.from must be before scope.timeRange.to").field_path(".from"))]
pub struct TimeRange {
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(format!("self.matches('{RFC3339_PATTERN}')")).message("scope.timeRange.from must be an RFC 3339 time such as 2026-11-28T10:00:00Z"))]
    pub from: String,
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(format!("self.matches('{RFC3339_PATTERN}')")).message("scope.timeRange.to must be an RFC 3339 time such as 2026-11-28T12:00:00Z"))]
    pub to: String,
}

/// The fix that makes a replay safe.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RootCauseFix {
    /// A change, ticket or release reference.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = not_blank("rootCauseFix.reference", "name the change, ticket or release that fixed the cause"))]
    pub reference: String,
    /// The fix is deployed and verified.
    #[serde(default)]
    pub verified: bool,
}

/// A second person's approval of exactly the frozen scope.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::validation::require_spec_sha256)]
pub struct Approval {
    /// Must be the user setting the approval, and not requestedBy.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = no_edge_space("approval.approvedBy", "it is a user name, compared with requestedBy and with the approving user"))]
    pub approved_by: String,
    /// A change or ticket reference for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reference: Option<String>,
    /// The sha256 of the frozen event id list the approver reviewed (`status.scope.sha256`):
    /// the approval covers exactly that list and nothing else.
    #[schemars(length(min = 64, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("approval.scopeSha256 must be the 64 lowercase hex digits of status.scope.sha256, the frozen list you reviewed"))]
    pub scope_sha256: String,
    /// The sha256 of the rest of the spec the approver reviewed (`status.specSha256`, read
    /// together with a `status.observedGeneration` equal to `metadata.generation`): an edit
    /// between the review and the approval makes the approval refused, not silently cover it.
    // Required at the API server; an approval stored before the field existed still decodes
    // (as no digest, which matches no spec: it is approved again), so one old object cannot
    // stop the operator from reading every other.
    #[serde(default)]
    #[schemars(length(min = 64, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("approval.specSha256 must be the 64 lowercase hex digits of status.specSha256, the spec you reviewed"))]
    pub spec_sha256: String,
}

/// How the replay is cut and paced.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.canary <= self.size").message("batches.canary must not exceed batches.size").field_path(".canary"))]
pub struct BatchSettings {
    /// Events per batch.
    #[schemars(range(min = 1, max = 100000))]
    pub size: i32,
    /// Events in the canary batch, replayed and verified before anything else.
    #[schemars(range(min = 1, max = 100000))]
    pub canary: i32,
    /// Events per second the worker may replay.
    #[x_kube(validation = Rule::new("self > 0.0").message("batches.ratePerSecond must be greater than 0"))]
    #[x_kube(validation = Rule::new("self <= 1000000.0").message("batches.ratePerSecond must be at most 1e6 events per second: a replay is paced, and a higher rate is no pace at all"))]
    pub rate_per_second: f64,
    /// Pause between batches (the worker waits this long after each batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("batches.pauseBetween"))]
    #[x_kube(validation = duration_at_most("batches.pauseBetween", "24h", "an approved replay that waits longer between batches has stalled, and its Jobs' deadlines count the pauses"))]
    pub pause_between: Option<String>,
    /// Retries per failed batch before the replay halts; default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10))]
    pub retries_per_batch: i32,
}

/// A PromQL check that must hold after the canary.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct VerificationCheck {
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = no_edge_space("verification[].name", "it names the check in the Verified condition and keys the list, where '  ' names nothing"))]
    pub name: String,
    /// PromQL returning one sample; the check holds when the value is non-zero
    /// (write comparisons with `bool`, e.g. `sum(dup_total) == bool 0`).
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("verification[].query", "a blank query is found only after the canary has replayed events"))]
    pub query: String,
}

/// Audit trail and progress.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplayJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ReplayPhase>,
    /// One line: why the replay is in this phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Stable id of this replay operation, passed to the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// The frozen scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<FrozenScope>,
    /// sha256 of the spec of `observedGeneration` without `approval` and `suspend`: what an
    /// approval names in `spec.approval.specSha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_total: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_succeeded: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_failed: Option<i32>,
    /// Each stage (canary, main): its Job and when it started and ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub stages: Vec<StageStatus>,
    /// The change or ticket the approver gave (`spec.approval.reference`), for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_reference: Option<String>,
    /// What each `spec.verification` check returned after the canary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub verification: Vec<CheckStatus>,
    /// The immutable ConfigMap (not owned by the replay, so it outlives it) holding the audit
    /// trail, written when the replay ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_config_map: Option<String>,
    /// `ScopeFrozen`, `Admitted`, `Approved`, `Waiting`, `JobAccepted`, `Verified`, `Halted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The result of one verification check, as last evaluated.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckStatus {
    pub name: String,
    /// The sample the query returned, when it returned exactly one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// `Holds`, `Fails` or `Unknown`.
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The scope as frozen at admission.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FrozenScope {
    /// The immutable ConfigMap holding the ids, one per line.
    pub config_map: String,
    /// The uid the API server gave that ConfigMap when the operator created it: a ConfigMap of
    /// the same name with another uid was put there by someone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_uid: Option<String>,
    /// Number of event ids (0 for a time-range scope).
    pub count: i32,
    /// sha256 of the frozen id list.
    pub sha256: String,
    pub frozen_at: Time,
}

/// One stage of a replay. Both stages are recorded when the canary starts, so the cut of the
/// frozen list cannot change afterwards; a stage has `startedAt` once its Job was decided on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    /// `canary` or `main`.
    pub name: String,
    pub job: String,
    /// The uid of the stage's Job, from the API server's answer to the operator's create: the
    /// only Job the stage follows. A Job of that name with another uid, or none recorded, is
    /// someone else's (the replay halts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
    pub batches: i32,
    /// The stage's first event: a 0-based line of the frozen list.
    #[serde(default)]
    pub first_event: i32,
    /// Events in the stage.
    #[serde(default)]
    pub events: i32,
    /// Events per batch (per Job index) in the stage.
    #[serde(default)]
    pub batch_size: i32,
    /// The replay-wide number of the stage's first batch (the canary is batch 0).
    #[serde(default)]
    pub first_batch: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default)]
    pub succeeded: i32,
    #[serde(default)]
    pub failed: i32,
}
