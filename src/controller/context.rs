//! What every reconciler shares.

use std::sync::Arc;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::metrics_source::MetricsSource;
use crate::telemetry::Metrics;

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub queries: Arc<MetricsSource>,
    pub recorder: Recorder,
    /// The operator's --prometheus-url, used by budgets that name no server.
    pub default_prometheus: Option<String>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        queries: Arc<MetricsSource>,
        default_prometheus: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: super::apply::FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            queries,
            default_prometheus,
        }
    }
}
