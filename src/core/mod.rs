//! The functional core: every decision as a pure function of its inputs and the time.
//! No I/O and no clock reads here; the controllers and the simulator supply both.

pub mod budget_config;
pub mod class_breaker;
pub mod condition;
pub mod drain;
pub mod duration;
pub mod event_class;
pub mod format;
pub mod leadership;
pub mod metric_input;
pub mod phase;
pub mod recommendation;
pub mod replay_plan;
pub mod replay_scope;
pub mod retry_policy;
pub mod scaling;
pub mod stabilization;
