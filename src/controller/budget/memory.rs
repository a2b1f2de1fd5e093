//! What the budget controller remembers between polls, in this process: the status each
//! budget's last poll decided (packed: [`super::packed_status`]) and what tells whether the
//! next one is news against the one last written. The decision reads its memory from
//! here instead of a GET of the status per poll, and a status is written only when it is news
//! ([`super::news`]), so the written status may lag the decided one by what is not news.
//!
//! A replica that starts leading begins empty and takes each budget's memory from the status
//! in its watch cache: what was last written is what a new leader continues from. Once a
//! budget is remembered, the watch keeps its status out of the cache
//! ([`crate::controller::slim::budget`]): the memory lives as long as the watches (one term),
//! so the cache is never read for it again.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, Mutex, PoisonError};

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::{BacklogBudgetStatus, BudgetPhase};

use super::news::Written;
use super::packed_status::PackedStatus;

/// A budget's uid as the memory tells budgets apart by it: a 64-bit digest keyed at random
/// per process, instead of the 36-character text (an allocation a budget). A budget and its
/// successor under the same name are taken for one only if their digests match, which the
/// random key makes as likely as guessing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidDigest(u64);

static UID_KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);

impl UidDigest {
    pub fn of(uid: Option<&str>) -> Option<UidDigest> {
        uid.map(|uid| UidDigest(UID_KEY.hash_one(uid)))
    }

    /// Whether `uid` is the one this is the digest of.
    pub fn is_of(digest: Option<UidDigest>, uid: Option<&str>) -> bool {
        digest == UidDigest::of(uid)
    }
}

/// One budget's memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Remembered {
    /// The budget this is about: a budget deleted and created again under its name starts
    /// afresh.
    pub uid: Option<UidDigest>,
    /// What the last poll decided.
    pub decided: PackedStatus,
    /// What the API server holds, as far as this process knows: only what tells whether a
    /// new status is news, so a budget costs one (packed) status here.
    pub written: Written,
    /// When `written` was written (`None`: unknown).
    pub written_at: Option<Timestamp>,
    /// The phase this process last exported on `/metrics` for the budget.
    pub exported_phase: Option<BudgetPhase>,
}

impl Remembered {
    /// A budget seen for the first time: its status as the watch cache has it.
    pub fn from_cache(uid: Option<&str>, status: Option<&BacklogBudgetStatus>) -> Remembered {
        let empty = BacklogBudgetStatus::default();
        let status = status.unwrap_or(&empty);
        let written_at = status
            .observed
            .as_ref()
            .and_then(|observed| observed.at.as_ref())
            .map(|at| at.0);
        Remembered {
            uid: UidDigest::of(uid),
            written: Written::of(status),
            decided: PackedStatus::pack(status),
            written_at,
            exported_phase: None,
        }
    }
}

/// Every budget's memory, by `namespace/name` (one allocation a budget: a pair of strings
/// was two).
#[derive(Default)]
pub struct DecisionMemory {
    budgets: Mutex<HashMap<Box<str>, Remembered>>,
}

