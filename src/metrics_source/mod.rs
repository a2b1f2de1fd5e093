//! Where the operator reads metrics: a small trait in front of Prometheus, with the cache that
//! evaluates an expression once per poll however many budgets ask for it.

pub mod allowlist;
pub mod grouping;
pub mod prometheus;
pub mod wake;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The clock tests can pause and advance.
use tokio::time::Instant;

use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore, broadcast};

use crate::core::metric_input::Observation;
use wake::{Groups, Interested, by_value};

pub use allowlist::{Allowlist, AllowlistError, Refused};
pub use grouping::{Grouped, NotGroupable};

/// A future returned by a backend; boxed so the trait stays object-safe for tests.
pub type QueryFuture = Pin<Box<dyn Future<Output = Observation> + Send + 'static>>;

/// One value per series, named by a label: `Err` says why there is none.
pub type Labelled = Result<Vec<(String, f64)>, String>;
pub type LabelledFuture = Pin<Box<dyn Future<Output = Labelled> + Send + 'static>>;

/// Evaluates one instant PromQL query.
pub trait QueryBackend: Send + Sync {
    /// Evaluates `expression` against the server at `address`, giving up after `timeout`.
    fn instant(&self, address: &str, expression: &str, timeout: Duration) -> QueryFuture;

    /// The same, keeping each series' `label` (series without it are named by position).
    fn instant_by_label(
        &self,
        address: &str,
        expression: &str,
        timeout: Duration,
        _label: &str,
    ) -> LabelledFuture {
        let answer = self.instant(address, expression, timeout);
        Box::pin(async move {
            match answer.await {
                Observation::Samples(values) => Ok(values
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), v))
                    .collect()),
                Observation::Failed(reason) => Err(reason),
            }
        })
    }

    /// The series of a grouped evaluation that carry `label`, named by its value; series
    /// without it belong to no budget and are left out.
    fn instant_grouped(
        &self,
        address: &str,
        expression: &str,
        timeout: Duration,
        label: &str,
    ) -> LabelledFuture {
        self.instant_by_label(address, expression, timeout, label)
    }
}

/// What is cached per (server, expression): when it was asked and the (pending) answer.
struct Entry<T> {
    asked: Instant,
    answer: Arc<OnceCell<T>>,
}

/// Who asks a query, and how often they need a fresh answer.
#[derive(Clone, Copy, Debug)]
pub struct Asking<'a> {
    /// Named in wakes (`namespace/name` of a budget).
    pub asker: &'a str,
    /// The asker's poll: an answer shared by a group is renewed once per `every` and wakes
    /// the askers whose value changed; any other is shared for half of it.
    pub every: Duration,
}

/// An expression's grouped form, or why it has none.
pub type Grouping = Result<Grouped, Arc<NotGroupable>>;

/// Observer of query latencies (the operator's own metrics).
pub trait QueryObserver: Send + Sync {
    fn observe(&self, seconds: f64, failed: bool);
}

/// The answers by (server, expression), and when entries older than [`FORGET_AFTER`] were last
/// dropped: sweeping on a schedule keeps each lookup O(1) however many budgets ask.
struct Answers {
    entries: HashMap<(String, String), Entry<Observation>>,
    /// Grouped evaluations by (server, shared expression).
    grouped: HashMap<(String, String), Entry<Groups>>,
    /// The shared forms that read back the same ([`grouping::reads_back_the_same`]), each
    /// held once however many budgets share it, with when it was last asked (seconds after
    /// the cache began).
    shared_texts: HashMap<Arc<str>, u32>,
    /// Who reads which value of each grouped answer.
    interested: Interested,
    swept: Instant,
    /// When the cache began: the shared forms' times count from it.
    started: Instant,
}

