//! `Compensation` (`comp`): a new business action with a contract, approved by a second person,
//! run once by the team's worker as a Job, and audited sub-action by sub-action. Not a
//! rollback: it is checked against the current state before it does anything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::validation::{is_trimmed, no_edge_space, not_blank};

pub use crate::core::compensation_plan::SubActionState;
use crate::core::compensation_plan::{
    REPORT_HEADER_BYTES, REPORT_LIMIT, REPORT_RECORD_BYTES, REPORT_WORDS_ROOM,
};
pub use crate::core::phase::CompensationPhase;

/// A compensation: a new, approved business action that corrects the effect of an event.
// kube-derive repeats `printcolumn(type_ = ...)` attributes by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "backlog.dev",
    version = "v1alpha1",
    kind = "Compensation",
    namespaced,
    status = "CompensationStatus",
    shortname = "comp",
    category = "backlog",
    derive = "PartialEq",
    doc = "A compensation: a new business action with a contract (precondition, proposed action, evidence), approved by a second person and run once by the team's worker.",
    validation = Rule::new("self.metadata.name.size() <= 63").message("metadata.name must be at most 63 characters: the worker's Job and pods carry it as a label value, refused only after approval otherwise"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Compensation Id",
        type_ = "string",
        json_path = ".spec.compensationId"
    ),
    printcolumn(name = "Reason Code", type_ = "string", json_path = ".spec.reasonCode"),
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
#[x_kube(validation = Rule::new("!has(self.approval) || self.approval.approvedBy.lowerAscii() != self.requestedBy.lowerAscii()").message("approval.approvedBy must differ from requestedBy, also in letter case: a compensation needs a second person's approval").field_path(".approval.approvedBy"))]
#[x_kube(validation = Rule::new("self.requestedBy == oldSelf.requestedBy").message("requestedBy is immutable after creation").field_path(".requestedBy"))]
#[x_kube(validation = Rule::new(report_fits_rule()).message(kube::core::Message::Message(report_fits_message())).field_path(".proposedAction.subActions"))]
#[serde(rename_all = "camelCase")]
pub struct CompensationSpec {
    /// Unique in the namespace: a second Compensation with this id ends `Duplicate` and never
    /// runs. Immutable.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("compensationId is immutable: a different compensation is a new Compensation"))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9]([A-Za-z0-9._:/-]*[A-Za-z0-9])?$') && !self.contains('//')").message("compensationId may hold letters, digits and . _ : / -, starts and ends with a letter or digit, and has no empty segment (//): its operation ids append /<index>-<name> to it"))]
    #[x_kube(validation = Rule::new("!self.matches('(^|/)[.][.]?(/|$)')").message("compensationId must not hold a . or .. segment: its operation ids are read as paths downstream"))]
    pub compensation_id: String,
    /// The event whose effect this compensates.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = not_blank("sourceEventId", "the id of the event being compensated"))]
    #[x_kube(validation = no_edge_space("sourceEventId", "it is looked up exactly as the event store holds it"))]
    pub source_event_id: String,
    /// The business entity it acts on (an order, an account).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = not_blank("businessKey", "the business object the compensation changes, such as an order id"))]
    #[x_kube(validation = no_edge_space("businessKey", "it is looked up exactly as the business system holds it"))]
    pub business_key: String,
    pub reason_code: ReasonCode,
    /// The user asking; must be the user creating it.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = no_edge_space("requestedBy", "it is a user name, compared with the creating user and with approval.approvedBy"))]
    pub requested_by: String,
    /// A second person's approval of exactly the frozen request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<CompensationApproval>,
    /// What must still be true before anything is done: read first, and if it no longer
    /// holds, nothing is done (later legitimate progress is never overwritten).
    pub expected_current_state_and_version: ExpectedState,
    pub proposed_action: ProposedAction,
    /// Everything the action may touch, for the reviewer and the audit.
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new(format!("self.all(r, {})", is_trimmed("r"))).message("affectedResources entries must not be blank or begin or end with a space: each names a resource the action changes, and entries that differ only in spaces would pass as distinct"))]
    #[x_kube(validation = Rule::new("self.all(r, self.exists_one(t, t == r))").message("affectedResources must be distinct"))]
    pub affected_resources: Vec<String>,
    /// What a dry run showed (its output or a link to it).
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("dryRunEvidence", "what a dry run showed the action would change"))]
    pub dry_run_evidence: String,
    /// The worker's pod template: the team's compensation tool image.
    #[schemars(schema_with = "super::replay_job::pod_template_schema")]
    pub template: super::worker_template::WorkerTemplate,
}

/// The worker reports in its termination message, which the kubelet cuts at 4096 bytes: the
/// operation ids and names of a success alone must leave room for the worker's messages, or
/// work that succeeded would end `Unknown`. Counted as [`crate::core::compensation_plan::report_floor`] counts.
fn report_fits_rule() -> String {
    format!(
        "{REPORT_HEADER_BYTES} + size(self.proposedAction.subActions) * ({REPORT_RECORD_BYTES} + size(self.compensationId)) + 2 * self.proposedAction.subActions.map(s, size(s)).sum() <= {}",
        REPORT_LIMIT - REPORT_WORDS_ROOM
    )
}

