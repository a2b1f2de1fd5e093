//! The frozen request and the claim on a compensationId: one immutable ConfigMap named after the
//! id, created with a plain POST. The first Compensation to create it holds the id for good (it
//! is not owned by the Compensation, so deleting that one does not free the id); any other finds
//! it taken and is a duplicate. The result of the holder is kept beside it, in another
//! immutable ConfigMap, for the duplicates to point at.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use crate::api::compensation::{
    Compensation, CompensationPhase, CompensationStatus, ExpectedState, ReasonCode,
};
use crate::controller::apply::FIELD_MANAGER;
use crate::core::compensation_plan::{Claim, child_name, operation_id};
use crate::core::digest::sha256_hex;

/// The request's key in the ConfigMap, and the file name the worker reads.
pub const REQUEST_KEY: &str = "request.json";
/// Which Compensation holds the id (name and uid).
const HOLDER_NAME: &str = "backlog.dev/compensation";
const HOLDER_UID: &str = "backlog.dev/compensation-uid";
const SHA_ANNOTATION: &str = "backlog.dev/request-sha256";
const PHASE_KEY: &str = "phase";
const MESSAGE_KEY: &str = "message";
/// The whole status as the compensation ended: the audit record that outlives it.
const STATUS_KEY: &str = "status.json";
/// The label index of everything an id owns: `kubectl get configmaps,jobs -l` finds the claim,
/// the result and the Job of a compensationId (hashed: an id may be longer than a label value).
pub const LABEL_ID: &str = "backlog.dev/compensation-id";

/// The request as the worker reads it and the approver signs it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    compensation_id: &'a str,
    namespace: String,
    name: String,
    source_event_id: &'a str,
    business_key: &'a str,
    reason_code: ReasonCode,
    requested_by: &'a str,
    expected_current_state_and_version: &'a ExpectedState,
    proposed_action: Action<'a>,
    affected_resources: &'a [String],
    dry_run_evidence: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Action<'a> {
    description: &'a str,
    sub_actions: Vec<SubAction<'a>>,
    parameters: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SubAction<'a> {
    name: &'a str,
    operation_id: String,
}

/// The request document (pretty JSON: a reviewer reads it) and its sha256.
pub fn document(compensation: &Compensation) -> Result<(String, String), serde_json::Error> {
    let spec = &compensation.spec;
    let id = spec.compensation_id.as_str();
    let request = Request {
        compensation_id: id,
        namespace: compensation.namespace().unwrap_or_default(),
        name: compensation.name_any(),
        source_event_id: &spec.source_event_id,
        business_key: &spec.business_key,
        reason_code: spec.reason_code,
        requested_by: &spec.requested_by,
        expected_current_state_and_version: &spec.expected_current_state_and_version,
        proposed_action: Action {
            description: &spec.proposed_action.description,
            sub_actions: spec
                .proposed_action
                .sub_actions
                .iter()
                .enumerate()
                .map(|(index, name)| SubAction {
                    name,
                    operation_id: operation_id(id, index, name),
                })
                .collect(),
            parameters: &spec.proposed_action.parameters,
        },
        affected_resources: &spec.affected_resources,
        dry_run_evidence: &spec.dry_run_evidence,
    };
    let text = serde_json::to_string_pretty(&request)? + "\n";
    let sha = sha256_hex(text.as_bytes());
    Ok((text, sha))
}

/// The label value of `compensation_id` (see [`LABEL_ID`]).
pub fn id_label(compensation_id: &str) -> String {
    sha256_hex(compensation_id.as_bytes())[..20].to_owned()
}

fn immutable(
    compensation: &Compensation,
    name: String,
    annotations: BTreeMap<String, String>,
    data: BTreeMap<String, String>,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: compensation.namespace(),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                ),
                (
                    LABEL_ID.to_owned(),
                    id_label(&compensation.spec.compensation_id),
                ),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        immutable: Some(true),
        data: Some(data),
        ..ConfigMap::default()
    }
}

fn holder(compensation: &Compensation) -> BTreeMap<String, String> {
    BTreeMap::from([
        (HOLDER_NAME.to_owned(), compensation.name_any()),
        (
            HOLDER_UID.to_owned(),
            compensation.uid().unwrap_or_default(),
        ),
    ])
}

/// The claim ConfigMap holding the frozen request.
pub fn claim(compensation: &Compensation, text: String, sha: &str) -> ConfigMap {
    let mut annotations = holder(compensation);
    annotations.insert(SHA_ANNOTATION.to_owned(), sha.to_owned());
    immutable(
        compensation,
        child_name(&compensation.spec.compensation_id),
        annotations,
        BTreeMap::from([(REQUEST_KEY.to_owned(), text)]),
    )
}

/// The result the holder ended with: what duplicates point at, and the audit record of the
/// whole status (precondition, sub-actions, who approved) that outlives the Compensation.
pub fn result(
    compensation: &Compensation,
    phase: CompensationPhase,
    status: &CompensationStatus,
) -> Result<ConfigMap, serde_json::Error> {
    Ok(immutable(
        compensation,
        result_name(&compensation.spec.compensation_id),
        holder(compensation),
        BTreeMap::from([
            (PHASE_KEY.to_owned(), format!("{phase:?}")),
            (
                MESSAGE_KEY.to_owned(),
                status.message.clone().unwrap_or_default(),
            ),
            (STATUS_KEY.to_owned(), serde_json::to_string_pretty(status)?),
        ]),
    ))
}

