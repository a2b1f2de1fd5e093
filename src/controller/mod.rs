//! The controllers (`backlog-operator run`): one reconciler per kind, each thin —
//! read → decide (in `core`) → apply (server-side apply) → status.

pub mod apply;
pub mod budget;
mod changed;
pub mod compensation;
pub mod context;
pub mod error;
pub mod leader;
pub mod listed;
pub mod plan;
pub mod reconciler;
pub mod replay;
pub mod retry;
pub mod retry_policy;
mod shared_watches;
pub mod slim;
mod spec_digest;
pub mod synced;
pub mod worker_pod;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::api_client::{self, ClientSettings, WriteGate};
use crate::http::{Health, serve};
use crate::metrics_source::prometheus::PrometheusBackend;
use crate::metrics_source::{Allowlist, MetricsSource};
use crate::telemetry::Metrics;

pub use context::Context;
pub use error::Error;
pub use replay::pod_policy::WorkerPolicy;

/// Which namespaces the controllers watch.
#[derive(Clone, Debug)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(namespace) => Api::namespaced(client.clone(), namespace),
        }
    }
}

/// Settings of `backlog-operator run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub prometheus_url: Option<String>,
    /// Servers `spec.prometheus.address` may name besides `prometheus_url`.
    pub allowed_prometheus_urls: Vec<String>,
    /// Watched namespaces (one controller set each), or all of them.
    pub scopes: Vec<Scope>,
    pub listen: SocketAddr,
    pub query_timeout: Duration,
    pub query_concurrency: usize,
    /// What replay worker pods may be.
    pub worker_policy: WorkerPolicy,
    /// Timeouts of the API clients and the replica's identity.
    pub client: ClientSettings,
    /// With several replicas: only the holder of this Lease reconciles and writes.
    pub leader_election: Option<leader::LeaseSettings>,
    /// How long transient reconcile failures last before an object's `Synced` condition says so.
    pub report_failures_after: Duration,
}

/// What the shared context is built from.
#[derive(Clone, Debug)]
pub struct ContextSettings {
    pub prometheus_url: Option<String>,
    pub allowlist: Allowlist,
    pub query_timeout: Duration,
    pub query_concurrency: usize,
    pub worker_policy: WorkerPolicy,
    /// How long transient reconcile failures last before an object's `Synced` condition says so.
    pub report_failures_after: Duration,
}

/// The shared context for a client: metrics, the query cache and the event recorder. Only
/// `prometheus_url` may be queried; replay workers follow the default policy.
pub fn context(
    client: Client,
    prometheus_url: Option<String>,
    query_timeout: Duration,
    query_concurrency: usize,
) -> Arc<Context> {
    Arc::new(build_context(
        client,
        ContextSettings::defaults(prometheus_url, query_timeout, query_concurrency),
    ))
}

impl ContextSettings {
    /// Only `prometheus_url` may be queried; replay workers follow the default policy.
    pub fn defaults(
        prometheus_url: Option<String>,
        query_timeout: Duration,
        query_concurrency: usize,
    ) -> ContextSettings {
        // An unusable default URL allows nothing: its queries fail with that reason anyway.
        let allowlist =
            Allowlist::new(&[], prometheus_url.as_deref()).unwrap_or_else(|_| Allowlist::none());
        ContextSettings {
            prometheus_url,
            allowlist,
            query_timeout,
            query_concurrency,
            worker_policy: WorkerPolicy::default(),
            report_failures_after: synced::DEFAULT_REPORT_AFTER,
        }
    }
}

/// The shared context for a client, from explicit settings.
pub fn build_context(client: Client, settings: ContextSettings) -> Context {
    build_context_with(client, settings, Arc::new(Metrics::default()))
}

/// The same, counting in `metrics` (which the client may already count its waits in).
pub fn build_context_with(
    client: Client,
    settings: ContextSettings,
    metrics: Arc<Metrics>,
) -> Context {
    let queries = Arc::new(
        MetricsSource::new(
            PrometheusBackend::shared(),
            settings.query_concurrency,
            settings.query_timeout,
        )
        .with_allowlist(settings.allowlist)
        .with_observer(metrics.clone()),
    );
    Context::new(client, metrics, queries, settings.prometheus_url)
        .with_worker_policy(settings.worker_policy)
        .with_report_failures_after(settings.report_failures_after)
}

/// Runs every controller on `context` until they stop (on a termination signal).
pub async fn run_controllers(context: Arc<Context>, scope: Scope) {
    let (for_budgets, for_policies) =
        shared_watches::open(&context.client, &scope, context.metrics.clone());
    tokio::join!(
        budget::run(context.clone(), scope.clone(), for_budgets),
        compensation::run(context.clone(), scope.clone()),
        replay::run(context.clone(), scope.clone()),
        retry_policy::run(context.clone(), for_policies)
    );
}

