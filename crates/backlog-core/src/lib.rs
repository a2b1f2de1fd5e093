//! The functional core of backlog-operator: every decision as a pure function of its inputs
//! and the time. No I/O and no clock reads here; the controllers, the simulator and consumers
//! supply both. Nothing here knows the Kubernetes API: the CRD types convert into the plain
//! definitions of [`budget_config`], [`event_class`] and [`retry_policy`].

pub mod arrival_shape;
pub mod backoff;
pub mod budget_config;
pub mod capacity_check;
pub mod capacity_estimate;
pub mod capacity_plan;
pub mod change_budget;
pub mod class_breaker;
pub mod classification;
pub mod compensation_plan;
pub mod condition;
pub mod deadline_plan;
pub mod demand_history;
pub mod digest;
pub mod drain;

pub mod duration;
pub mod economy;
pub mod event_class;
pub mod format;
pub mod go_duration;
pub mod leadership;
pub mod metric_input;
pub mod partition_skew;
pub mod phase;
pub mod promql_range;
pub mod replay_plan;
pub mod replay_scope;
pub mod retry_budget;
pub mod retry_planner;
pub mod retry_policy;
pub mod scaling;
pub mod schedule;
pub mod stabilization;
pub mod trajectory;