pub fn result_name(compensation_id: &str) -> String {
    format!("{}-result", child_name(compensation_id))
}

/// Who holds the id, from the claim ConfigMap (and the result beside it).
pub fn claim_of(
    compensation: &Compensation,
    found: Option<&ConfigMap>,
    result: Option<&ConfigMap>,
) -> Claim {
    let Some(found) = found else {
        return Claim::Free;
    };
    let annotation = |key: &str| found.annotations().get(key).cloned().unwrap_or_default();
    let ours = compensation
        .uid()
        .is_some_and(|uid| annotation(HOLDER_UID) == uid)
        && found.immutable == Some(true)
        && found
            .data
            .as_ref()
            .and_then(|d| d.get(REQUEST_KEY))
            .is_some_and(|text| sha256_hex(text.as_bytes()) == annotation(SHA_ANNOTATION));
    if ours {
        return Claim::Ours {
            sha256: annotation(SHA_ANNOTATION),
        };
    }
    let name = annotation(HOLDER_NAME);
    let ended = result
        .filter(|r| r.annotations().get(HOLDER_UID) == found.annotations().get(HOLDER_UID))
        .and_then(|r| {
            let data = r.data.as_ref()?;
            let phase: CompensationPhase =
                serde_json::from_value(serde_json::Value::String(data.get(PHASE_KEY)?.clone()))
                    .ok()?;
            Some((phase, data.get(MESSAGE_KEY).cloned().unwrap_or_default()))
        });
    Claim::Theirs {
        name: if name.is_empty() {
            found.name_any()
        } else {
            name
        },
        result: ended,
    }
}

/// Creates `config_map` unless something of its name exists (then the next read says whose).
pub async fn create(api: &Api<ConfigMap>, config_map: &ConfigMap) -> Result<(), kube::Error> {
    let params = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    match api.create(&params, config_map).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A refund of two sub-actions asked for by alice, not approved.
    pub(in crate::controller::compensation) fn compensation(name: &str, uid: &str) -> Compensation {
        let mut compensation: Compensation = serde_json::from_value(serde_json::json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "Compensation",
            "metadata": {"name": name, "namespace": "shop", "uid": uid},
            "spec": {
                "compensationId": "refund-o-123",
                "sourceEventId": "evt-1",
                "businessKey": "order/o-123",
                "reasonCode": "DuplicateEffect",
                "requestedBy": "alice",
                "expectedCurrentStateAndVersion": {"resource": "payments/o-123", "state": "CAPTURED_TWICE", "version": "7"},
                "proposedAction": {"description": "refund", "subActions": ["refund", "notify"]},
                "affectedResources": ["payments/o-123"],
                "dryRunEvidence": "dry run",
                "template": {"spec": {"containers": [{"name": "worker", "image": "worker"}]}},
            }
        }))
        .expect("a Compensation");
        compensation.metadata.uid = Some(uid.to_owned());
        compensation
    }

    #[test]
    fn the_request_names_every_operation_id_and_its_digest_is_stable() {
        let (text, sha) = document(&compensation("refund", "u-1")).expect("a document");
        assert!(text.contains("refund-o-123/0-refund") && text.contains("refund-o-123/1-notify"));
        assert_eq!(sha, sha256_hex(text.as_bytes()));
        assert_eq!(
            document(&compensation("refund", "u-1")).expect("again").1,
            sha
        );
    }

    #[test]
    fn the_claim_is_whoever_created_the_config_map_first() {
        let first = compensation("refund", "u-1");
        let second = compensation("refund-again", "u-2");
        let (text, sha) = document(&first).expect("a document");
        let claimed = claim(&first, text, &sha);
        assert_eq!(claim_of(&first, None, None), Claim::Free);
        assert_eq!(
            claim_of(&first, Some(&claimed), None),
            Claim::Ours {
                sha256: sha.clone()
            }
        );
        assert_eq!(
            claim_of(&second, Some(&claimed), None),
            Claim::Theirs {
                name: "refund".into(),
                result: None
            }
        );
        let status = CompensationStatus {
            message: Some("2 sub-actions succeeded".into()),
            ..CompensationStatus::default()
        };
        let ended = result(&first, CompensationPhase::Succeeded, &status).expect("a result");
        assert!(
            ended
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(STATUS_KEY))
        );
        assert_eq!(
            claimed.labels().get(LABEL_ID),
            ended.labels().get(LABEL_ID),
            "one label finds both"
        );
        assert_eq!(
            claim_of(&second, Some(&claimed), Some(&ended)),
            Claim::Theirs {
                name: "refund".into(),
                result: Some((
                    CompensationPhase::Succeeded,
                    "2 sub-actions succeeded".into()
                ))
            }
        );
        // Edited bytes (or a mutable copy) are not the claim the first made: nobody's to run.
        let mut edited = claimed.clone();
        edited.data = Some(BTreeMap::from([(REQUEST_KEY.to_owned(), "{}".to_owned())]));
        assert!(matches!(
            claim_of(&first, Some(&edited), None),
            Claim::Theirs { .. }
        ));
        let mut mutable = claimed;
        mutable.immutable = None;
        assert!(matches!(
            claim_of(&first, Some(&mutable), None),
            Claim::Theirs { .. }
        ));
    }
}
