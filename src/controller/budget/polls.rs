//! When each budget is reconciled: the budget controller's own clock and queue in front of
//! kube-runtime's scheduler.
//!
//! A requeue keeps every budget in kube's scheduler between polls (a reference in a delay
//! queue, a map and the runner's bookkeeping: about 700 bytes a budget at thousands of
//! budgets); here a budget waiting for its poll is its name and a due time. And the triggers
//! (a budget changed, its workload changed, its grouped answer moved) are asked here first,
//! as names: kube's scheduler is handed at most [`HANDED_AT_ONCE`] budgets that have not
//! started. Handed everything at once, as a start's lists of thousands of budgets and
//! workloads did, its tables grew to thousands of references and kept that room for good.
//!
//! A budget's latest poll decides: a reconcile that ends schedules the next poll, replacing
//! what was scheduled before (as a requeue replaced a pending one). A trigger reconciles the
//! budget as soon as there is room, whatever its poll. A budget deleted in between is dropped
//! when it comes up, as the budget cache no longer has it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::cached::CachedBudget;
use super::wakes;
use crate::controller::listed::Listed;

/// Budgets handed to kube's scheduler whose reconcile has not started, at most: enough to keep
/// every reconcile slot busy with the next one waiting.
pub const HANDED_AT_ONCE: usize = 2 * super::RECONCILES_AT_ONCE as usize;

/// A budget handed and never started stops counting against [`HANDED_AT_ONCE`] after this:
/// deleted between the cache lookup and the controller's, it is never reconciled.
const HANDED_FOR_AT_MOST: Duration = Duration::from_secs(30);

/// Room kept by the queue of asked budgets once it is empty again: a start asks for every
/// budget at once, and the room that took is given back.
const ASKED_ROOM_KEPT: usize = 1024;

/// The budgets' next polls and asked reconciles, shared by the reconciles and triggers that
/// schedule them and the stream that hands them to the controller.
#[derive(Clone, Default)]
pub struct Polls {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    clock: Mutex<Clock>,
    /// Told when there may be something to hand earlier than the stream waits for: a poll due
    /// earlier, an asked budget, room freed by a reconcile that started.
    changed: Notify,
}

#[derive(Default)]
struct Clock {
    /// Each budget's next poll, by `namespace/name`.
    due: HashMap<Arc<str>, Instant>,
    /// The same, by time; an entry whose time is no longer the budget's due time is stale
    /// and skipped when it comes up.
    queue: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// Budgets to reconcile as soon as there is room, in the order asked, each once.
    asked: VecDeque<Arc<str>>,
    asked_once: HashSet<Arc<str>>,
    /// Budgets handed to the controller whose reconcile has not started, and since when.
    handed: HashMap<Arc<str>, Instant>,
}

/// What the clock has for the controller now.
#[derive(Debug, PartialEq)]
enum Next {
    /// This budget, now handed.
    Hand(Arc<str>),
    /// Nothing before this time (or any news), if ever.
    Wait(Option<Instant>),
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

    fn ask(&mut self, budget: &str) {
        if self.asked_once.contains(budget) {
            return;
        }
        let name: Arc<str> = match self.due.get_key_value(budget) {
            Some((known, _)) => Arc::clone(known),
            None => budget.into(),
        };
        self.asked_once.insert(Arc::clone(&name));
        self.asked.push_back(name);
    }

    fn started(&mut self, budget: &str) -> bool {
        self.handed.remove(budget).is_some()
    }