/// Runs every controller in each of `scopes` (one set per watched namespace).
pub async fn run_scopes(context: Arc<Context>, scopes: Vec<Scope>) {
    futures::future::join_all(
        scopes
            .into_iter()
            .map(|scope| run_controllers(context.clone(), scope)),
    )
    .await;
}

/// Runs every controller until a termination signal; with leader election, only while this
/// replica leads.
pub async fn run(options: RunOptions) -> Result<(), Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
    // Without leader election this is the only replica: its writes are never gated.
    let gate = match options.leader_election {
        Some(_) => WriteGate::closed(),
        None => WriteGate::always_open(),
    };
    let metrics = Arc::new(Metrics::default());
    let (client, spare) = api_client::build_with_spare(
        config.clone(),
        &options.client,
        gate.clone(),
        Some(metrics.clone()),
    )
    .map_err(Error::Client)?;
    let allowlist = Allowlist::new(
        &options.allowed_prometheus_urls,
        options.prometheus_url.as_deref(),
    )
    .map_err(Error::Settings)?;
    let context = build_context_with(
        client,
        ContextSettings {
            prometheus_url: options.prometheus_url.clone(),
            allowlist,
            query_timeout: options.query_timeout,
            query_concurrency: options.query_concurrency,
            worker_policy: options.worker_policy.clone(),
            report_failures_after: options.report_failures_after,
        },
        metrics,
    )
    .with_spare(spare);
    let context = Arc::new(context);
    let health = Health {
        metrics: context.metrics.clone(),
        ready: Default::default(),
    };
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let listen = options.listen;
    let mut server = tokio::spawn(serve(listen, health.clone(), bound_tx));
    if let Ok(address) = bound_rx.await {
        info!(%address, "serving /metrics, /healthz and /readyz");
    }
    // A standby replica is healthy and ready; it just does not reconcile.
    health.ready.store(true, Ordering::Relaxed);
    let Some(settings) = options.leader_election.clone() else {
        context.metrics.leading.set(1);
        info!(scopes = ?options.scopes, prometheus = ?options.prometheus_url, allowed = ?options.allowed_prometheus_urls, "controllers starting");
        tokio::select! {
            () = run_scopes(context.clone(), options.scopes.clone()) => {}
            served = &mut server => return served_error(listen, served),
        }
        info!("controllers stopped");
        return Ok(());
    };

    let lease_gate = WriteGate::closed();
    // The Lease has a client of its own without the limit: renewals never queue behind a
    // burst of the controllers' writes.
    let lease_settings = api_client::ClientSettings {
        qps: 0.0,
        ..options.client.clone()
    };
    let lease_client = api_client::build(config, &lease_settings, lease_gate.clone(), None)
        .map_err(Error::Client)?;
    let mut elector = leader::Elector::new(lease_client, lease_gate, settings);
    let timing = elector.settings().timing;
    let mut terminated = std::pin::pin!(termination());
    loop {
        let renewal_sent_at = tokio::select! {
            sent_at = elector.acquire() => sent_at,
            () = &mut terminated => return Ok(()),
            served = &mut server => return served_error(listen, served),
        };
        gate.open_until(timing.leads_until(renewal_sent_at));
        context.metrics.leading.set(1);
        info!(scopes = ?options.scopes, prometheus = ?options.prometheus_url, allowed = ?options.allowed_prometheus_urls, "controllers starting");
        // A new term starts the controllers afresh: every store is listed again before the
        // first reconcile, so nothing decided by an earlier leader's cache carries over.
        let lost = tokio::select! {
            () = run_scopes(context.clone(), options.scopes.clone()) => None,
            lost = elector.keep(renewal_sent_at, &gate) => Some(lost),
            served = &mut server => {
                gate.close();
                return served_error(listen, served);
            }
        };
        gate.close();
        context.metrics.leading.set(0);
        match lost {
            Some(lost) => {
                warn!(%lost, "stopped leading; standing by");
                context.metrics.leadership_lost.inc();
            }
            None => {
                info!("controllers stopped");
                elector.release().await;
                return Ok(());
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// How the operator ends when its metrics server did: a server that failed or panicked is a
/// failure of the process (it exited 0 after a panic before), one that stopped is not.
fn served_error(
    address: SocketAddr,
    served: Result<std::io::Result<()>, tokio::task::JoinError>,
) -> Result<(), Error> {
    match served {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(Error::Serve { address, source }),
        Err(stopped) => Err(Error::Serve {
            address,
            source: std::io::Error::other(stopped),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_metrics_server_that_panicked_fails_the_process() {
        let address: SocketAddr = ([127, 0, 0, 1], 8080).into();
        let panicked = tokio::spawn(async { panic!("a bug in a handler") }).await;
        let ended: Result<std::io::Result<()>, _> = panicked.map(|()| Ok(()));
        let error = served_error(address, ended).expect_err("a panic is a failure");
        assert!(error.to_string().contains("127.0.0.1:8080"), "{error}");
        assert!(served_error(address, Ok(Ok(()))).is_ok());
    }
}