impl Answers {
    /// Seconds since the cache began.
    fn clock(&self) -> u32 {
        u32::try_from(self.started.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    /// The one copy of `shared`, marked as asked now, if it is known to read back the same.
    fn remember_shared(&mut self, shared: &str) -> Option<Arc<str>> {
        let now = self.clock();
        let (known, asked) = self.shared_texts.get_key_value(shared)?;
        let known = Arc::clone(known);
        if *asked != now {
            self.shared_texts.insert(Arc::clone(&known), now);
        }
        Some(known)
    }
}

/// Wakes that are not taken up in time are dropped (the askers poll anyway).
const WAKES_BUFFERED: usize = 4096;

/// Queries with a timeout, bounded concurrency per server and sharing: identical expressions
/// asked within `max_age` of each other (also while the first is in flight) are evaluated once.
pub struct MetricsSource {
    backend: Arc<dyn QueryBackend>,
    /// Servers that may be queried at all; any other address is refused before a request.
    allowlist: Allowlist,
    answers: Mutex<Answers>,
    /// Queries in flight at once, per server: one slow Prometheus does not hold the slots of
    /// the budgets that read another.
    concurrency: usize,
    limiters: Mutex<HashMap<String, Arc<Semaphore>>>,
    timeout: Duration,
    observer: Option<Arc<dyn QueryObserver>>,
    /// The askers a renewed grouped answer concerns.
    wakes: broadcast::Sender<String>,
}

/// Why a query was not asked: nobody named a Prometheus.
pub const NO_PROMETHEUS: &str =
    "no Prometheus: set spec.prometheus.address or start the operator with --prometheus-url";

/// Entries older than this are dropped whatever the callers' max age.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How often old entries are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl MetricsSource {
    pub fn new(backend: Arc<dyn QueryBackend>, concurrency: usize, timeout: Duration) -> Self {
        Self {
            backend,
            allowlist: Allowlist::any(),
            answers: Mutex::new(Answers {
                entries: HashMap::new(),
                grouped: HashMap::new(),
                shared_texts: HashMap::new(),
                interested: Interested::default(),
                swept: Instant::now(),
                started: Instant::now(),
            }),
            concurrency: concurrency.max(1),
            limiters: Mutex::new(HashMap::new()),
            timeout,
            observer: None,
            wakes: broadcast::channel(WAKES_BUFFERED).0,
        }
    }

    /// The askers (as given in [`Asking::asker`]) whose value of a grouped answer changed at
    /// its renewal, from now on.
    pub fn wakes(&self) -> broadcast::Receiver<String> {
        self.wakes.subscribe()
    }

    pub fn with_observer(mut self, observer: Arc<dyn QueryObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Queries only the servers of `allowlist`.
    pub fn with_allowlist(mut self, allowlist: Allowlist) -> Self {
        self.allowlist = allowlist;
        self
    }

    /// Whether `address` may be queried, or why not (naming `spec.prometheus.address`).
    pub fn permits(&self, address: &str) -> Result<(), Refused> {
        self.allowlist.check(address)
    }

    /// The result of `expression` at `address`, evaluated now or reused if asked less than
    /// `max_age` ago. An address outside the allowlist is a failed query, and no request is
    /// sent.
    pub async fn query(&self, address: &str, expression: &str, max_age: Duration) -> Observation {
        self.query_within(address, expression, max_age, self.timeout)
            .await
    }

    /// Like [`query`](Self::query), taking at most `patience` in all, the wait for a slot
    /// included.
    async fn query_within(
        &self,
        address: &str,
        expression: &str,
        max_age: Duration,
        patience: Duration,
    ) -> Observation {
        if let Err(refused) = self.permits(address) {
            return Observation::Failed(refused.to_string());
        }
        let answer = self.entry(address, expression, max_age);
        answer
            .get_or_init(|| async {
                let started = Instant::now();
                let observation = match self.slot(address, started, patience).await {
                    Ok((_slot, timeout)) => {
                        self.backend.instant(address, expression, timeout).await
                    }
                    Err(reason) => Observation::Failed(reason),
                };
                self.observed(started, matches!(observation, Observation::Failed(_)));
                observation
            })
            .await
            .clone()
    }

    /// The result of `expression` at the server the budget resolved to (without one it
    /// fails with [`NO_PROMETHEUS`]), within the asker's poll. With `group_by`, an expression
    /// that differs from other budgets' only in that label's value is answered from one
    /// grouped evaluation for all of them ([`grouping`]), renewed once per [`Asking::every`], and any other is
    /// evaluated alone (shared for half of it).
    pub async fn query_for(
        &self,
        address: Option<&str>,
        expression: &str,
        group_by: Option<&str>,
        asking: Asking<'_>,
    ) -> Observation {
        let grouping = group_by.map(|label| (label, self.grouping(expression, label)));
        self.query_grouped(address, expression, grouping, asking)
            .await
    }

    /// [`query_for`](Self::query_for), with `expression`'s grouped form by the label already
    /// worked out ([`grouping`](Self::grouping)).
    pub async fn query_grouped(
        &self,
        address: Option<&str>,
        expression: &str,
        grouping: Option<(&str, Grouping)>,
        asking: Asking<'_>,
    ) -> Observation {
        let patience = self.patience(asking.every);
        let Some(address) = address else {
            return Observation::Failed(NO_PROMETHEUS.to_owned());
        };
        let Some((label, Ok(grouped))) = grouping.as_ref().map(|(l, g)| (*l, g.as_ref())) else {
            return self
                .query_within(address, expression, asking.every / 2, patience)
                .await;
        };
        if let Err(refused) = self.permits(address) {
            return Observation::Failed(refused.to_string());
        }
        let (answer, previous) = {
            let mut answers = self.answers();
            answers
                .interested
                .note(address, label, &grouped.value, asking.asker);
            current(&mut answers.grouped, address, &grouped.shared, asking.every)
        };
        let groups = answer
            .get_or_init(|| async {
                let started = Instant::now();
                let groups = match self.slot(address, started, patience).await {
                    Ok((_slot, timeout)) => self
                        .backend
                        .instant_grouped(address, &grouped.shared, timeout, label)
                        .await
                        .map(by_value),
                    Err(reason) => Err(reason),
                };
                self.observed(started, groups.is_err());
                if let Some(previous) = previous.as_ref().and_then(|p| p.get()) {
                    self.wake_changed(address, label, previous, &groups, asking.asker);
                }
                groups
            })
            .await;
        match groups {
            // No series of this value is missing data, as an empty answer of its own would be.
            Ok(groups) => Observation::Samples(groups.samples_of(&grouped.value)),
            Err(reason) => Observation::Failed(reason.clone()),
        }
    }

    /// Wakes the askers of the values a renewed answer grouped by `label` changed, but
    /// `renewed_by`, who reads it now.
    fn wake_changed(
        &self,
        address: &str,
        label: &str,
        previous: &Groups,
        next: &Groups,
        renewed_by: &str,
    ) {
        let values = wake::changed(previous, next);
        if values.as_ref().is_some_and(Vec::is_empty) {
            return;
        }
        let askers = self
            .answers()
            .interested
            .askers_of(address, label, values.as_deref());
        for asker in askers.into_iter().filter(|asker| asker != renewed_by) {
            // Nobody listening (no budget controller) is fine.
            let _ = self.wakes.send(asker);
        }
    }

    /// Whether `expression` can share a grouped evaluation by `label`.
    ///
    /// Worked out at each ask, not remembered per expression: every budget's expressions
    /// differ in a label value, so such a cache held three entries a budget (about 330 bytes
    /// at thousands of budgets) to spare a parse of a few microseconds a query. Only the
    /// shared forms are remembered, with the check that they read back the same.
    pub fn grouping(&self, expression: &str, label: &str) -> Grouping {
        let (shared, value) = grouping::rewritten(expression, label).map_err(Arc::new)?;
        if let Some(known) = self.answers().remember_shared(&shared) {
            return Ok(Grouped {
                shared: known,
                value,
            });
        }
        if !grouping::reads_back_the_same(&shared) {
            return Err(Arc::new(NotGroupable::NotFaithful));
        }
        let mut answers = self.answers();
        let now = answers.clock();
        let shared: Arc<str> = shared.into();
        let shared = match answers.shared_texts.get_key_value(&shared) {
            Some((known, _)) => Arc::clone(known),
            None => shared,
        };
        answers.shared_texts.insert(Arc::clone(&shared), now);
        Ok(Grouped { shared, value })
    }

    fn observed(&self, started: Instant, failed: bool) {
        if let Some(observer) = &self.observer {
            observer.observe(started.elapsed().as_secs_f64(), failed);
        }
    }

    /// How long a budget's query may take in all, the wait for a slot included: its poll (an
    /// answer that comes after the next poll began is of no use), at least the query timeout.
    /// (The query timeout alone was tried as the bound: at a thousand ungrouped budgets the
    /// slots are busy for seconds, and steady budgets turned MetricsUnavailable although the
    /// server answered.)
    fn patience(&self, every: Duration) -> Duration {
        every.max(self.timeout)
    }

    /// One of `address`'s query slots, once free, if that is within `patience` of `started`,
    /// with the time the query may then take: what is left of `patience`, at most the query
    /// timeout.
    async fn slot(
        &self,
        address: &str,
        started: Instant,
        patience: Duration,
    ) -> Result<(OwnedSemaphorePermit, Duration), String> {
        let deadline = started + patience;
        match tokio::time::timeout_at(deadline, self.limiter(address).acquire_owned()).await {
            Ok(Ok(slot)) => Ok((
                slot,
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(self.timeout),
            )),
            Ok(Err(_)) => Err("query limiter closed".to_owned()),
            Err(_) => Err(format!(
                "no query slot for {address} within {:.0}s: all {} were busy (--query-concurrency); \
                 share queries with metrics.groupBy, or raise it",
                patience.as_secs_f64(),
                self.concurrency
            )),
        }
    }

    /// The slots of `address`, created on first use (the allowlist bounds the addresses).
    fn limiter(&self, address: &str) -> Arc<Semaphore> {
        let mut limiters = self
            .limiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Looked up before inserting: a query is no reason to allocate the address again.
        if let Some(limiter) = limiters.get(address) {
            return Arc::clone(limiter);
        }
        let limiter = Arc::new(Semaphore::new(self.concurrency));
        limiters.insert(address.to_owned(), Arc::clone(&limiter));
        limiter
    }

    /// One value per series of `expression`, named by `label`; not cached (one budget asks
    /// it), but it waits for a permit like every query.
    pub async fn query_by_label(
        &self,
        address: Option<&str>,
        expression: &str,
        label: &str,
        every: Duration,
    ) -> Labelled {
        let Some(address) = address else {
            return Err(NO_PROMETHEUS.to_owned());
        };
        self.permits(address)
            .map_err(|refused| refused.to_string())?;
        let started = Instant::now();
        let answer = match self.slot(address, started, self.patience(every)).await {
            Ok((_slot, timeout)) => {
                self.backend
                    .instant_by_label(address, expression, timeout, label)
                    .await
            }
            Err(reason) => Err(reason),
        };
        // Counted in the operator's query metrics like every other query.
        self.observed(started, answer.is_err());
        answer
    }

    fn entry(
        &self,
        address: &str,
        expression: &str,
        max_age: Duration,
    ) -> Arc<OnceCell<Observation>> {
        current(&mut self.answers().entries, address, expression, max_age).0
    }

    /// The cache, swept of old entries when a sweep is due.
    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        // A poisoned lock only means another query panicked; the map itself is still usable.
        let mut answers = self
            .answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answers.swept.elapsed() >= SWEEP_EVERY {
            answers
                .entries
                .retain(|_, entry| entry.asked.elapsed() < FORGET_AFTER);
            answers
                .grouped
                .retain(|_, entry| entry.asked.elapsed() < FORGET_AFTER);
            let now = answers.clock();
            let forget_after = u32::try_from(FORGET_AFTER.as_secs()).unwrap_or(u32::MAX);
            answers
                .shared_texts
                .retain(|_, asked| now.saturating_sub(*asked) < forget_after);
            answers.interested.forget_older_than(FORGET_AFTER);
            answers.swept = Instant::now();
        }
        answers
    }
}

/// The entry of (`address`, `expression`) if asked within `max_age`, otherwise a new one and
/// the answer it replaces.
fn current<T>(
    entries: &mut HashMap<(String, String), Entry<T>>,
    address: &str,
    expression: &str,
    max_age: Duration,
) -> (Arc<OnceCell<T>>, Option<Arc<OnceCell<T>>>) {
    let key = (address.to_owned(), expression.to_owned());
    match entries.get(&key) {
        Some(entry) if entry.asked.elapsed() <= max_age => (Arc::clone(&entry.answer), None),
        _ => {
            let answer = Arc::new(OnceCell::new());
            let replaced = entries.insert(
                key,
                Entry {
                    asked: Instant::now(),
                    answer: Arc::clone(&answer),
                },
            );
            (answer, replaced.map(|entry| entry.answer))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Counting {
        calls: AtomicUsize,
    }

    impl QueryBackend for Counting {
        fn instant(&self, _: &str, expression: &str, _: Duration) -> QueryFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let value = expression.len() as f64;
            Box::pin(async move {
                tokio::task::yield_now().await;
                Observation::Samples(vec![value])
            })
        }
    }

    #[test]
    fn budgets_sharing_a_grouped_expression_hold_one_copy_of_it() {
        let source = MetricsSource::new(
            Arc::new(Counting {
                calls: AtomicUsize::new(0),
            }),
            1,
            Duration::from_secs(1),
        );
        let grouped = |group: &str| {
            let grouping = source.grouping(&format!(r#"sum(lag{{group="{group}"}})"#), "group");
            match &grouping {
                Ok(grouped) => grouped.clone(),
                Err(reason) => panic!("groupable: {reason}"),
            }
        };
        let (orders, billing) = (grouped("orders"), grouped("billing"));
        assert_eq!((&*orders.value, &*billing.value), ("orders", "billing"));
        assert!(Arc::ptr_eq(&orders.shared, &billing.shared));
    }

    #[tokio::test]
    async fn identical_expressions_are_evaluated_once_per_poll() {
        let backend = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1));
        let poll = Duration::from_secs(60);
        let (a, b) = tokio::join!(
            source.query("http://p", "sum(lag)", poll),
            source.query("http://p", "sum(lag)", poll)
        );
        assert_eq!(a, b);
        let _ = source.query("http://p", "sum(lag)", poll).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        let _ = source.query("http://other", "sum(lag)", poll).await;
        let _ = source.query("http://p", "max(age)", poll).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 3);
        let _ = source.query("http://p", "sum(lag)", Duration::ZERO).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 4);
    }

