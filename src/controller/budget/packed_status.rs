//! A decided status as the decision memory keeps it between polls: its conditions as JSON,
//! LZ4-compressed against a dictionary of what every budget's conditions spell alike (types,
//! reasons and the wording of their messages); the rest as it is.
//!
//! The memory holds one status per budget for as long as the operator runs. As Rust values
//! the conditions are the largest part of it: nine in a healthy budget, of four strings each,
//! about 2 KB (20 MB at 10,000 budgets). Packed they are about 200 bytes. A poll unpacks its own
//! budget's conditions once and packs the next, which costs microseconds. Only the conditions:
//! the JSON of a `Time` keeps whole seconds, which is all a condition's transition time ever
//! holds on the API server, but the rest of the status holds the decision's own times, which
//! must stay exact from poll to poll.

use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::backlog_budget::BacklogBudgetStatus;

/// What most budgets' conditions share, as the compressor's dictionary. Only the size of what
/// is packed depends on it: any conditions pack and unpack whole whatever they say.
const DICTIONARY_SAMPLE: &str = include_str!("packed_status_dictionary.json");

/// The dictionary as the bytes `pack` would write for the sample, so its field order and
/// spelling are the packed ones whatever the file's layout.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    serde_json::from_str::<Vec<Condition>>(DICTIONARY_SAMPLE)
        .and_then(|conditions| serde_json::to_vec(&conditions))
        .unwrap_or_else(|_| DICTIONARY_SAMPLE.as_bytes().to_vec())
});

/// A status packed for keeping. Cloning shares it.
#[derive(Clone, PartialEq)]
pub struct PackedStatus {
    /// The status without its conditions.
    rest: Arc<BacklogBudgetStatus>,
    /// Its conditions, packed (an empty list is no bytes).
    conditions: Arc<[u8]>,
}

/// Why a packed status could not be read back: never expected, since only [`PackedStatus::pack`]
/// makes one; the caller starts from an empty status instead.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the packed conditions do not decompress: {0}")]
    Decompress(#[from] lz4_flex::block::DecompressError),
    #[error("the packed conditions are not conditions: {0}")]
    Json(#[from] serde_json::Error),
}

impl PackedStatus {
    pub fn pack(status: &BacklogBudgetStatus) -> PackedStatus {
        let conditions: Arc<[u8]> = if status.conditions.is_empty() {
            Arc::new([])
        } else {
            // Conditions always serialize (no maps); were they ever not to, the memory would
            // hold none and the next poll would set them again.
            let json = serde_json::to_vec(&status.conditions).unwrap_or_default();
            lz4_flex::block::compress_prepend_size_with_dict(&json, &DICTIONARY).into()
        };
        let rest = BacklogBudgetStatus {
            conditions: Vec::new(),
            ..status.clone()
        };
        PackedStatus {
            rest: Arc::new(rest),
            conditions,
        }
    }

    pub fn unpack(&self) -> Result<BacklogBudgetStatus, UnpackError> {
        let conditions = if self.conditions.is_empty() {
            Vec::new()
        } else {
            let json = lz4_flex::block::decompress_size_prepended_with_dict(
                &self.conditions,
                &DICTIONARY,
            )?;
            serde_json::from_slice(&json)?
        };
        Ok(BacklogBudgetStatus {
            conditions,
            ..(*self.rest).clone()
        })
    }

    /// The bytes the packed conditions take.
    #[cfg(test)]
    pub fn packed_condition_bytes(&self) -> usize {
        self.conditions.len()
    }
}

impl std::fmt::Debug for PackedStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.unpack() {
            Ok(status) => status.fmt(f),
            Err(error) => write!(f, "PackedStatus({error})"),
        }
    }
}

#[cfg(test)]
mod tests;
