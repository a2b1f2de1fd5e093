//! Control documents written beside the reconciles, on the capacity the API client's rate
//! limit leaves.
//!
//! A new budget needs two writes, its status and its control document, and when thousands of
//! budgets are created together the client's rate limit paces them. Written in one reconcile,
//! every budget would wait for the other budgets' documents too before it has a status, which
//! is what its user waits for. So a reconcile writes the status and hands the document here:
//! writers take it when no other request waits for the limit, always after the status that
//! records its revision. While it waits, and for [`OWN_WRITE_GRACE`] after it is written, it
//! counts as this process's own write over the watch, so no reconcile writes it twice. A
//! failed write is told to the budget's next reconcile, which reports it and writes the
//! document again.
//!
//! A document waits for the other requests at most [`PATIENCE`]: past it, it goes with them.
//! So a class paused while the operator is busy still reaches the consumers within a minute.
//!
//! A budget's documents are written one at a time and the last one wanted wins: a document
//! decided while an earlier one waits replaces it; one decided while an earlier one is being
//! written goes after it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::api_client::SpareCapacity;
use crate::controller::error::Error;

/// How long this process's own write counts over the ConfigMap watch, which may not have
/// delivered it yet. Past it the watch is believed: a document deleted or edited by someone
/// else is written again.
pub const OWN_WRITE_GRACE: Duration = Duration::from_secs(30);

/// Documents written at once: enough to keep the limit's spare capacity busy over one round
/// trip each, few enough that those that go together barely delay the next status.
const WRITES_AT_ONCE: usize = 8;

/// How long a handed document waits for the other requests at most.
pub const PATIENCE: Duration = Duration::from_secs(60);

type BudgetKey = (String, String);

/// The documents of every budget this process wrote lately or is writing.
pub struct DocumentWrites {
    records: Mutex<Records>,
    queue: mpsc::UnboundedSender<BudgetKey>,
    queued: Mutex<Option<mpsc::UnboundedReceiver<BudgetKey>>>,
    /// Documents being written now: the spare capacity they wait for is what the other
    /// requests leave.
    writing: AtomicUsize,
}

#[derive(Default)]
struct Records {
    by_budget: HashMap<BudgetKey, Record>,
    /// How many there were after the last sweep of expired ones.
    after_sweep: usize,
}

struct Record {
    uid: Option<String>,
    wanted: Arc<ConfigMap>,
    /// When the document that waits was first handed over.
    handed_at: Instant,
    state: State,
    /// A newer document was wanted while `wanted`'s predecessor was being written.
    again: bool,
}

enum State {
    Queued,
    Writing,
    Written(Timestamp),
    Failed(Error),
}

impl Default for DocumentWrites {
    fn default() -> Self {
        let (queue, queued) = mpsc::unbounded_channel();
        Self {
            records: Mutex::default(),
            queue,
            queued: Mutex::new(Some(queued)),
            writing: AtomicUsize::new(0),
        }
    }
}

impl DocumentWrites {
    /// Hands the document of budget `namespace/name` (`uid`) to the writers.
    pub fn submit(&self, namespace: &str, name: &str, uid: Option<&str>, configmap: ConfigMap) {
        let key = (namespace.to_owned(), name.to_owned());
        let wanted = Arc::new(configmap);
        let uid = uid.map(str::to_owned);
        let mut records = self.lock();
        match records.by_budget.get_mut(&key) {
            Some(record) if matches!(record.state, State::Queued | State::Writing) => {
                record.again = matches!(record.state, State::Writing);
                record.wanted = wanted;
                record.uid = uid;
            }
            _ => {
                records.by_budget.insert(
                    key.clone(),
                    Record {
                        uid,
                        wanted,
                        handed_at: Instant::now(),
                        state: State::Queued,
                        again: false,
                    },
                );
                // The receiver lives as long as this value does.
                let _ = self.queue.send(key);
                sweep(&mut records, Timestamp::now());
            }
        }
    }

    /// The document this process is writing for the budget, or wrote less than
    /// [`OWN_WRITE_GRACE`] ago. A write past its grace is forgotten here: the watch holds it.
    pub fn own_write(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        now: Timestamp,
    ) -> Option<Arc<ConfigMap>> {
        let mut records = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let record = records.by_budget.get(&key)?;
        let counts = match &record.state {
            State::Queued | State::Writing => true,
            State::Written(at) => within_grace(*at, now),
            State::Failed(_) => false,
        };
        if !counts && matches!(record.state, State::Written(_)) {
            records.by_budget.remove(&key);
            release_spare_room(&mut records.by_budget);
            return None;
        }
        (counts && record.uid.as_deref() == uid).then(|| Arc::clone(&record.wanted))
    }

