//! What a budget reads of its control document's ConfigMap: who owns it and the text under
//! the document key. The cache of every budget's ConfigMap holds these instead of the API
//! type: a `ConfigMap` with its metadata and a one-key data map took about 1.6 KB a budget
//! (heaptrack at 3,000 steady budgets), most of it the empty shape of fields never read.

use k8s_openapi::api::core::v1::ConfigMap;

use crate::consumer::{CONTROL_DOCUMENT_CONFIGMAP_KEY, ControlDocument};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocumentCopy {
    owner_uids: Box<[Box<str>]>,
    /// The value under the document key; `None` when the key is missing.
    text: Option<Box<str>>,
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
            text: configmap
                .data
                .as_ref()
                .and_then(|data| data.get(CONTROL_DOCUMENT_CONFIGMAP_KEY))
                .map(|text| text.as_str().into()),
        }
    }

    pub fn owned_by(&self, uid: &str) -> bool {
        self.owner_uids.iter().any(|owner| &**owner == uid)
    }

    pub fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }

    /// The document the text holds; `None` when there is none or it is not a valid document
    /// (it is then rewritten whole).
    pub fn document(&self) -> Option<ControlDocument> {
        ControlDocument::parse_and_validate(self.text()?).ok()
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
        assert_eq!(copy.text(), Some("{}"));
        let bare = DocumentCopy::of(&ConfigMap::default());
        assert!(!bare.owned_by("u-1"));
        assert_eq!(bare.text(), None);
    }
}
