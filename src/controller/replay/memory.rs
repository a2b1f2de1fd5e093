//! What the replay controller keeps in memory between reconciles: the children this process
//! created (until the status records them) and a lock per source queue.
//!
//! Children are trusted by the uid the API server answered the operator's create with. That
//! uid is recorded in the status right after the create; until the record is written (or seen
//! in the watch cache), this memory vouches for it, so a failed record write or a cache behind
//! the operator's own writes does not make its own child look foreign. A restarted operator
//! remembers nothing and trusts only the status.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use crate::core::replay_plan::StageName;

/// Which child of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Child {
    Scope,
    Job(StageName),
    /// The audit ConfigMap (remembered by name: the API server generates it).
    Audit,
}

/// What happened to a create this process sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Created, with the uid the API server gave it.
    Uid(String),
    /// The API server answered that it did not create it (e.g. a webhook or quota refused it).
    Refused,
}

/// Entries kept at most: the oldest are forgotten first (their replays then rely on the
/// status alone, as after a restart).
const CAPACITY: usize = 4096;

/// A child of a replay: the replay's uid and which child.
type Key = (String, Child);

/// The creates, and their order for forgetting the oldest first.
#[derive(Default)]
struct Entries {
    created: HashMap<Key, Created>,
    order: VecDeque<Key>,
}

/// Creates by replay uid and child; bounded.
#[derive(Default)]
pub struct ChildMemory {
    entries: Mutex<Entries>,
}

impl ChildMemory {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        // A poisoned lock only means a reconcile panicked; the map itself is still sound.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn remember(&self, replay_uid: &str, child: Child, created: Created) {
        let mut entries = self.lock();
        let key = (replay_uid.to_owned(), child);
        if entries.created.insert(key.clone(), created).is_none() {
            entries.order.push_back(key);
        }
        while entries.order.len() > CAPACITY {
            if let Some(oldest) = entries.order.pop_front() {
                entries.created.remove(&oldest);
            }
        }
    }

    pub fn recall(&self, replay_uid: &str, child: Child) -> Option<Created> {
        self.lock()
            .created
            .get(&(replay_uid.to_owned(), child))
            .cloned()
    }

    /// The Job uids remembered for a replay, by stage.
    pub fn jobs(&self, replay_uid: &str) -> Vec<(StageName, String)> {
        StageName::ALL
            .into_iter()
            .filter_map(|stage| match self.recall(replay_uid, Child::Job(stage)) {
                Some(Created::Uid(uid)) => Some((stage, uid)),
                _ => None,
            })
            .collect()
    }

    /// Forgets a child once the status records it (or the replay is gone).
    pub fn forget(&self, replay_uid: &str, child: Child) {
        let mut entries = self.lock();
        let key = (replay_uid.to_owned(), child);
        if entries.created.remove(&key).is_some() {
            entries.order.retain(|k| k != &key);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().created.len()
    }
}

/// One lock per key (a namespace and source queue), dropped when nobody holds or waits for it:
/// replays of different queues never wait for each other.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// Waits at most `timeout` for the lock of `key`; `None` when it did not come.
    pub async fn acquire(
        &self,
        key: &str,
        timeout: Duration,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            locks.retain(|_, lock| lock.strong_count() > 0);
            match locks.get(key).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        tokio::time::timeout(timeout, lock.lock_owned()).await.ok()
    }

    /// Keys with a live lock (for tests: an unused key leaves nothing behind).
    #[cfg(test)]
    pub fn live(&self) -> usize {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        locks.retain(|_, lock| lock.strong_count() > 0);
        locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_bounded_and_forgets_the_oldest_first() {
        let memory = ChildMemory::default();
        for i in 0..CAPACITY + 10 {
            memory.remember(&i.to_string(), Child::Scope, Created::Uid(format!("u{i}")));
        }
        assert_eq!(memory.len(), CAPACITY);
        assert_eq!(memory.recall("0", Child::Scope), None);
        assert_eq!(
            memory.recall(&(CAPACITY + 9).to_string(), Child::Scope),
            Some(Created::Uid(format!("u{}", CAPACITY + 9)))
        );
        memory.forget(&(CAPACITY + 9).to_string(), Child::Scope);
        assert_eq!(memory.len(), CAPACITY - 1);
    }

    #[test]
    fn jobs_are_recalled_by_stage() {
        let memory = ChildMemory::default();
        memory.remember("r", Child::Job(StageName::Main), Created::Uid("m".into()));
        memory.remember("r", Child::Job(StageName::Canary), Created::Refused);
        assert_eq!(memory.jobs("r"), vec![(StageName::Main, "m".to_owned())]);
        assert!(memory.jobs("other").is_empty());
    }

    #[tokio::test]
    async fn a_held_lock_times_out_others_of_its_key_only() {
        let locks = KeyedLocks::default();
        let held = locks.acquire("a/q", Duration::from_secs(1)).await;
        assert!(held.is_some());
        assert!(
            locks
                .acquire("a/q", Duration::from_millis(20))
                .await
                .is_none()
        );
        assert!(
            locks
                .acquire("b/q", Duration::from_millis(20))
                .await
                .is_some()
        );
        drop(held);
        assert!(
            locks
                .acquire("a/q", Duration::from_millis(20))
                .await
                .is_some()
        );
        assert_eq!(locks.live(), 0);
    }
}