fn report_fits_message() -> String {
    format!(
        "compensationId and proposedAction.subActions are too long together: the worker reports every sub-action by its name and its operation id <compensationId>/<index>-<name> in a termination message of at most {REPORT_LIMIT} bytes, {REPORT_WORDS_ROOM} of them kept for its messages, and a success would not fit (it would end Unknown). Shorten the compensationId or the sub-action names, or split the action into two Compensations"
    )
}

/// Why a compensation is needed: a controlled vocabulary, so that reports can count them.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReasonCode {
    /// An effect happened twice (a charge, a shipment).
    DuplicateEffect,
    /// An effect that should have happened did not.
    MissingEffect,
    /// An effect happened with the wrong amount or content.
    WrongAmount,
    /// A reservation or hold outlived its purpose.
    ExpiredHold,
    /// The customer asked for it.
    CustomerRequest,
    /// Anything else; the dry-run evidence says what.
    Other,
}

/// The state and version the worker must find before it acts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ExpectedState {
    /// Where the state is read (e.g. `orders/o-123`).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = not_blank("expectedCurrentStateAndVersion.resource", "the resource the precondition reads"))]
    #[x_kube(validation = no_edge_space("expectedCurrentStateAndVersion.resource", "the worker reads the resource by this name"))]
    pub resource: String,
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = not_blank("expectedCurrentStateAndVersion.state", "the worker compares the resource's state with it"))]
    #[x_kube(validation = no_edge_space("expectedCurrentStateAndVersion.state", "the worker compares the resource's state with it exactly"))]
    pub state: String,
    /// The version (revision, sequence number, ETag) the state must still have.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = not_blank("expectedCurrentStateAndVersion.version", "the worker compares the resource's version with it"))]
    #[x_kube(validation = no_edge_space("expectedCurrentStateAndVersion.version", "the worker compares the resource's version with it exactly"))]
    pub version: String,
}

/// The business action, as sub-actions the worker runs in order.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProposedAction {
    /// What it does, for people.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = not_blank("proposedAction.description", "say what the action does"))]
    pub description: String,
    /// The sub-actions, in order; each gets the stable operation id
    /// `<compensationId>/<index>-<name>`.
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 63)))]
    #[x_kube(validation = Rule::new("self.all(s, s.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$'))").message("proposedAction.subActions are lowercase names such as refund or notify-customer"))]
    #[x_kube(validation = Rule::new("self.all(s, self.exists_one(t, t == s))").message("proposedAction.subActions must be distinct"))]
    pub sub_actions: Vec<String>,
    /// Parameters of the action (amounts, references), passed to the worker in the request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) > 0 && size(self[k]) <= 4096)").message("proposedAction.parameters need non-empty names and values of at most 4096 characters: the frozen request must fit the ConfigMap it is kept in"))]
    #[x_kube(validation = Rule::new(format!("self.all(k, {})", is_trimmed("k"))).message("proposedAction.parameters names must not be blank or begin or end with a space or an invisible character: the worker looks a parameter up by its exact name, and `amount` and `amount ` would be two"))]
    pub parameters: BTreeMap<String, String>,
}

/// A second person's approval of exactly the frozen request.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::validation::require_spec_sha256)]
pub struct CompensationApproval {
    /// Must be the user setting the approval, and not requestedBy.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = no_edge_space("approval.approvedBy", "it is a user name, compared with requestedBy and with the approving user"))]
    pub approved_by: String,
    /// The sha256 of the frozen request the approver reviewed (`status.request.sha256`).
    #[schemars(length(min = 64, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("approval.requestSha256 must be the 64 lowercase hex digits of status.request.sha256, the frozen request you reviewed"))]
    pub request_sha256: String,
    /// The sha256 of the spec the approver reviewed, the worker template included
    /// (`status.specSha256`, read together with a `status.observedGeneration` equal to
    /// `metadata.generation`): an edit between the review and the approval makes the approval
    /// refused, not silently cover it.
    // Required at the API server; an approval stored before the field existed still decodes
    // (as no digest, which matches no spec: it is approved again), so one old object cannot
    // stop the operator from reading every other.
    #[serde(default)]
    #[schemars(length(min = 64, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("approval.specSha256 must be the 64 lowercase hex digits of status.specSha256, the spec you reviewed"))]
    pub spec_sha256: String,
}

/// What the operator froze, ran and recorded.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompensationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CompensationPhase>,
    /// One line: why the compensation is in this phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The frozen request: what an approval signs and what the worker reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<FrozenRequest>,
    /// sha256 of the spec of `observedGeneration` without `approval`: what an approval names
    /// in `spec.approval.specSha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_sha256: Option<String>,
    /// The approver, as recorded when the worker started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The worker's Job (named after the compensationId).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The uid of the Job the operator created: the only Job it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The precondition as the worker read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precondition: Option<PreconditionStatus>,
    /// Each sub-action's start, result or unknown state, with its operation id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub sub_actions: Vec<SubActionStatus>,
    /// The Compensation that holds this compensationId, when this one is a duplicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    /// `RequestFrozen`, `Approved`, `PreconditionHeld`, `Ready`, `Stalled`, `Synced`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The request as frozen by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FrozenRequest {
    /// The immutable ConfigMap holding it (also the claim on the compensationId).
    pub config_map: String,
    pub sha256: String,
    pub frozen_at: Time,
}

/// The precondition as the worker read it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PreconditionStatus {
    pub held: bool,
    #[serde(default)]
    pub observed: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One sub-action as recorded.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SubActionStatus {
    pub name: String,
    pub operation_id: String,
    pub state: SubActionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
