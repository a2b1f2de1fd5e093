//! Each budget's series on `/metrics` (its phase, desired replicas and drain time), held as
//! one entry per budget and written out at each scrape.
//!
//! A metric family per series kept each budget three times over: a map entry, a copy of the
//! labels and an allocated gauge in each of three families (about 280 bytes a budget at
//! thousands of budgets). Here a budget is its `namespace/name` and three values.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// What one budget exports.
#[derive(Clone, Debug, PartialEq)]
struct Values {
    /// One of a handful of phase names, shared by every budget in that phase.
    phase: Arc<str>,
    desired: i64,
    /// NaN when the backlog cannot drain.
    drain_time_seconds: f64,
}

#[derive(Debug, Default)]
struct Budgets {
    /// By `namespace/name`: neither may hold a `/`.
    values: HashMap<Box<str>, Values>,
    phases: Vec<Arc<str>>,
}

/// The budgets' series, registered with the operator's registry as one collector.
#[derive(Debug, Default)]
pub struct BudgetSeries {
    budgets: Mutex<Budgets>,
}

fn key(namespace: &str, name: &str) -> Box<str> {
    [namespace, "/", name].concat().into_boxed_str()
}

impl BudgetSeries {
    fn lock(&self) -> MutexGuard<'_, Budgets> {
        // A panic while holding the lock leaves a map that is still whole.
        self.budgets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets one budget's series.
    pub fn set(
        &self,
        namespace: &str,
        name: &str,
        phase: &str,
        desired: i64,
        drain_time_seconds: Option<f64>,
    ) {
        let mut budgets = self.lock();
        let phase = match budgets.phases.iter().find(|known| ***known == *phase) {
            Some(known) => Arc::clone(known),
            None => {
                let new: Arc<str> = phase.into();
                budgets.phases.push(Arc::clone(&new));
                new
            }
        };
        let values = Values {
            phase,
            desired,
            drain_time_seconds: drain_time_seconds.unwrap_or(f64::NAN),
        };
        let key = key(namespace, name);
        match budgets.values.get_mut(&key) {
            Some(known) => *known = values,
            None => {
                budgets.values.insert(key, values);
            }
        }
    }

    /// Drops one budget's series.
    pub fn remove(&self, namespace: &str, name: &str) {
        let mut budgets = self.lock();
        budgets.values.remove(&*key(namespace, name));
        // A start's burst, or a namespace of budgets deleted, leaves room that goes back.
        if budgets.values.capacity() > 2 * budgets.values.len().max(64) {
            budgets.values.shrink_to_fit();
        }
    }
}

impl Collector for BudgetSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let budgets = self.lock();
        let labelled = || {
            budgets.values.iter().map(|(key, values)| {
                let (namespace, name) = key.split_once('/').unwrap_or(("", key));
                (namespace, name, values)
            })
        };
        let mut phases = encoder.encode_descriptor(
            "budget_phase",
            "1, labelled with the phase each BacklogBudget is in (one series per budget)",
            None,
            MetricType::Gauge,
        )?;
        for (namespace, name, values) in labelled() {
            let labels = [
                ("namespace", namespace),
                ("name", name),
                ("phase", &values.phase),
            ];
            ConstGauge::new(1_i64).encode(phases.encode_family(&labels)?)?;
        }
        let mut desired = encoder.encode_descriptor(
            "budget_desired_replicas",
            "Replicas the budget wants for its workload",
            None,
            MetricType::Gauge,
        )?;
        for (namespace, name, values) in labelled() {
            let labels = [("namespace", namespace), ("name", name)];
            ConstGauge::new(values.desired).encode(desired.encode_family(&labels)?)?;
        }
        let mut drain = encoder.encode_descriptor(
            "budget_drain_time_seconds",
            "Predicted seconds to drain the backlog (NaN when it cannot drain)",
            None,
            MetricType::Gauge,
        )?;
        for (namespace, name, values) in labelled() {
            let labels = [("namespace", namespace), ("name", name)];
            ConstGauge::new(values.drain_time_seconds).encode(drain.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