    /// The next budget to hand at `now`: asked ones first, then due polls, while fewer than
    /// [`HANDED_AT_ONCE`] wait to start. A budget already handed is not handed again: the
    /// reconcile it waits for has not read anything yet.
    fn next(&mut self, now: Instant) -> Next {
        if self.handed.len() >= HANDED_AT_ONCE {
            self.handed
                .retain(|_, since| now.duration_since(*since) < HANDED_FOR_AT_MOST);
            if self.handed.len() >= HANDED_AT_ONCE {
                let oldest = self.handed.values().min().copied();
                return Next::Wait(oldest.map(|since| since + HANDED_FOR_AT_MOST));
            }
        }
        while let Some(name) = self.asked.pop_front() {
            self.asked_once.remove(&name);
            if let Some(handed) = self.hand(name, now) {
                return Next::Hand(handed);
            }
        }
        if self.asked.capacity() > ASKED_ROOM_KEPT {
            self.asked.shrink_to_fit();
            self.asked_once.shrink_to_fit();
        }
        while let Some(Reverse((at, _))) = self.queue.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, name))) = self.queue.pop() else {
                break;
            };
            if self.due.get(&name) != Some(&at) {
                continue;
            }
            self.due.remove(&name);
            if let Some(handed) = self.hand(name, now) {
                return Next::Hand(handed);
            }
        }
        Next::Wait(self.queue.peek().map(|Reverse((at, _))| *at))
    }

    fn hand(&mut self, name: Arc<str>, now: Instant) -> Option<Arc<str>> {
        if self.handed.contains_key(&name) {
            return None;
        }
        self.handed.insert(Arc::clone(&name), now);
        Some(name)
    }
}

impl Polls {
    fn clock(&self) -> std::sync::MutexGuard<'_, Clock> {
        // A poisoned lock only means a panic elsewhere; the clock is still usable.
        self.inner
            .clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Polls budget `namespace/name` again `after` from now, instead of when it was due.
    pub fn schedule(&self, namespace: &str, name: &str, after: Duration) {
        let budget = format!("{namespace}/{name}");
        let earlier = self.clock().schedule(&budget, Instant::now() + after);
        if earlier {
            self.inner.changed.notify_one();
        }
    }

    /// Reconciles budget `namespace/name` (its asker name, [`wakes::asker`]) as soon as there
    /// is room: something it reads changed.
    pub fn ask(&self, budget: &str) {
        self.clock().ask(budget);
        self.inner.changed.notify_one();
    }

    /// Budget `namespace/name`'s (its asker name) reconcile started: it no longer waits in
    /// kube's scheduler.
    pub fn started(&self, budget: &str) {
        if self.clock().started(budget) {
            self.inner.changed.notify_one();
        }
    }

    /// How many budgets wait for a poll.
    pub fn waiting(&self) -> usize {
        self.clock().due.len()
    }

    /// How many budgets were handed to the controller and have not started.
    #[cfg(test)]
    fn handed(&self) -> usize {
        self.clock().handed.len()
    }

