//! The functional core: every decision as a pure function of its inputs and the time.
//! No I/O and no clock reads here; the controllers and the simulator supply both.

pub mod budget_config;
pub mod drain;
pub mod duration;
pub mod format;
pub mod metric_input;
pub mod recommendation;
pub mod scaling;
pub mod stabilization;
