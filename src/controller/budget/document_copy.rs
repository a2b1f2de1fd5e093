//! What a budget reads of its control document's ConfigMap: who owns it and the text under
//! the document key. The cache of every budget's ConfigMap holds these instead of the API
//! type: a `ConfigMap` with its metadata and a one-key data map took about 1.6 KB a budget
//! (heaptrack at 3,000 steady budgets), most of it the empty shape of fields never read. The
//! text is kept LZ4-compressed against a typical document, as the decision memory keeps
//! statuses ([`super::packed`]): every document spells the same field names and most of the
//! same values, and as text it was still about 200 bytes a budget.

use std::sync::LazyLock;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::consumer::{CONTROL_DOCUMENT_CONFIGMAP_KEY, ControlDocument};

/// A typical document, as the operator writes them: the compressor's dictionary. Only the
/// size of a packed text depends on it.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const TYPICAL: &str = r#"{
  "apiVersion": "backlog.dev/control/v1",
  "budget": {"namespace": "shop", "name": "orders"},
  "revision": 1,
  "generatedAt": "2026-03-01T12:00:00Z",
  "retryPolicy": {
    "name": "standard", "policyHash": "sha256:a354a4828b496272", "maxAttempts": 5,
    "backoff": {"base": "100ms", "cap": "10s", "jitter": "Full"},
    "classification": [{"errorCodes": ["HTTP_503"], "class": "Transient"}],
    "defaultClass": "Unknown", "retryBudget": {"maxRetryRatio": 0.1}
  },
  "eventClasses": [
    {"name": "refund", "state": "Active", "since": "2026-03-01T11:58:00Z"}
  ]
}"#;
    ControlDocument::parse_and_validate(TYPICAL)
        .and_then(|typical| typical.to_json())
        .unwrap_or_else(|_| TYPICAL.to_owned())
        .into_bytes()
});

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocumentCopy {
    owner_uids: Box<[Box<str>]>,
    /// The value under the document key, packed; `None` when the key is missing. Packing is
    /// deterministic: equal texts pack to equal bytes.
    packed_text: Option<Box<[u8]>>,
}

impl DocumentCopy {
    pub fn of(configmap: &ConfigMap) -> DocumentCopy {
        DocumentCopy {
            owner_uids: configmap
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|owner| owner.uid.as_str().into())
                .collect(),
            packed_text: configmap
                .data
                .as_ref()
                .and_then(|data| data.get(CONTROL_DOCUMENT_CONFIGMAP_KEY))
                .map(|text| {
                    lz4_flex::block::compress_prepend_size_with_dict(text.as_bytes(), &DICTIONARY)
                        .into_boxed_slice()
                }),
        }
    }

    pub fn owned_by(&self, uid: &str) -> bool {
        self.owner_uids.iter().any(|owner| &**owner == uid)
    }

    /// The text under the document key. `None` when the key is missing, and, never expected,
    /// when the packed text does not read back (the document is then rewritten whole).
    pub fn text(&self) -> Option<String> {
        let packed = self.packed_text.as_deref()?;
        let bytes =
            lz4_flex::block::decompress_size_prepended_with_dict(packed, &DICTIONARY).ok()?;
        String::from_utf8(bytes).ok()
    }

    /// Whether both hold the same text under the document key (or both none).
    pub fn same_text(&self, other: &DocumentCopy) -> bool {
        self.packed_text == other.packed_text
    }

    /// The document the text holds; `None` when there is none or it is not a valid document
    /// (it is then rewritten whole).
    pub fn document(&self) -> Option<ControlDocument> {
        ControlDocument::parse_and_validate(&self.text()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    #[test]
    fn a_copy_keeps_the_owners_and_the_document_text_only() {
        let owner = |uid: &str| OwnerReference {
            uid: uid.to_owned(),
            ..OwnerReference::default()
        };
        let configmap = ConfigMap {
            metadata: ObjectMeta {
                owner_references: Some(vec![owner("u-1"), owner("u-9")]),
                ..ObjectMeta::default()
            },
            data: Some(
                [
                    (CONTROL_DOCUMENT_CONFIGMAP_KEY.to_owned(), "{}".to_owned()),
                    ("notes".to_owned(), "added by hand".to_owned()),
                ]
                .into(),
            ),
            ..ConfigMap::default()
        };
        let copy = DocumentCopy::of(&configmap);
        assert!(copy.owned_by("u-1") && copy.owned_by("u-9") && !copy.owned_by("u-2"));
        assert_eq!(copy.text().as_deref(), Some("{}"));
        let bare = DocumentCopy::of(&ConfigMap::default());
        assert!(!bare.owned_by("u-1"));
        assert_eq!(bare.text(), None);
    }

    #[test]
    fn a_document_reads_back_as_written_and_packs_small() {
        let configmap = |text: &str| ConfigMap {
            data: Some([(CONTROL_DOCUMENT_CONFIGMAP_KEY.to_owned(), text.to_owned())].into()),
            ..ConfigMap::default()
        };
        let written = String::from_utf8(DICTIONARY.clone())
            .expect("text")
            .replace("\"orders\"", "\"payments-7\"")
            .replace("\"revision\": 1", "\"revision\": 42");
        let copy = DocumentCopy::of(&configmap(&written));
        assert_eq!(copy.text().as_deref(), Some(written.as_str()));
        assert!(copy.document().is_some(), "{written}");
        let packed = copy.packed_text.as_ref().map_or(0, |p| p.len());
        assert!(packed * 4 < written.len(), "{packed} of {}", written.len());
        // Any text reads back, however unlike a document.
        for text in ["", "{}", "naïve ✓ \u{0}", &"x".repeat(5000)] {
            assert_eq!(
                DocumentCopy::of(&configmap(text)).text().as_deref(),
                Some(text)
            );
        }
        assert!(copy.same_text(&DocumentCopy::of(&configmap(&written))));
        assert!(!copy.same_text(&DocumentCopy::of(&configmap("{}"))));
        assert!(!copy.same_text(&DocumentCopy::default()));
    }
}
