//! Freezing a replay's scope (pure): the event ids as one exact, hashed list.
//!
//! A replay replays a list of event ids fixed when it was first seen, not whatever a filter
//! matches at run time: dead letters keep arriving, and a replay must cover exactly what was
//! approved. The list is stored one id per line; its SHA-256 (of exactly those bytes) goes
//! into the status so anyone can check the ConfigMap against it.

use crate::digest::sha256_hex;
use thiserror::Error;

/// Longest event id, as for the inline `scope.eventIds`.
pub const MAX_ID_LENGTH: usize = 253;

/// Largest frozen list in bytes: a ConfigMap holds at most 1 MiB, keys and metadata included.
pub const MAX_FROZEN_BYTES: usize = 1_000_000;

/// A frozen id list: the ids in order and the text stored in the ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenIds {
    ids: Vec<String>,
    text: String,
    sha256: String,
}

impl FrozenIds {
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// One id per line, each line ending in `\n`: what the worker reads.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Lowercase hex SHA-256 of [`text`](Self::text).
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn count(&self) -> usize {
        self.ids.len()
    }
}

/// Why a scope cannot be frozen; each message names the field and the fix.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ScopeProblem {
    #[error(
        "spec.scope lists no event ids: a replay replays a frozen list of ids, and scope.timeRange, eventType and tenant only describe it. Resolve the ids (e.g. from the dead-letter store) into a ConfigMap and create a new ReplayJob with scope.eventIdsFrom"
    )]
    NoEventIds,
    #[error(
        "{source_name} holds no event ids: put the ids in it, one per line (the scope is frozen when it first holds some)"
    )]
    Empty { source_name: String },
    #[error(
        "{source_name} line {line}: event id {id:?} is listed twice (first on line {first_line}); a replay must not replay an event twice: remove the duplicate"
    )]
    Duplicate {
        source_name: String,
        id: String,
        first_line: usize,
        line: usize,
    },
    #[error(
        "{source_name} line {line}: the event id is {length} characters long; ids are at most {MAX_ID_LENGTH}"
    )]
    TooLong {
        source_name: String,
        line: usize,
        length: usize,
    },
    #[error(
        "{source_name} line {line}: event id {id:?} contains whitespace, a separator or an invisible (format, control, private-use or unassigned) character; put one id per line, as the source names it"
    )]
    Malformed {
        source_name: String,
        line: usize,
        id: String,
    },
    #[error(
        "{source_name}: the frozen list would be {bytes} bytes, more than a ConfigMap holds ({MAX_FROZEN_BYTES}); split the replay into several ReplayJobs"
    )]
    TooLarge { source_name: String, bytes: usize },
}

/// Reads ids one per line; blank lines and surrounding whitespace are ignored.
/// `source_name` names where the text came from in messages (e.g. the ConfigMap key).
pub fn parse_id_lines(text: &str, source_name: &str) -> Result<Vec<String>, ScopeProblem> {
    let mut ids = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let id = line.trim();
        if id.is_empty() {
            continue;
        }
        if id.chars().any(unfit_for_an_id) {
            return Err(ScopeProblem::Malformed {
                source_name: source_name.to_owned(),
                line: number + 1,
                id: id.to_owned(),
            });
        }
        if id.len() > MAX_ID_LENGTH {
            return Err(ScopeProblem::TooLong {
                source_name: source_name.to_owned(),
                line: number + 1,
                length: id.len(),
            });
        }
        ids.push((number + 1, id.to_owned()));
    }
    check_unique(&ids, source_name)?;
    Ok(ids.into_iter().map(|(_, id)| id).collect())
}

/// Whitespace, separators (Z) and other (C: control, format, private use, surrogate,
/// unassigned) characters, the classes the CRD refuses in inline ids: a zero-width space
/// makes a second id of the same event, a right-to-left override shows the approver
/// another id than the one replayed, and a byte-order mark matches nothing.
fn unfit_for_an_id(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    c.is_whitespace()
        || matches!(
            get_general_category(c),
            G::SpaceSeparator
                | G::LineSeparator
                | G::ParagraphSeparator
                | G::Control
                | G::Format
                | G::PrivateUse
                | G::Surrogate
                | G::Unassigned
        )
}

/// Ids given as a list (`scope.eventIds`): line numbers in messages are list positions + 1.
pub fn check_id_list(ids: &[String], source_name: &str) -> Result<Vec<String>, ScopeProblem> {
    let numbered: Vec<(usize, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (i + 1, id.trim().to_owned()))
        .collect();
    for (line, id) in &numbered {
        if id.is_empty() || id.chars().any(unfit_for_an_id) {
            return Err(ScopeProblem::Malformed {
                source_name: source_name.to_owned(),
                line: *line,
                id: id.clone(),
            });
        }
    }
    check_unique(&numbered, source_name)?;
    Ok(numbered.into_iter().map(|(_, id)| id).collect())
}