    /// The budgets as they are asked for or their polls come due, as fast as the controller
    /// starts them, once the budget cache has `listed`. Budgets the cache does not have
    /// (deleted meanwhile) are dropped: the controller would find nothing to reconcile, and
    /// they would hold room until [`HANDED_FOR_AT_MOST`]. Before the first list is done the
    /// cache shows none, and a start's budgets wait here. (Not the store's own
    /// `wait_until_ready`, which wakes only one of its waiters: [`crate::controller::listed`].)
    pub fn due(
        &self,
        budgets: Store<CachedBudget>,
        listed: Listed,
    ) -> impl Stream<Item = ObjectRef<CachedBudget>> + Send + 'static + use<> {
        let polls = self.clone();
        futures::stream::once(async move {
            // An error means the watch is gone, and the controller with it.
            let _ = listed.wait().await;
        })
        .flat_map(move |()| Polls::handed_as_started(polls.clone(), budgets.clone()))
    }

    fn handed_as_started(
        polls: Polls,
        budgets: Store<CachedBudget>,
    ) -> impl Stream<Item = ObjectRef<CachedBudget>> + Send + 'static {
        futures::stream::unfold((polls, budgets), |(polls, budgets)| async move {
            loop {
                // Registered before the clock is read, so news in between wakes it.
                let shared = Arc::clone(&polls.inner);
                let changed = shared.changed.notified();
                let next = polls.clock().next(Instant::now());
                match next {
                    // Every name here is `namespace/name` (see `schedule` and `ask`).
                    Next::Hand(name) => match wakes::budget_of(&name) {
                        Some(budget) if budgets.get(&budget).is_some() => {
                            return Some((budget, (polls, budgets)));
                        }
                        _ => {
                            polls.clock().started(&name);
                        }
                    },
                    Next::Wait(Some(until)) => {
                        tokio::select! {
                            () = tokio::time::sleep_until(until) => {}
                            () = changed => {}
                        }
                    }
                    Next::Wait(None) => changed.await,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};

    use super::*;
    use crate::controller::listed::listed;

    /// The stream of a budget cache that has listed `budgets` (`namespace/name`).
    fn due_of(
        polls: &Polls,
        budgets: &[&str],
    ) -> impl Stream<Item = ObjectRef<CachedBudget>> + use<> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for name in budgets {
            writer.apply_watcher_event(&watcher::Event::InitApply(budget(name)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (mark, listed) = listed();
        mark.mark();
        // The store stays readable after the writer is gone.
        polls.due(store, listed)
    }

    fn budget(asker: &str) -> CachedBudget {
        let (namespace, name) = asker.split_once('/').expect("namespace/name");
        let spec: crate::api::BacklogBudgetSpec = serde_yaml::from_str(
            "{scaleTargetRef: {kind: Deployment, name: w}, minReplicas: 1, maxReplicas: 2, completionDeadline: 1m, metrics: {backlog: x}, partitionCount: 2, capacity: {perReplicaRate: 1}}",
        )
        .expect("a spec");
        let mut budget = crate::api::BacklogBudget::new(name, spec);
        budget.metadata.namespace = Some(namespace.into());
        budget.into()
    }

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
        let mut due = Box::pin(due_of(
            &polls,
            &["shop/orders", "shop/billing", "other/orders"],
        ));
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
        let mut due = Box::pin(due_of(&polls, &["shop/late", "shop/early"]));
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
        let later = now + Duration::from_secs(20_000);
        assert_eq!(clock.next(later), Next::Hand("shop/orders".into()));
        assert_eq!(clock.next(later), Next::Wait(None));
    }

    fn asked(clock: &mut Clock, count: usize) {
        for budget in 0..count {
            clock.ask(&format!("shop/b{budget}"));
        }
    }

    fn hand_all(clock: &mut Clock, now: Instant) -> Vec<Arc<str>> {
        let mut handed = Vec::new();
        while let Next::Hand(name) = clock.next(now) {
            handed.push(name);
        }
        handed
    }

    #[test]
    fn a_crowd_of_asked_budgets_is_handed_as_reconciles_start() {
        let mut clock = Clock::default();
        let now = Instant::now();
        asked(&mut clock, 1000);
        let first = hand_all(&mut clock, now);
        assert_eq!(first.len(), HANDED_AT_ONCE);
        assert_eq!(&*first[0], "shop/b0", "in the order asked");
        // Two start: two more are handed, the next in order.
        for name in &first[..2] {
            assert!(clock.started(name));
        }
        let more = hand_all(&mut clock, now);
        assert_eq!(more.len(), 2);
        assert_eq!(&*more[0], format!("shop/b{HANDED_AT_ONCE}"));
    }

    #[test]
    fn asked_budgets_go_before_due_polls_and_once_each() {
        let mut clock = Clock::default();
        let now = Instant::now();
        clock.schedule("shop/polled", now);
        clock.ask("shop/changed");
        clock.ask("shop/changed");
        // Asked while its poll is due: handed once.
        clock.ask("shop/polled");
        let handed = hand_all(&mut clock, now);
        let handed: Vec<&str> = handed.iter().map(|name| &**name).collect();
        assert_eq!(handed, ["shop/changed", "shop/polled"]);
        // Asked again before its reconcile started: it is still waiting to start, which reads
        // the change.
        clock.ask("shop/changed");
        assert_eq!(clock.next(now), Next::Wait(None));
        // Asked after it started: handed again.
        assert!(clock.started("shop/changed"));
        clock.ask("shop/changed");
        assert_eq!(clock.next(now), Next::Hand("shop/changed".into()));
    }

    #[test]
    fn a_budget_handed_and_never_started_gives_its_room_back() {
        let mut clock = Clock::default();
        let now = Instant::now();
        asked(&mut clock, HANDED_AT_ONCE + 1);
        assert_eq!(hand_all(&mut clock, now).len(), HANDED_AT_ONCE);
        let until = now + HANDED_FOR_AT_MOST;
        assert_eq!(clock.next(now), Next::Wait(Some(until)));
        assert_eq!(
            clock.next(until),
            Next::Hand(format!("shop/b{HANDED_AT_ONCE}").into())
        );
    }

    #[test]
    fn the_queue_of_asked_budgets_gives_back_a_crowds_room() {
        let mut clock = Clock::default();
        let now = Instant::now();
        asked(&mut clock, 20_000);
        assert!(clock.asked.capacity() >= 20_000);
        loop {
            let handed = hand_all(&mut clock, now);
            if handed.is_empty() {
                break;
            }
            for name in handed {
                clock.started(&name);
            }
        }
        assert!(
            clock.asked.capacity() <= ASKED_ROOM_KEPT,
            "{}",
            clock.asked.capacity()
        );
        assert!(clock.asked_once.capacity() <= ASKED_ROOM_KEPT);
        assert!(clock.handed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_budget_is_dropped_and_the_stream_hands_as_reconciles_start() {
        let polls = Polls::default();
        for budget in 0..HANDED_AT_ONCE + 2 {
            polls.ask(&format!("shop/b{budget}"));
        }
        polls.ask("shop/deleted");
        let names: Vec<String> = (0..HANDED_AT_ONCE + 2)
            .map(|budget| format!("shop/b{budget}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut due = Box::pin(due_of(&polls, &names));
        let mut seen = Vec::new();
        for _ in 0..HANDED_AT_ONCE {
            seen.push(due.next().await.expect("a budget").name);
        }
        // Full: nothing more until a reconcile starts.
        let waiting = tokio::time::timeout(Duration::from_secs(1), due.next()).await;
        assert!(waiting.is_err(), "handed beyond the limit");
        polls.started("shop/b0");
        polls.started("shop/b1");
        seen.push(due.next().await.expect("a budget").name);
        seen.push(due.next().await.expect("a budget").name);
        assert_eq!(seen.len(), HANDED_AT_ONCE + 2);
        // The deleted budget is not handed, and holds no room.
        polls.started("shop/b2");
        let after = tokio::time::timeout(Duration::from_secs(1), due.next()).await;
        assert!(after.is_err(), "nothing else was asked");
        assert!(!seen.iter().any(|name| name == "deleted"));
        assert_eq!(polls.handed(), HANDED_AT_ONCE - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_handed_before_the_budget_cache_has_listed() {
        let polls = Polls::default();
        let (store, mut writer) = reflector::store();
        let (mark, listed) = listed();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(budget("shop/orders")));
        // The list's triggers arrive as it goes, before the cache shows any of it.
        polls.ask("shop/orders");
        let mut due = Box::pin(polls.due(store, listed));
        let early = tokio::time::timeout(Duration::from_secs(5), due.next()).await;
        assert!(early.is_err(), "handed before the list was done");
        writer.apply_watcher_event(&watcher::Event::InitDone);
        mark.mark();
        let budget = tokio::time::timeout(Duration::from_secs(5), due.next())
            .await
            .expect("handed once the list was done")
            .expect("a budget");
        assert_eq!(names(&[budget]), ["shop/orders"]);
    }
}
