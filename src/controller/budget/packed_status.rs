//! A decided status as the decision memory keeps it between polls: its JSON, LZ4-compressed
//! against a dictionary of what every budget's status spells alike (field names, condition
//! types, reasons and the wording of their messages).
//!
//! The memory holds one status per budget for as long as the operator runs. As Rust values a
//! healthy budget's status is about 3 KB: 800 bytes of fields before any string, nine
//! conditions of four strings each, the demand history (30 MB at 10,000 budgets). Packed it
//! is a few hundred bytes. A poll unpacks its own budget's status once and packs the next,
//! which costs microseconds.
//!
//! JSON keeps what the decision reads again: the status's own times are `MicroTime`s, whole
//! microseconds, and the decision's clock is read in whole microseconds
//! ([`decision_clock`]); numbers are written and read exactly (`serde_json`'s
//! `float_roundtrip`). A condition's transition time keeps whole seconds, as on the API
//! server.

use std::sync::{Arc, LazyLock};

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::BacklogBudgetStatus;

/// A whole status as most budgets' look, as the compressor's dictionary. Only the size of
/// what is packed depends on it: any status packs and unpacks whole whatever it says.
const DICTIONARY_SAMPLE: &str = include_str!("packed_status_dictionary.json");

/// The dictionary as the bytes `pack` would write for the sample, so its field order and
/// spelling are the packed ones whatever the file's layout.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    serde_json::from_str::<BacklogBudgetStatus>(DICTIONARY_SAMPLE)
        .and_then(|status| serde_json::to_vec(&status))
        .unwrap_or_else(|_| DICTIONARY_SAMPLE.as_bytes().to_vec())
});

/// A status packed for keeping. Cloning shares it.
#[derive(Clone, PartialEq)]
pub struct PackedStatus {
    /// The status's JSON, packed (an empty status is no bytes).
    bytes: Arc<[u8]>,
}

/// Why a packed status could not be read back: never expected, since only [`PackedStatus::pack`]
/// makes one; the caller starts from an empty status instead.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the packed status does not decompress: {0}")]
    Decompress(#[from] lz4_flex::block::DecompressError),
    #[error("the packed status is not a status: {0}")]
    Json(#[from] serde_json::Error),
}

impl PackedStatus {
    pub fn pack(status: &BacklogBudgetStatus) -> PackedStatus {
        let bytes: Arc<[u8]> = if *status == BacklogBudgetStatus::default() {
            Arc::new([])
        } else {
            // A status always serializes (no maps, no non-string keys); were it ever not to,
            // the memory would hold an empty one and the next poll would start afresh.
            let json = serde_json::to_vec(status).unwrap_or_default();
            lz4_flex::block::compress_prepend_size_with_dict(&json, &DICTIONARY).into()
        };
        PackedStatus { bytes }
    }

    pub fn unpack(&self) -> Result<BacklogBudgetStatus, UnpackError> {
        if self.bytes.is_empty() {
            return Ok(BacklogBudgetStatus::default());
        }
        let json = lz4_flex::block::decompress_size_prepended_with_dict(&self.bytes, &DICTIONARY)?;
        Ok(serde_json::from_slice(&json)?)
    }

    /// The bytes the packed status takes.
    #[cfg(test)]
    pub fn packed_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// The time a decision is made at, in whole microseconds: what a `MicroTime` keeps, so the
/// times the decision writes into its status read back exactly from the packed memory (and
/// from the API server after a restart).
pub fn decision_clock() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
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
