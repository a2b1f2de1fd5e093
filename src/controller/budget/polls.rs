//! When each budget polls next: the budget controller's own clock instead of kube-runtime's
//! requeue. A requeue keeps every budget in kube's scheduler between polls (a reference in a
//! delay queue, a map and the runner's bookkeeping: about 700 bytes a budget at thousands of
//! budgets); here a budget waiting for its poll is its name and a due time, and kube's
//! scheduler holds only the budgets that are due.
//!
//! A budget's latest poll decides: a reconcile that ends schedules the next poll, replacing
//! what was scheduled before (as a requeue replaced a pending one). A budget deleted in
//! between is reconciled once more at its due time, which finds it gone.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::cached::CachedBudget;
use super::wakes;

/// The budgets' next polls, shared by the reconciles that schedule them and the stream that
/// triggers them.
#[derive(Clone, Default)]
pub struct Polls {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    clock: Mutex<Clock>,
    /// Told when a poll is due earlier than any the stream waits for.
    earlier: Notify,
}

#[derive(Default)]
struct Clock {
    /// Each budget's next poll, by `namespace/name`.
    due: HashMap<Arc<str>, Instant>,
    /// The same, by time; an entry whose time is no longer the budget's due time is stale
    /// and skipped when it comes up.
    queue: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
}

impl Clock {
    fn schedule(&mut self, budget: &str, at: Instant) -> bool {
        let name: Arc<str> = match self.due.get_key_value(budget) {
            Some((known, _)) => Arc::clone(known),
            None => budget.into(),
        };
        let earliest = self.queue.peek().map(|Reverse((at, _))| *at);
        self.due.insert(Arc::clone(&name), at);
        self.queue.push(Reverse((at, name)));
        // Stale entries are dropped as they come up; when they are most of the queue
        // (budgets that polled again early, after a change), it is rebuilt.
        if self.queue.len() > 2 * self.due.len() + 64 {
            self.queue = self
                .due
                .iter()
                .map(|(name, at)| Reverse((*at, Arc::clone(name))))
                .collect();
        }
        earliest.is_none_or(|earliest| at < earliest)
    }

    /// The budgets due at `now`, and when the next one is due.
    fn take_due(&mut self, now: Instant) -> (Vec<Arc<str>>, Option<Instant>) {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.queue.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, name))) = self.queue.pop() else {
                break;
            };
            if self.due.get(&name) == Some(&at) {
                self.due.remove(&name);
                due.push(name);
            }
        }
        let next = self.queue.peek().map(|Reverse((at, _))| *at);
        (due, next)
    }
}

impl Polls {
    /// Polls budget `namespace/name` again `after` from now, instead of when it was due.
    pub fn schedule(&self, namespace: &str, name: &str, after: Duration) {
        let budget = format!("{namespace}/{name}");
        let earlier = self
            .inner
            .clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .schedule(&budget, Instant::now() + after);
        if earlier {
            self.inner.earlier.notify_one();
        }
    }

    /// How many budgets wait for a poll.
    pub fn waiting(&self) -> usize {
        self.inner
            .clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due
            .len()
    }

    /// The budgets as their polls come due.
    pub fn due(&self) -> impl Stream<Item = ObjectRef<CachedBudget>> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        let pending: Vec<Arc<str>> = Vec::new();
        futures::stream::unfold((inner, pending), |(inner, mut pending)| async move {
            loop {
                // Every name here is `namespace/name` (see `schedule`), so each reads back.
                if let Some(budget) = pending.pop() {
                    if let Some(budget) = wakes::budget_of(&budget) {
                        return Some((budget, (inner, pending)));
                    }
                    continue;
                }
                // Registered before the clock is read, so a poll scheduled in between wakes it.
                let earlier = inner.earlier.notified();
                let (due, next) = inner
                    .clock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take_due(Instant::now());
                if !due.is_empty() {
                    pending = due;
                    pending.reverse();
                    continue;
                }
                match next {
                    Some(next) => {
                        tokio::select! {
                            () = tokio::time::sleep_until(next) => {}
                            () = earlier => {}
                        }
                    }
                    None => earlier.await,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn names(references: &[ObjectRef<CachedBudget>]) -> Vec<String> {
        references
            .iter()
            .map(|r| format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn budgets_come_due_in_order_of_their_latest_poll() {
        let polls = Polls::default();
        let start = Instant::now();
        polls.schedule("shop", "orders", Duration::from_secs(15));
        polls.schedule("shop", "billing", Duration::from_secs(5));
        polls.schedule("other", "orders", Duration::from_secs(10));
        // Polled again early (a change): the later poll replaces the earlier one.
        polls.schedule("shop", "billing", Duration::from_secs(20));
        assert_eq!(polls.waiting(), 3);
        let mut due = Box::pin(polls.due());
        let mut seen = Vec::new();
        for _ in 0..3 {
            let budget = due.next().await.expect("a budget");
            seen.push((budget, start.elapsed().as_secs()));
        }
        let (references, times): (Vec<_>, Vec<_>) = seen.into_iter().unzip();
        assert_eq!(
            names(&references),
            ["other/orders", "shop/orders", "shop/billing"]
        );
        assert_eq!(times, [10, 15, 20]);
        assert_eq!(polls.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_poll_wakes_a_stream_that_waits_for_a_later_one() {
        let polls = Polls::default();
        let start = Instant::now();
        polls.schedule("shop", "late", Duration::from_secs(60));
        let mut due = Box::pin(polls.due());
        let waiting = tokio::spawn(async move {
            let first = due.next().await.expect("a budget");
            (first, start.elapsed().as_secs())
        });
        // Let the stream start waiting for the late poll, then schedule an earlier one.
        tokio::time::sleep(Duration::from_secs(1)).await;
        polls.schedule("shop", "early", Duration::from_secs(2));
        let (first, at) = waiting.await.expect("the stream");
        assert_eq!(names(&[first]), ["shop/early"]);
        assert_eq!(at, 3);
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let mut clock = Clock::default();
        let now = Instant::now();
        for second in 0..10_000 {
            clock.schedule("shop/orders", now + Duration::from_secs(second));
        }
        assert_eq!(clock.due.len(), 1);
        assert!(clock.queue.len() <= 2 + 64, "{}", clock.queue.len());
        let (due, next) = clock.take_due(now + Duration::from_secs(20_000));
        assert_eq!(due.len(), 1);
        assert_eq!(next, None);
    }
}
