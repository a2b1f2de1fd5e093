//! The digest an approval names for the spec it covers besides the frozen list (pure).

use crate::api::replay_job::ReplayJobSpec;
use crate::core::compensation_plan::sha256_hex;

/// sha256 of `spec` without `approval` and `suspend`: the two fields that may change while a
/// replay is approved, so neither setting the approval nor suspending changes what it names.
pub fn reviewed_spec_sha256(spec: &ReplayJobSpec) -> String {
    let reviewed = ReplayJobSpec {
        approval: None,
        suspend: false,
        ..spec.clone()
    };
    // Serializing a spec cannot fail (every map key is a string); should it ever, the Debug
    // text is as deterministic, so the digest still changes exactly when the spec does.
    let bytes =
        serde_json::to_vec(&reviewed).unwrap_or_else(|_| format!("{reviewed:?}").into_bytes());
    sha256_hex(&bytes)
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
            spec_sha256: reviewed_spec_sha256(&plain),
        });
        approved.suspend = true;
        assert_eq!(
            reviewed_spec_sha256(&plain),
            reviewed_spec_sha256(&approved)
        );
        assert_eq!(reviewed_spec_sha256(&plain).len(), 64);
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
                reviewed_spec_sha256(&plain),
                reviewed_spec_sha256(&edited),
                "{what}"
            );
        }
    }
}
