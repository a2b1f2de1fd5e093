//! The Prometheus HTTP API as a [`QueryBackend`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_http_query::Client;
use prometheus_http_query::response::Data;

use super::{QueryBackend, QueryFuture};
use crate::core::metric_input::Observation;

/// Instant queries over HTTP(S), one client per server address.
#[derive(Default)]
pub struct PrometheusBackend {
    clients: Mutex<HashMap<String, Client>>,
}

impl PrometheusBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn client(&self, address: &str, timeout: Duration) -> Result<Client, String> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(address) {
            return Ok(client.clone());
        }
        // The per-query deadline is enforced around each query (with a clear message); the
        // client's own timeout is only a backstop behind it.
        let http = reqwest::Client::builder()
            .timeout(timeout + Duration::from_secs(1))
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let client = Client::from(http, address)
            .map_err(|e| format!("{address} is not a usable Prometheus address: {e}"))?;
        clients.insert(address.to_owned(), client.clone());
        Ok(client)
    }
}

/// The samples of a query result; a range vector is a mistake in the query.
pub fn observation_of(data: &Data) -> Observation {
    match data {
        Data::Vector(vector) => {
            Observation::Samples(vector.iter().map(|v| v.sample().value()).collect())
        }
        Data::Scalar(sample) => Observation::Samples(vec![sample.value()]),
        Data::Matrix(_) => Observation::Failed(
            "returned a range vector; write an instant query (e.g. wrap it in rate() or max_over_time())"
                .to_owned(),
        ),
    }
}

impl QueryBackend for PrometheusBackend {
    fn instant(&self, address: &str, expression: &str, timeout: Duration) -> QueryFuture {
        let client = self.client(address, timeout);
        let expression = expression.to_owned();
        let address = address.to_owned();
        Box::pin(async move {
            let client = match client {
                Ok(client) => client,
                Err(reason) => return Observation::Failed(reason),
            };
            let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
            let query = client.query(&expression).timeout(timeout_ms).get();
            match tokio::time::timeout(timeout, query).await {
                Err(_) => Observation::Failed(format!(
                    "no answer from {address} within {}ms",
                    timeout.as_millis()
                )),
                Ok(Err(error)) => Observation::Failed(format!("{address}: {error}")),
                Ok(Ok(result)) => observation_of(result.data()),
            }
        })
    }
}

impl PrometheusBackend {
    pub fn shared() -> Arc<dyn QueryBackend> {
        Arc::new(Self::new())
    }
}