    /// Why the budget's last document could not be written, once.
    pub fn take_failure(&self, namespace: &str, name: &str, uid: Option<&str>) -> Option<Error> {
        let mut records = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let record = records.by_budget.get(&key)?;
        if record.uid.as_deref() != uid || !matches!(record.state, State::Failed(_)) {
            return None;
        }
        match records.by_budget.remove(&key)?.state {
            State::Failed(error) => Some(error),
            State::Queued | State::Writing | State::Written(_) => None,
        }
    }

    /// Forgets a deleted budget (not a successor under its name): a document still waiting
    /// is not written.
    pub fn forget(&self, namespace: &str, name: &str, uid: Option<&str>) {
        self.forget_if(namespace, name, |recorded| recorded == uid);
    }

    /// Forgets budget `namespace/name` if `is_the_budget` says its recorded uid is the
    /// deleted budget's.
    pub fn forget_if(
        &self,
        namespace: &str,
        name: &str,
        is_the_budget: impl Fn(Option<&str>) -> bool,
    ) {
        let mut records = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        if records
            .by_budget
            .get(&key)
            .is_some_and(|record| is_the_budget(record.uid.as_deref()))
        {
            records.by_budget.remove(&key);
        }
    }

    /// Writes the handed documents with `write(namespace, configmap)`, each once `spare` has
    /// capacity, until dropped. Only the first call writes anything.
    pub async fn write_handed<W, F>(&self, spare: SpareCapacity, write: W)
    where
        W: Fn(String, Arc<ConfigMap>) -> F,
        F: Future<Output = Result<(), Error>>,
    {
        let queued = self
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(queued) = queued else {
            return std::future::pending().await;
        };
        let keys = futures::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|key| (key, queued))
        });
        keys.for_each_concurrent(WRITES_AT_ONCE, |key| self.write_one(key, &spare, &write))
            .await;
    }

    async fn write_one<W, F>(&self, key: BudgetKey, spare: &SpareCapacity, write: &W)
    where
        W: Fn(String, Arc<ConfigMap>) -> F,
        F: Future<Output = Result<(), Error>>,
    {
        let handed_at = match self.lock().by_budget.get(&key) {
            Some(record) => record.handed_at,
            None => return,
        };
        let patience = PATIENCE.saturating_sub(handed_at.elapsed());
        spare.wait(&self.writing, patience).await;
        let configmap = {
            let mut records = self.lock();
            let Some(record) = records.by_budget.get_mut(&key) else {
                return;
            };
            if !matches!(record.state, State::Queued) {
                return;
            }
            record.state = State::Writing;
            Arc::clone(&record.wanted)
        };
        self.writing.fetch_add(1, Ordering::AcqRel);
        let result = write(key.0.clone(), configmap).await;
        self.writing.fetch_sub(1, Ordering::AcqRel);
        let mut records = self.lock();
        // Forgotten meanwhile (the budget is gone), or forgotten and handed again by a
        // successor under its name, whose document waits in the queue.
        let Some(record) = records
            .by_budget
            .get_mut(&key)
            .filter(|record| matches!(record.state, State::Writing))
        else {
            return;
        };
        if std::mem::take(&mut record.again) {
            record.state = State::Queued;
            record.handed_at = Instant::now();
            let _ = self.queue.send(key);
            return;
        }
        record.state = match result {
            Ok(()) => State::Written(Timestamp::now()),
            Err(error) => State::Failed(error),
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic while holding the lock leaves records that are still whole.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn within_grace(written: Timestamp, now: Timestamp) -> bool {
    now.duration_since(written).unsigned_abs() < OWN_WRITE_GRACE
}

/// Drops written documents past their grace once the records have doubled since the last
/// sweep: amortized constant work per document, and a budget nobody polls again (deleted
/// while the watch was away) does not stay.
fn sweep(records: &mut Records, now: Timestamp) {
    if records.by_budget.len() < 2 * records.after_sweep + 64 {
        return;
    }
    records.by_budget.retain(|_, record| match record.state {
        State::Written(at) => within_grace(at, now),
        State::Queued | State::Writing | State::Failed(_) => true,
    });
    records.after_sweep = records.by_budget.len();
    release_spare_room(&mut records.by_budget);
}

/// Gives back the room a burst of writes left (a start with thousands of budgets writes every
/// document at once, then next to none): a map keeps its largest size, and here that was
/// about 200 bytes a budget for good. Shrinking only below a quarter, to twice the size,
/// keeps it amortized constant work per removal.
fn release_spare_room(by_budget: &mut HashMap<BudgetKey, Record>) {
    let len = by_budget.len();
    if by_budget.capacity() > 64 && len < by_budget.capacity() / 4 {
        by_budget.shrink_to(2 * len);
    }
}

#[cfg(test)]
mod tests;
