//! backlog-operator: declarative retry policies, backlog budgets and approved replays for
//! asynchronous consumers on Kubernetes.

pub mod api;
pub mod cli;
pub mod consumer;
pub mod controller;
pub mod explain;
pub mod http;
pub mod metrics_source;
pub mod served_workload;
pub mod sim;
pub mod telemetry;
pub mod watch;

// The pure decisions live in their own crate; the old path stays for the controllers.
pub use backlog_core as core;
