//! backlog-operator: declarative retry policies, backlog budgets and approved replays for
//! asynchronous consumers on Kubernetes.

pub mod api;
pub mod cli;
pub mod consumer;
pub mod core;
pub mod sim;
