//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::telemetry::Metrics;

/// What the HTTP endpoints report on.
#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    /// Set once the controllers run (and, with leader election, while this replica leads or
    /// stands by healthily).
    pub ready: Arc<AtomicBool>,
}

async fn metrics(
    State(health): State<Health>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves until the listener fails; returns the bound address through `bound`.
pub async fn serve(
    address: SocketAddr,
    health: Health,
    bound: tokio::sync::oneshot::Sender<SocketAddr>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(address).await?;
    let _ = bound.send(listener.local_addr()?);
    axum::serve(listener, app).await
}
