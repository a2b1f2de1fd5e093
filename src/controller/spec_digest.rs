//! The digest an approval names for the spec it covers (pure): what the approver read, so
//! that an edit between reading and approving makes the approval refused instead of covering
//! a spec nobody reviewed.

use serde::Serialize;

use crate::api::compensation::CompensationSpec;
use crate::api::replay_job::ReplayJobSpec;
use crate::core::digest::sha256_hex;

/// sha256 of the JSON of `spec`. Serializing a spec cannot fail (every map key is a string);
/// should it ever, the Debug text is as deterministic, so the digest still changes exactly
/// when the spec does.
fn digest<T: Serialize + std::fmt::Debug>(spec: &T) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_else(|_| format!("{spec:?}").into_bytes());
    sha256_hex(&bytes)
}

/// A replay's spec without `approval` and `suspend`: the two fields that may change while a
/// replay is approved, so neither setting the approval nor suspending changes what it names.
pub fn reviewed_replay_sha256(spec: &ReplayJobSpec) -> String {
    digest(&ReplayJobSpec {
        approval: None,
        suspend: false,
        ..spec.clone()
    })
}

/// A compensation's spec without `approval`: the template too, which the frozen request
/// (what the worker reads) does not hold.
pub fn reviewed_compensation_sha256(spec: &CompensationSpec) -> String {
    digest(&CompensationSpec {
        approval: None,
        ..spec.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::replay_job::{Approval, QueueRef};
    use serde_json::json;

    fn spec() -> ReplayJobSpec {
        serde_json::from_value(json!({
            "source": {"queue": "orders.dlq"},
            "scope": {"eventIds": ["e-1", "e-2"]},
            "reason": "schema fix",
            "requestedBy": "alice",
            "batches": {"size": 10, "canary": 1, "ratePerSecond": 5.0},
            "template": {"spec": {"containers": [{"name": "replay", "image": "tool:1"}]}}
        }))
        .expect("a valid spec")
    }

    #[test]
    fn approving_or_suspending_leaves_the_digest() {
        let plain = spec();
        let mut approved = plain.clone();
        approved.approval = Some(Approval {
            approved_by: "bob".into(),
            reference: Some("CAB-1".into()),
            scope_sha256: "0".repeat(64),
            spec_sha256: reviewed_replay_sha256(&plain),
        });
        approved.suspend = true;
        assert_eq!(
            reviewed_replay_sha256(&plain),
            reviewed_replay_sha256(&approved)
        );
        assert_eq!(reviewed_replay_sha256(&plain).len(), 64);
    }

    #[test]
    fn every_other_edit_changes_the_digest() {
        type Edit = fn(&mut ReplayJobSpec);
        let plain = spec();
        let edits: [(&str, Edit); 5] = [
            ("destination", |s| {
                s.destination = Some(QueueRef {
                    queue: "payments".into(),
                })
            }),
            ("reason", |s| s.reason.push('!')),
            ("pace", |s| s.batches.rate_per_second = 500.0),
            ("canary", |s| s.batches.canary = 2),
            ("image", |s| {
                s.template = serde_json::from_value(json!(
                    {"spec": {"containers": [{"name": "replay", "image": "tool:2"}]}}
                ))
                .expect("a valid template")
            }),
        ];
        for (what, edit) in edits {
            let mut edited = plain.clone();
            edit(&mut edited);
            assert_ne!(
                reviewed_replay_sha256(&plain),
                reviewed_replay_sha256(&edited),
                "{what}"
            );
        }
    }

    fn compensation() -> CompensationSpec {
        let text = include_str!("../../examples/compensation.yaml");
        let object: serde_json::Value = serde_yaml::from_str(text).expect("the example parses");
        serde_json::from_value(object["spec"].clone()).expect("a valid spec")
    }

    #[test]
    fn a_compensations_digest_covers_its_template_and_not_its_approval() {
        use crate::api::compensation::CompensationApproval;
        let plain = compensation();
        let mut approved = plain.clone();
        approved.approval = Some(CompensationApproval {
            approved_by: "bob".into(),
            request_sha256: "0".repeat(64),
            spec_sha256: reviewed_compensation_sha256(&plain),
        });
        assert_eq!(
            reviewed_compensation_sha256(&plain),
            reviewed_compensation_sha256(&approved)
        );
        // The template is not in the frozen request the worker reads: the digest is what
        // covers the image an approver saw.
        let mut other_image = plain.clone();
        other_image.template = serde_json::from_value(json!(
            {"spec": {"containers": [{"name": "worker", "image": "registry.example.com/other:1"}]}}
        ))
        .expect("a valid template");
        assert_ne!(
            reviewed_compensation_sha256(&plain),
            reviewed_compensation_sha256(&other_image)
        );
    }

    #[test]
    fn an_approval_stored_before_the_digest_existed_decodes_and_covers_nothing() {
        // Objects approved before `specSha256` existed stay readable (a list of them is read
        // in one piece), and such an approval names no spec.
        let mut replay = serde_json::to_value(spec()).expect("serializes");
        replay["approval"] = json!({"approvedBy": "bob", "scopeSha256": "0".repeat(64)});
        let replay: ReplayJobSpec =
            serde_json::from_value(replay).expect("an old approval decodes");
        let approval = replay.approval.as_ref().expect("the approval");
        assert_ne!(approval.spec_sha256, reviewed_replay_sha256(&replay));

        let mut object = serde_json::to_value(compensation()).expect("serializes");
        object["approval"] = json!({"approvedBy": "bob", "requestSha256": "0".repeat(64)});
        let compensation: CompensationSpec =
            serde_json::from_value(object).expect("an old approval decodes");
        let approval = compensation.approval.as_ref().expect("the approval");
        assert_ne!(
            approval.spec_sha256,
            reviewed_compensation_sha256(&compensation)
        );
    }
}
