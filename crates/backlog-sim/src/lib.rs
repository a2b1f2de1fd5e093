//! The offline simulator: the same decision code as the controller, run against a
//! discrete-time model of a partitioned consumer, next to the policies users come from.

pub mod classes;
mod oracle;
pub mod output;
pub mod policy;
pub mod run;
pub mod scenario;
pub mod schedule;
pub mod scrapes;
pub mod server;
mod static_reference;
pub mod svg;
pub mod workload;