fn check_unique(ids: &[(usize, String)], source_name: &str) -> Result<(), ScopeProblem> {
    let mut seen = std::collections::HashMap::with_capacity(ids.len());
    for (line, id) in ids {
        if let Some(first_line) = seen.insert(id.as_str(), *line) {
            return Err(ScopeProblem::Duplicate {
                source_name: source_name.to_owned(),
                id: id.clone(),
                first_line,
                line: *line,
            });
        }
    }
    Ok(())
}

/// Freezes checked ids into the stored text and its hash.
pub fn freeze(ids: Vec<String>, source_name: &str) -> Result<FrozenIds, ScopeProblem> {
    if ids.is_empty() {
        return Err(ScopeProblem::Empty {
            source_name: source_name.to_owned(),
        });
    }
    let mut text = String::with_capacity(ids.iter().map(|id| id.len() + 1).sum());
    for id in &ids {
        text.push_str(id);
        text.push('\n');
    }
    if text.len() > MAX_FROZEN_BYTES {
        return Err(ScopeProblem::TooLarge {
            source_name: source_name.to_owned(),
            bytes: text.len(),
        });
    }
    let sha256 = sha256_hex(text.as_bytes());
    Ok(FrozenIds { ids, text, sha256 })
}

/// The frozen scope's ConfigMap as the API server shows it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredScope<'a> {
    pub uid: &'a str,
    pub immutable: bool,
    /// The text under the ids key, if the key is there.
    pub text: Option<&'a str>,
}

/// What the status recorded when the scope was frozen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedScope<'a> {
    pub config_map: &'a str,
    /// The uid of the ConfigMap the operator created (absent in statuses of older operators).
    pub uid: Option<&'a str>,
    pub sha256: &'a str,
}

