//! Who reads which value of a grouped answer, so that a fresh evaluation wakes exactly the
//! askers whose value changed.
//!
//! A grouped answer is evaluated at most once per poll for all the budgets that share it, and
//! each budget polls at its own moment. Without a wake, a budget could read an answer just
//! before it was renewed and act on a change almost two polls after Prometheus showed it; with
//! it, the budgets whose value moved look again as soon as the evaluation that shows it is in.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// A grouped answer's samples by value of the group label, or why there is none.
pub type Groups = Result<ByValue, String>;

/// A grouped answer's samples by value: every value's text in one string, and one 16-byte
/// entry per sample, sorted by value (a value's samples in the order of the answer), looked
/// up by binary search. An answer is kept for a poll, three of them with every budget's
/// value at thousands of budgets: a map of boxed values and sample lists took about 170 bytes
/// a budget.
#[derive(Clone, Debug, Default)]
pub struct ByValue {
    values: Box<str>,
    samples: Box<[Sample]>,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    /// The value's text in [`ByValue::values`].
    at: u32,
    len: u32,
    sample: f64,
}

/// The value text `at` and `len` name in `values`.
fn text_at(values: &str, at: u32, len: u32) -> Option<&str> {
    let at = at as usize;
    values.get(at..at + len as usize)
}

impl ByValue {
    fn value_of(&self, sample: &Sample) -> &str {
        text_at(&self.values, sample.at, sample.len).unwrap_or_default()
    }

    /// The samples of `value`, in the order of the answer (none: no series has it).
    fn get(&self, value: &str) -> &[Sample] {
        let from = self
            .samples
            .partition_point(|sample| self.value_of(sample) < value);
        let to =
            from + self.samples[from..].partition_point(|sample| self.value_of(sample) == value);
        &self.samples[from..to]
    }

    /// The samples of `value` as numbers.
    pub fn samples_of(&self, value: &str) -> Vec<f64> {
        self.get(value).iter().map(|sample| sample.sample).collect()
    }

    /// Every value, once, in order.
    fn values(&self) -> impl Iterator<Item = &str> {
        let mut last = None;
        self.samples.iter().filter_map(move |sample| {
            let value = self.value_of(sample);
            (last != Some(value)).then(|| {
                last = Some(value);
                value
            })
        })
    }

    /// Whether `value` has the same samples in both, bit for bit: a series that reads NaN in
    /// two answers has not moved, and must not wake its askers at every renewal.
    fn same_for(&self, other: &ByValue, value: &str) -> bool {
        let (mine, theirs) = (self.get(value), other.get(value));
        mine.len() == theirs.len()
            && mine
                .iter()
                .zip(theirs)
                .all(|(a, b)| a.sample.to_bits() == b.sample.to_bits())
    }

