//! backlog-operator: declarative retry policies, backlog budgets and approved replays for
//! asynchronous consumers on Kubernetes.

pub mod api;
pub mod api_client;
pub mod cli;
pub mod controller;
pub mod explain;
pub mod http;
pub mod metrics_source;
pub mod plan;
pub mod served_workload;
pub mod telemetry;
pub mod watch;

// The decisions, the consumer library and the simulator live in their own crates; the old
// paths stay.
pub use backlog_consumer as consumer;
pub use backlog_core as core;
pub use backlog_sim as sim;