    /// Answers after `delay`, and records the time each query was given.
    struct Slow {
        delay: Duration,
        given: Mutex<Vec<Duration>>,
    }

    impl QueryBackend for Slow {
        fn instant(&self, _: &str, _: &str, timeout: Duration) -> QueryFuture {
            self.given
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(timeout);
            let delay = self.delay;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Observation::Samples(vec![1.0])
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_server_has_its_own_query_slots() {
        let backend = Arc::new(Slow {
            delay: Duration::from_secs(3),
            given: Mutex::new(Vec::new()),
        });
        // One slot per server, a server that takes 3 s.
        let source = MetricsSource::new(backend.clone(), 1, Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let elsewhere_done = async {
            let answer = source.query("http://other", "a", Duration::ZERO).await;
            (answer, started.elapsed())
        };
        let (first, second, (elsewhere, elsewhere_after)) = tokio::join!(
            source.query("http://slow", "a", Duration::ZERO),
            source.query("http://slow", "b", Duration::ZERO),
            elsewhere_done,
        );
        assert_eq!(first, Observation::Samples(vec![1.0]));
        assert_eq!(second, Observation::Samples(vec![1.0]));
        assert_eq!(elsewhere, Observation::Samples(vec![1.0]));
        // The other server's query did not wait for the slow one's slot; the slow server's
        // second query did, and the wait counted against its timeout.
        assert_eq!(elsewhere_after, Duration::from_secs(3));
        assert_eq!(started.elapsed(), Duration::from_secs(6));
        let mut given = backend
            .given
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        given.sort();
        assert_eq!(
            given,
            [2, 5, 5].map(Duration::from_secs),
            "3 s of the second query's 5 s went to waiting"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_waits_for_a_slot_at_most_its_poll_and_is_told_why() {
        // A server that holds the only slot longer than the second budget can wait.
        let backend = Arc::new(Slow {
            delay: Duration::from_secs(45),
            given: Mutex::new(Vec::new()),
        });
        let source = MetricsSource::new(backend.clone(), 1, Duration::from_secs(30));
        let every = Duration::from_secs(15);
        let asking = |asker| Asking { asker, every };
        let started = tokio::time::Instant::now();
        let (first, second) = tokio::join!(
            source.query_for(Some("http://p"), "a", None, asking("shop/a")),
            async {
                // Asked once the first holds the only slot.
                tokio::task::yield_now().await;
                let answer = source
                    .query_for(Some("http://p"), "b", None, asking("shop/b"))
                    .await;
                (answer, started.elapsed())
            },
        );
        // The first had the whole 30 s query timeout (its poll is shorter).
        assert_eq!(first, Observation::Samples(vec![1.0]));
        let (second, failed_after) = second;
        assert_eq!(failed_after, Duration::from_secs(30));
        let Observation::Failed(reason) = second else {
            panic!("a query that never got a slot fails: {second:?}");
        };
        assert!(
            reason.contains("no query slot for http://p within 30s")
                && reason.contains("--query-concurrency"),
            "{reason}"
        );
        assert_eq!(*backend.given.lock().unwrap(), [Duration::from_secs(30)]);
    }

    /// Answers a grouped expression with one series per consumer group; counts the calls.
    struct Groups {
        calls: AtomicUsize,
    }

    impl QueryBackend for Groups {
        fn instant(&self, _: &str, _: &str, _: Duration) -> QueryFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Observation::Samples(vec![7.0]) })
        }

        fn instant_grouped(
            &self,
            _: &str,
            expression: &str,
            _: Duration,
            label: &str,
        ) -> LabelledFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = if expression.contains("broken") {
                Err("bad_data: broken".to_owned())
            } else {
                assert!(
                    expression.contains(&format!("by ({label})")),
                    "{expression}"
                );
                Ok(vec![
                    ("orders".to_owned(), 10.0),
                    ("billing".to_owned(), 20.0),
                ])
            };
            Box::pin(async move { answer })
        }
    }