    /// How many distinct values.
    pub fn len(&self) -> usize {
        self.values().count()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// A grouped answer's samples by value, each value's samples in the order of the answer.
pub fn by_value(mut series: Vec<(String, f64)>) -> ByValue {
    // Stable: a value's samples keep their order.
    series.sort_by(|(a, _), (b, _)| a.cmp(b));
    let mut values = String::new();
    let mut samples: Vec<Sample> = Vec::with_capacity(series.len());
    for (value, sample) in series {
        let (at, len) = match samples.last() {
            Some(last) if text_at(&values, last.at, last.len) == Some(value.as_str()) => {
                (last.at, last.len)
            }
            _ => {
                let at = values.len();
                values.push_str(&value);
                // An answer's values are label values of a few hundred bytes at most; one of
                // 4 GiB in all is cut off rather than misread.
                match (u32::try_from(at), u32::try_from(value.len())) {
                    (Ok(at), Ok(len)) => (at, len),
                    _ => break,
                }
            }
        };
        samples.push(Sample { at, len, sample });
    }
    ByValue {
        values: values.into_boxed_str(),
        samples: samples.into_boxed_slice(),
    }
}

/// The askers of each value of a group label, by (server, label), with when each last asked
/// (askers that stopped asking are forgotten).
///
/// Kept by label, not by grouped expression: a budget reads the same value of each of its
/// grouped queries, and all of them group by its one `metrics.groupBy` label, so one entry
/// per budget stands for all of its answers instead of one per answer. A renewed answer then
/// also wakes an asker of the same value that reads another expression grouped by the same
/// label: a poll of that budget sooner than due, never a missed one.
#[derive(Default)]
pub struct Interested {
    askers: HashMap<(String, String), HashMap<Box<str>, Askers>>,
    /// Each asker's name once, however many values it reads.
    names: HashSet<Arc<str>>,
    /// When the askers began: their times count from it, in seconds.
    started: Option<Instant>,
}

/// One asker of a value, and when it last asked (seconds after [`Interested::started`]).
#[derive(Debug)]
struct Asker {
    name: Arc<str>,
    asked: u32,
}

/// The askers of one value: almost always one budget, so it is held as it is, without a list
/// (at thousands of budgets a map per value was a kilobyte per budget, a list half of that).
#[derive(Debug)]
enum Askers {
    One(Asker),
    Many(Vec<Asker>),
}

impl Askers {
    fn as_slice(&self) -> &[Asker] {
        match self {
            Askers::One(asker) => std::slice::from_ref(asker),
            Askers::Many(askers) => askers,
        }
    }

    fn note(&mut self, name: &str, now: u32, intern: impl FnOnce() -> Arc<str>) {
        match self {
            Askers::One(asker) if &*asker.name == name => asker.asked = now,
            Askers::Many(askers) => match askers.iter_mut().find(|a| &*a.name == name) {
                Some(asker) => asker.asked = now,
                None => askers.push(Asker {
                    name: intern(),
                    asked: now,
                }),
            },
            Askers::One(_) => {
                let Askers::One(first) = std::mem::replace(self, Askers::Many(Vec::new())) else {
                    return;
                };
                *self = Askers::Many(vec![
                    first,
                    Asker {
                        name: intern(),
                        asked: now,
                    },
                ]);
            }
        }
    }

    /// Keeps the askers that asked after `since`; false when none is left.
    fn retain_asked_after(&mut self, since: u32) -> bool {
        match self {
            Askers::One(asker) => asker.asked > since,
            Askers::Many(askers) => {
                askers.retain(|asker| asker.asked > since);
                !askers.is_empty()
            }
        }
    }
}

fn intern(names: &mut HashSet<Arc<str>>, name: &str) -> Arc<str> {
    match names.get(name) {
        Some(known) => Arc::clone(known),
        None => {
            let name: Arc<str> = name.into();
            names.insert(Arc::clone(&name));
            name
        }
    }
}

impl Interested {
    /// Seconds since the first asker, counting from 1 (0 is before any).
    fn clock(&mut self) -> u32 {
        let started = *self.started.get_or_insert_with(Instant::now);
        u32::try_from(started.elapsed().as_secs())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }

    /// `asker` reads `value` of an answer from `address` grouped by `label`.
    pub fn note(&mut self, address: &str, label: &str, value: &str, asker: &str) {
        let now = self.clock();
        // Looked up before inserting: the steady case allocates nothing.
        let values = match self.askers.get_mut(&(address.to_owned(), label.to_owned())) {
            Some(values) => values,
            None => self
                .askers
                .entry((address.to_owned(), label.to_owned()))
                .or_default(),
        };
        let names = &mut self.names;
        match values.get_mut(value) {
            Some(askers) => askers.note(asker, now, || intern(names, asker)),
            None => {
                let first = Asker {
                    name: intern(names, asker),
                    asked: now,
                };
                values.insert(value.into(), Askers::One(first));
            }
        }
    }

    /// The askers of `values` (every value when `None`) of answers from `address` grouped by
    /// `label`.
    pub fn askers_of(&self, address: &str, label: &str, values: Option<&[String]>) -> Vec<String> {
        let Some(by_value) = self.askers.get(&(address.to_owned(), label.to_owned())) else {
            return Vec::new();
        };
        let mut askers = HashSet::new();
        match values {
            None => askers.extend(
                by_value
                    .values()
                    .flat_map(Askers::as_slice)
                    .map(|asker| &asker.name),
            ),
            Some(values) => {
                for value in values {
                    if let Some(of_value) = by_value.get(value.as_str()) {
                        askers.extend(of_value.as_slice().iter().map(|asker| &asker.name));
                    }
                }
            }
        }
        askers.into_iter().map(|name| name.to_string()).collect()
    }

    /// Forgets askers that have not asked for `age`.
    pub fn forget_older_than(&mut self, age: Duration) {
        let age = u32::try_from(age.as_secs()).unwrap_or(u32::MAX);
        let since = self.clock().saturating_sub(age);
        for values in self.askers.values_mut() {
            values.retain(|_, askers| askers.retain_asked_after(since));
            // The room a start's burst of askers left goes back.
            values.shrink_to_fit();
        }
        self.askers.retain(|_, values| !values.is_empty());
        // A name only the set still holds is no asker's any more.
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.names.shrink_to_fit();
    }
}

/// Which values' askers a new answer concerns (pure): the values whose samples differ, or
/// every value (`None`) when the answer turned from failed to answered or back, or failed
/// differently.
pub fn changed(previous: &Groups, next: &Groups) -> Option<Vec<String>> {
    match (previous, next) {
        (Ok(previous), Ok(next)) => {
            let mut values: Vec<String> = previous
                .values()
                .chain(next.values())
                .filter(|value| !previous.same_for(next, value))
                .map(str::to_owned)
                .collect();
            values.sort();
            values.dedup();
            Some(values)
        }
        (Err(previous), Err(next)) if previous == next => Some(Vec::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(pairs: &[(&str, f64)]) -> Groups {
        Ok(by_value(
            pairs
                .iter()
                .map(|(value, sample)| ((*value).to_owned(), *sample))
                .collect(),
        ))
    }

    #[test]
    fn a_value_keeps_every_sample_in_order() {
        let groups = by_value(vec![
            ("orders".into(), 1.0),
            ("billing".into(), 2.0),
            ("orders".into(), 3.0),
            ("orders".into(), 4.0),
        ]);
        assert_eq!(groups.samples_of("orders"), [1.0, 3.0, 4.0]);
        assert_eq!(groups.samples_of("billing"), [2.0]);
        assert!(groups.samples_of("shipping").is_empty());
        assert_eq!(groups.len(), 2);
    }

    #[test]
    fn every_value_is_found_whatever_the_order_of_the_answer() {
        let values = ["b", "a", "", "é", "a-1", "A", "b"];
        let groups = by_value(
            values
                .iter()
                .enumerate()
                .map(|(at, value)| ((*value).to_owned(), at as f64))
                .collect(),
        );
        assert_eq!(groups.len(), 6);
        assert_eq!(groups.samples_of("b"), [0.0, 6.0]);
        for (at, value) in values.iter().enumerate().filter(|(_, v)| **v != "b") {
            assert_eq!(groups.samples_of(value), [at as f64], "{value}");
        }
        // A value that is a prefix of another, or sorts between two, is not confused.
        assert!(groups.samples_of("a-").is_empty() && groups.samples_of("c").is_empty());
        assert!(by_value(Vec::new()).is_empty());
    }

    proptest::proptest! {
        /// Against a map of lists: every value, present or not, reads its samples in order.
        #[test]
        fn an_answer_reads_as_a_map_of_lists(
            series in proptest::collection::vec(("[ab]{0,3}", -1e3f64..1e3), 0..40),
            probes in proptest::collection::vec("[abc]{0,3}", 0..10),
        ) {
            let mut model: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
            for (value, sample) in &series {
                model.entry(value.clone()).or_default().push(*sample);
            }
            let groups = by_value(series);
            proptest::prop_assert_eq!(groups.len(), model.len());
            proptest::prop_assert_eq!(groups.values().collect::<Vec<_>>(), model.keys().map(String::as_str).collect::<Vec<_>>());
            for value in model.keys().chain(&probes) {
                proptest::prop_assert_eq!(
                    groups.samples_of(value),
                    model.get(value).cloned().unwrap_or_default()
                );
            }
        }
    }

    #[test]
    fn only_values_whose_samples_moved_are_news() {
        let before = groups(&[("orders", 1.0), ("billing", 2.0), ("gone", 3.0)]);
        let after = groups(&[("orders", 1.0), ("billing", 5.0), ("new", 4.0)]);
        assert_eq!(
            changed(&before, &after),
            Some(vec!["billing".into(), "gone".into(), "new".into()])
        );
        assert_eq!(changed(&before, &before), Some(Vec::new()));
        // A series that reads NaN twice has not moved.
        let not_a_number = groups(&[("orders", f64::NAN)]);
        assert_eq!(changed(&not_a_number, &not_a_number), Some(Vec::new()));
        assert_eq!(changed(&before, &Err("down".into())), None);
        assert_eq!(changed(&Err("down".into()), &before), None);
        assert_eq!(
            changed(&Err("down".into()), &Err("down".into())),
            Some(Vec::new())
        );
    }

    #[test]
    fn askers_are_found_by_value_and_forgotten_when_they_stop() {
        let mut interested = Interested::default();
        interested.note("p", "g", "orders", "shop/orders");
        interested.note("p", "g", "orders", "shop/orders-copy");
        interested.note("p", "g", "billing", "shop/billing");
        let mut orders = interested.askers_of("p", "g", Some(&["orders".into()]));
        orders.sort();
        assert_eq!(orders, ["shop/orders", "shop/orders-copy"]);
        assert_eq!(interested.askers_of("p", "g", None).len(), 3);
        assert!(interested.askers_of("q", "g", None).is_empty());
        assert!(interested.askers_of("p", "h", None).is_empty());
        // One entry and one name per asker, however many answers grouped by its label it reads.
        interested.note("p", "g", "orders", "shop/orders");
        interested.note("p", "h", "orders", "shop/orders");
        assert_eq!(interested.names.len(), 3);
        assert_eq!(interested.askers_of("p", "g", None).len(), 3);
        assert_eq!(
            interested.askers_of("p", "h", Some(&["orders".into()])),
            ["shop/orders"]
        );
        // Asked within the age: kept.
        interested.forget_older_than(Duration::from_secs(600));
        assert_eq!(interested.askers_of("p", "g", None).len(), 3);
        interested.forget_older_than(Duration::ZERO);
        assert!(interested.askers_of("p", "g", None).is_empty());
        assert!(interested.names.is_empty());
    }
}