fn key(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

impl DecisionMemory {
    /// The memory of budget `namespace/name` with `uid`, if this process has one.
    /// The memory of budget `namespace/name` with `uid`, or, the first time this process
    /// sees it, its status as the watch cache has it. A budget deleted and created again under
    /// its name starts afresh, except that the phase series its predecessor exported is still
    /// known (and so replaced, not doubled).
    pub fn recall(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        cached: Option<&BacklogBudgetStatus>,
    ) -> Remembered {
        let mut budgets = self.lock();
        let key = key(namespace, name);
        let known = budgets.get(&key);
        match known {
            Some(remembered) if UidDigest::is_of(remembered.uid, uid) => remembered.clone(),
            _ => {
                let first = Remembered {
                    exported_phase: known.and_then(|remembered| remembered.exported_phase),
                    ..Remembered::from_cache(uid, cached)
                };
                // Known from now on, before this reconcile writes: the watch event of its own
                // status write may come back before the reconcile ends, and must find the
                // budget known to leave the status out of the cache.
                budgets.insert(key, first.clone());
                first
            }
        }
    }

    /// Whether this process remembers budget `namespace/name` with `uid`: then the status in
    /// the watch cache is never read again.
    pub fn knows(&self, namespace: &str, name: &str, uid: Option<&str>) -> bool {
        self.lock()
            .get(&key(namespace, name))
            .is_some_and(|remembered| UidDigest::is_of(remembered.uid, uid))
    }

    /// Forgets budget `namespace/name` with `uid` (not a successor under its name), and says
    /// what it was.
    pub fn forget(&self, namespace: &str, name: &str, uid: Option<&str>) -> Option<Remembered> {
        let mut budgets = self.lock();
        let key = key(namespace, name);
        if !UidDigest::is_of(budgets.get(&key)?.uid, uid) {
            return None;
        }
        budgets.remove(&key)
    }

    /// Replaces what is remembered of the budget `remembered` is about. A budget enters the
    /// memory only by [`DecisionMemory::recall`]: when it is no longer there (deleted while its
    /// reconcile ran) or a successor under its name is, nothing is kept, and false says so.
    pub fn keep(&self, namespace: &str, name: &str, remembered: Remembered) -> bool {
        let mut budgets = self.lock();
        match budgets.get_mut(&key(namespace, name)) {
            Some(known) if known.uid == remembered.uid => {
                *known = remembered;
                true
            }
            _ => false,
        }
    }

    /// Forgets every budget `exists` denies, and says which with what they were; called now
    /// and then, so deleted budgets do not pile up.
    pub fn forget_unless(
        &self,
        exists: impl Fn(&str, &str) -> bool,
    ) -> Vec<((String, String), Remembered)> {
        let mut budgets = self.lock();
        let split = |key: &str| {
            let (namespace, name) = key.split_once('/').unwrap_or(("", key));
            (namespace.to_owned(), name.to_owned())
        };
        let gone: Vec<Box<str>> = budgets
            .keys()
            .filter(|key| {
                let (namespace, name) = split(key);
                !exists(&namespace, &name)
            })
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|key| {
                budgets
                    .remove(&key)
                    .map(|remembered| (split(&key), remembered))
            })
            .collect()
    }

    pub fn remembered(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Remembered>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.budgets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_created_again_under_its_name_starts_afresh_but_its_phase_series_is_known() {
        let memory = DecisionMemory::default();
        let cached = BacklogBudgetStatus {
            phase: Some(BudgetPhase::AtRisk),
            ..Default::default()
        };
        let first = memory.recall("shop", "orders", Some("u-1"), Some(&cached));
        let unpacked = first.decided.unpack().expect("a status");
        assert_eq!(unpacked.phase, Some(BudgetPhase::AtRisk));
        // Known at once, before the reconcile that recalled it keeps anything.
        assert!(memory.knows("shop", "orders", Some("u-1")));
        assert!(memory.keep(
            "shop",
            "orders",
            Remembered {
                exported_phase: Some(BudgetPhase::AtRisk),
                ..first.clone()
            },
        ));
        let again = memory.recall("shop", "orders", Some("u-1"), None);
        assert_eq!(again.exported_phase, Some(BudgetPhase::AtRisk));
        assert_eq!(again.decided, first.decided);
        let successor = memory.recall("shop", "orders", Some("u-2"), None);
        assert_eq!(successor.uid, UidDigest::of(Some("u-2")));
        assert_eq!(successor.decided.unpack().expect("a status").phase, None);
        assert_eq!(successor.exported_phase, Some(BudgetPhase::AtRisk));
        // A reconcile of the predecessor that ends now keeps nothing over its successor.
        assert!(!memory.keep("shop", "orders", first.clone()));
        assert_eq!(
            memory.recall("shop", "orders", Some("u-2"), None).uid,
            UidDigest::of(Some("u-2"))
        );
        // Nor over a budget deleted while it ran.
        memory.forget("shop", "orders", Some("u-2"));
        assert!(!memory.keep("shop", "orders", first));
        assert_eq!(memory.remembered(), 0);
    }

    #[test]
    fn budgets_the_cache_denies_are_forgotten_by_namespace_and_name() {
        let memory = DecisionMemory::default();
        memory.recall("shop", "kept", Some("u-1"), None);
        memory.recall("shop", "gone", Some("u-2"), None);
        memory.recall("other", "gone", Some("u-3"), None);
        let forgotten =
            memory.forget_unless(|namespace, name| (namespace, name) != ("shop", "gone"));
        let names: Vec<_> = forgotten
            .iter()
            .map(|((namespace, name), remembered)| {
                (namespace.as_str(), name.as_str(), remembered.uid)
            })
            .collect();
        assert_eq!(names, [("shop", "gone", UidDigest::of(Some("u-2")))]);
        assert_ne!(UidDigest::of(Some("u-2")), UidDigest::of(Some("u-3")));
        assert_eq!(UidDigest::of(None), None);
        assert!(memory.knows("shop", "kept", Some("u-1")));
        assert!(memory.knows("other", "gone", Some("u-3")));
        assert_eq!(memory.remembered(), 2);
    }

    #[test]
    fn a_status_written_in_whole_seconds_is_continued_from() {
        // What an operator before microsecond times wrote: a new leader (or an upgrade)
        // reads it from its watch cache and continues from it.
        let written: BacklogBudgetStatus = serde_json::from_value(serde_json::json!({
            "phase": "Healthy",
            "observed": {"backlog": 10.0, "at": "2026-12-01T10:00:05Z"},
            "lastScale": {"at": "2026-12-01T09:58:00Z", "from": 2, "to": 3, "reason": "r"},
            "recentDemand": [{"at": "2026-12-01T09:50:00Z", "produceRate": 100.5}],
            "busySince": "2026-12-01T09:59:30Z"
        }))
        .expect("a status in whole seconds reads");
        let at = |text: &str| text.parse::<Timestamp>().expect("a time");
        assert_eq!(
            written
                .observed
                .as_ref()
                .and_then(|o| o.at.as_ref())
                .map(|t| t.0),
            Some(at("2026-12-01T10:00:05Z"))
        );
        assert_eq!(
            written.busy_since.as_ref().map(|t| t.0),
            Some(at("2026-12-01T09:59:30Z"))
        );
        let remembered = DecisionMemory::default().recall("shop", "orders", None, Some(&written));
        assert_eq!(remembered.written_at, Some(at("2026-12-01T10:00:05Z")));
        assert_eq!(remembered.decided.unpack().expect("a status"), written);
    }
}