    fn asking(every: Duration) -> Asking<'static> {
        Asking {
            asker: "shop/orders",
            every,
        }
    }

    #[tokio::test]
    async fn budgets_that_differ_in_the_group_label_share_one_evaluation() {
        let backend = Arc::new(Groups {
            calls: AtomicUsize::new(0),
        });
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1));
        let poll = Duration::from_secs(60);
        let ask = |group: &'static str| {
            let expression = format!("sum(lag{{consumergroup=\"{group}\"}})");
            let source = &source;
            async move {
                source
                    .query_for(
                        Some("http://p"),
                        &expression,
                        Some("consumergroup"),
                        asking(poll),
                    )
                    .await
            }
        };
        let (orders, billing, shipping) =
            tokio::join!(ask("orders"), ask("billing"), ask("shipping"));
        assert_eq!(orders, Observation::Samples(vec![10.0]));
        assert_eq!(billing, Observation::Samples(vec![20.0]));
        // A value with no series is missing data, never zero.
        assert_eq!(shipping, Observation::Samples(vec![]));
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        // An expression that cannot be grouped is asked as it is.
        let alone = source
            .query_for(
                Some("http://p"),
                "sum(lag{consumergroup=~\"o.*\"})",
                Some("consumergroup"),
                asking(poll),
            )
            .await;
        assert_eq!(alone, Observation::Samples(vec![7.0]));
        // A failed grouped evaluation fails every budget that shares it, with its reason.
        let failed = source
            .query_for(
                Some("http://p"),
                "sum(broken{consumergroup=\"orders\"})",
                Some("consumergroup"),
                asking(poll),
            )
            .await;
        assert_eq!(failed, Observation::Failed("bad_data: broken".to_owned()));
        assert_eq!(backend.calls.load(Ordering::SeqCst), 3);
        // Without a server, nothing is asked.
        let nowhere = source
            .query_for(
                None,
                "sum(lag{consumergroup=\"orders\"})",
                Some("consumergroup"),
                asking(poll),
            )
            .await;
        assert_eq!(nowhere, Observation::Failed(NO_PROMETHEUS.to_owned()));
    }

    #[tokio::test]
    async fn an_address_outside_the_allowlist_is_never_asked() {
        let backend = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let allowlist = Allowlist::new(&[], Some("http://p:9090")).unwrap();
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1))
            .with_allowlist(allowlist);
        let refused = source
            .query("http://169.254.169.254", "up", Duration::ZERO)
            .await;
        let Observation::Failed(reason) = refused else {
            panic!("refused addresses fail: {refused:?}");
        };
        assert!(reason.contains("spec.prometheus.address http://169.254.169.254"));
        assert_eq!(backend.calls.load(Ordering::SeqCst), 0);
        let _ = source.query("http://p:9090", "up", Duration::ZERO).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
    }

    /// A grouped backend whose `billing` value is whatever the test last set.
    struct Moving {
        calls: AtomicUsize,
        billing: Mutex<f64>,
    }

    impl QueryBackend for Moving {
        fn instant(&self, _: &str, _: &str, _: Duration) -> QueryFuture {
            Box::pin(async { Observation::Failed("grouped only".to_owned()) })
        }

        fn instant_grouped(&self, _: &str, _: &str, _: Duration, _: &str) -> LabelledFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let billing = *self.billing.lock().unwrap();
            Box::pin(async move {
                Ok(vec![
                    ("orders".to_owned(), 1.0),
                    ("billing".to_owned(), billing),
                ])
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_grouped_answer_is_renewed_once_per_poll_and_wakes_whose_value_moved() {
        let backend = Arc::new(Moving {
            calls: AtomicUsize::new(0),
            billing: Mutex::new(2.0),
        });
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1));
        let mut wakes = source.wakes();
        let poll = Duration::from_secs(15);
        let ask = |asker: &'static str, group: &'static str| {
            let expression = format!("sum(lag{{consumergroup=\"{group}\"}})");
            let source = &source;
            async move {
                let asking = Asking { asker, every: poll };
                source
                    .query_for(Some("http://p"), &expression, Some("consumergroup"), asking)
                    .await
            }
        };
        assert_eq!(
            ask("shop/orders", "orders").await,
            Observation::Samples(vec![1.0])
        );
        assert_eq!(
            ask("shop/billing", "billing").await,
            Observation::Samples(vec![2.0])
        );
        // Within the poll the answer is shared, however late in it a budget asks.
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(
            ask("shop/billing", "billing").await,
            Observation::Samples(vec![2.0])
        );
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        // Renewed by the orders budget: billing moved, so its budget is woken; orders did not.
        *backend.billing.lock().unwrap() = 7.0;
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            ask("shop/orders", "orders").await,
            Observation::Samples(vec![1.0])
        );
        assert_eq!(backend.calls.load(Ordering::SeqCst), 2);
        assert_eq!(wakes.try_recv().ok().as_deref(), Some("shop/billing"));
        assert!(wakes.try_recv().is_err());
        assert_eq!(
            ask("shop/billing", "billing").await,
            Observation::Samples(vec![7.0])
        );
        // A renewal that changes nothing wakes nobody.
        tokio::time::advance(Duration::from_secs(16)).await;
        let _ = ask("shop/billing", "billing").await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 3);
        assert!(wakes.try_recv().is_err());
    }
}
