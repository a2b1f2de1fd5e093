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

use std::sync::LazyLock;

use k8s_openapi::jiff::Timestamp;

use super::packed::{Packable, Packed, dictionary_from};
use crate::api::backlog_budget::BacklogBudgetStatus;

/// A whole status as most budgets' look, as the compressor's dictionary.
const DICTIONARY_SAMPLE: &str = include_str!("packed_status_dictionary.json");

static DICTIONARY: LazyLock<Vec<u8>> =
    LazyLock::new(|| dictionary_from::<BacklogBudgetStatus>(DICTIONARY_SAMPLE));

impl Packable for BacklogBudgetStatus {
    fn dictionary() -> &'static [u8] {
        &DICTIONARY
    }
}

/// A status packed for keeping. Cloning shares it.
pub type PackedStatus = Packed<BacklogBudgetStatus>;

/// The time a decision is made at, in whole microseconds: what a `MicroTime` keeps, so the
/// times the decision writes into its status read back exactly from the packed memory (and
/// from the API server after a restart).
pub fn decision_clock() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
}

#[cfg(test)]
mod tests;