/// Whether the ConfigMap still is the frozen scope the operator created and the approver
/// signed: same uid, immutable, and exactly the bytes whose sha256 was recorded. `Err` says
/// what changed, naming the ConfigMap.
pub fn verify_stored(
    recorded: RecordedScope<'_>,
    stored: Option<StoredScope<'_>>,
) -> Result<(), String> {
    let name = recorded.config_map;
    let Some(stored) = stored else {
        return Err(format!("ConfigMap {name}, the frozen scope, was deleted"));
    };
    if let Some(uid) = recorded.uid
        && uid != stored.uid
    {
        return Err(format!(
            "ConfigMap {name}, the frozen scope, was replaced by another ConfigMap of that name (uid {}, the operator created uid {uid})",
            stored.uid
        ));
    }
    if !stored.immutable {
        return Err(format!(
            "ConfigMap {name}, the frozen scope, is not immutable"
        ));
    }
    let sha256 = sha256_hex(stored.text.unwrap_or_default().as_bytes());
    if sha256 != recorded.sha256 {
        return Err(format!(
            "ConfigMap {name}, the frozen scope, holds ids whose sha256 is {sha256}, not the frozen and approved {}",
            recorded.sha256
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hashes_exactly_the_stored_text() {
        let frozen = freeze(vec!["a".into(), "b".into()], "x").unwrap();
        assert_eq!(frozen.text(), "a\nb\n");
        // printf 'a\nb\n' | sha256sum
        assert_eq!(
            frozen.sha256(),
            "911169ddaaf146aff539f58c26c489af3b892dff0fe283c1c264c65ae5aa59a2"
        );
    }

    #[test]
    fn lines_are_trimmed_and_blank_lines_skipped() {
        let ids = parse_id_lines("  evt-1 \n\n evt-2\r\n", "cm").unwrap();
        assert_eq!(ids, ["evt-1", "evt-2"]);
    }

    #[test]
    fn duplicates_are_refused_with_both_lines() {
        let problem = parse_id_lines("a\nb\na\n", "ConfigMap ids key list").unwrap_err();
        assert_eq!(
            problem,
            ScopeProblem::Duplicate {
                source_name: "ConfigMap ids key list".into(),
                id: "a".into(),
                first_line: 1,
                line: 3
            }
        );
        assert!(problem.to_string().contains("line 3"));
    }

    #[test]
    fn ids_with_invisible_characters_are_refused_as_the_crd_refuses_them() {
        // Zero-width space, byte-order mark, right-to-left override, soft hyphen, word
        // joiner, a private-use and an unassigned code point.
        for id in [
            "evt-1\u{200B}",
            "\u{FEFF}evt-2",
            "evt-\u{202E}3",
            "evt\u{AD}-4",
            "evt-5\u{2060}",
            "evt-\u{E000}6",
            "evt-\u{0378}7",
        ] {
            let problem = parse_id_lines(&format!("ok\n{id}\n"), "cm").unwrap_err();
            assert!(
                matches!(problem, ScopeProblem::Malformed { line: 2, .. }),
                "{id:?}: {problem:?}"
            );
            assert!(check_id_list(&[id.to_owned()], "spec.scope.eventIds").is_err());
        }
        // Letters and marks of any script are ids like any other.
        assert!(parse_id_lines("évt-1\nсобытие-2\n注文-3\ne\u{301}vt-4\n", "cm").is_ok());
    }

    #[test]
    fn ids_with_inner_whitespace_are_refused() {
        assert!(matches!(
            parse_id_lines("a b\n", "cm"),
            Err(ScopeProblem::Malformed { line: 1, .. })
        ));
        assert!(matches!(
            check_id_list(&["ok".into(), " ".into()], "spec.scope.eventIds"),
            Err(ScopeProblem::Malformed { line: 2, .. })
        ));
    }

    #[test]
    fn an_empty_list_cannot_be_frozen() {
        assert!(matches!(
            freeze(vec![], "cm"),
            Err(ScopeProblem::Empty { .. })
        ));
        assert!(
            ScopeProblem::NoEventIds
                .to_string()
                .contains("scope.eventIdsFrom")
        );
    }

    #[test]
    fn a_list_too_large_for_a_config_map_is_refused() {
        let ids: Vec<String> = (0..5000).map(|i| format!("{i:0>250}")).collect();
        assert!(matches!(
            freeze(ids, "spec.scope.eventIds"),
            Err(ScopeProblem::TooLarge { .. })
        ));
    }

    #[test]
    fn a_stored_scope_must_be_the_created_immutable_list() {
        let frozen = freeze(vec!["a".into(), "b".into()], "x").unwrap();
        let recorded = RecordedScope {
            config_map: "orders-scope-5e3c1a",
            uid: Some("u1"),
            sha256: frozen.sha256(),
        };
        let stored = |uid, immutable, text| {
            Some(StoredScope {
                uid,
                immutable,
                text,
            })
        };
        assert_eq!(
            verify_stored(recorded, stored("u1", true, Some(frozen.text()))),
            Ok(())
        );
        for (found, fragment) in [
            (None, "was deleted"),
            (stored("u2", true, Some(frozen.text())), "was replaced"),
            (stored("u1", false, Some(frozen.text())), "is not immutable"),
            (
                stored("u1", true, Some("a\nc\n")),
                "not the frozen and approved",
            ),
            (stored("u1", true, None), "not the frozen and approved"),
        ] {
            let problem = verify_stored(recorded, found).unwrap_err();
            assert!(problem.contains(fragment), "{problem}");
            assert!(problem.contains("orders-scope-5e3c1a"), "{problem}");
        }
        // A status without a recorded uid (an older operator) still checks the content.
        let legacy = RecordedScope {
            uid: None,
            ..recorded
        };
        assert_eq!(
            verify_stored(legacy, stored("u9", true, Some(frozen.text()))),
            Ok(())
        );
    }

    proptest! {
        /// Any change of the stored bytes is caught.
        #[test]
        fn any_edit_of_the_stored_ids_is_caught(
            ids in proptest::collection::btree_set("[a-z0-9-]{1,20}", 1..50),
            extra in "[a-z0-9-]{1,20}",
        ) {
            let frozen = freeze(ids.into_iter().collect(), "x").unwrap();
            let recorded = RecordedScope { config_map: "c", uid: Some("u"), sha256: frozen.sha256() };
            let edited = format!("{}{extra}\n", frozen.text());
            let stored = StoredScope { uid: "u", immutable: true, text: Some(&edited) };
            prop_assert!(verify_stored(recorded, Some(stored)).is_err());
        }

        /// Freezing and reading back the stored text gives the same ids, in order.
        #[test]
        fn frozen_text_reads_back_as_the_same_ids(
            ids in proptest::collection::btree_set("[a-z0-9-]{1,20}", 1..200)
        ) {
            let ids: Vec<String> = ids.into_iter().collect();
            let frozen = freeze(ids.clone(), "x").unwrap();
            prop_assert_eq!(parse_id_lines(frozen.text(), "x").unwrap(), ids.clone());
            prop_assert_eq!(frozen.text().lines().count(), ids.len());
            let again = freeze(ids, "x").unwrap();
            prop_assert_eq!(again.sha256(), frozen.sha256());
        }
    }
}
