//! Executing a decided plan: its steps run in the order the decision put them in, and each
//! step says what its failure means for the ones after it. A step whose failure must stop the
//! rest (a write that later steps describe or depend on) stops; an announcement that failed is
//! logged and skipped; a write that nothing after it depends on lets the rest run and fails the
//! reconcile at the end, so it is retried without losing the steps after it.

use std::future::Future;

use kube::runtime::events::EventType;

use super::error::Error;

/// What a step's failure means for the steps after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Later steps depend on this one: stop, and fail the reconcile.
    Stop,
    /// Nothing depends on it: run the rest, then fail the reconcile.
    Defer,
    /// Best effort (an Event): log and go on.
    Ignore,
}

/// A step of a plan.
pub trait Step {
    fn on_failure(&self) -> OnFailure;
}

/// Performs steps against the cluster (or, in tests, records them).
pub trait Effects<S: Step> {
    fn perform(&self, step: &S) -> impl Future<Output = Result<(), Error>> + Send;
}

/// An Event the plan publishes about its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    pub type_: EventType,
    pub reason: String,
    /// What distinguishes this occurrence (kube folds Events with equal type, reason and
    /// action into one series).
    pub action: String,
    pub note: String,
}

impl PlannedEvent {
    pub fn new(
        warning: bool,
        reason: impl Into<String>,
        action: impl Into<String>,
        note: impl Into<String>,
    ) -> Self {
        PlannedEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            action: action.into(),
            note: note.into(),
        }
    }
}

/// How far a plan got.
#[derive(Debug, Default)]
pub struct Executed {
    /// The steps that succeeded, by index.
    pub succeeded: Vec<usize>,
    /// The first failure that fails the reconcile, with the step's index.
    pub failure: Option<(usize, Error)>,
}

impl Executed {
    /// Whether step `index` succeeded.
    pub fn done(&self, index: usize) -> bool {
        self.succeeded.contains(&index)
    }

    /// The reconcile's result.
    pub fn into_result(self) -> Result<(), Error> {
        match self.failure {
            Some((_, error)) => Err(error),
            None => Ok(()),
        }
    }
}

/// Runs `steps` in order against `effects`.
pub async fn execute<S, E>(steps: &[S], effects: &E) -> Executed
where
    S: Step,
    E: Effects<S>,
{
    let mut executed = Executed::default();
    for (index, step) in steps.iter().enumerate() {
        match effects.perform(step).await {
            Ok(()) => executed.succeeded.push(index),
            Err(error) => match step.on_failure() {
                OnFailure::Stop => {
                    executed.failure.get_or_insert((index, error));
                    return executed;
                }
                OnFailure::Defer => {
                    executed.failure.get_or_insert((index, error));
                }
                OnFailure::Ignore => {
                    tracing::warn!(%error, step = index, "a best-effort step failed");
                }
            },
        }
    }
    executed
}

#[cfg(test)]
pub mod testing {
    //! A recording [`Effects`] that fails chosen steps, for the plans' ordering tests.

    use std::collections::HashSet;
    use std::sync::Mutex;

    use super::*;
    use crate::controller::error::{ApiCall, Verb};

    pub struct Recorder<S> {
        fail: HashSet<usize>,
        pub performed: Mutex<Vec<S>>,
        calls: Mutex<usize>,
    }

    impl<S: Clone> Recorder<S> {
        /// Fails the steps at `fail` (indexes in the order performed).
        pub fn failing(fail: impl IntoIterator<Item = usize>) -> Self {
            Recorder {
                fail: fail.into_iter().collect(),
                performed: Mutex::new(Vec::new()),
                calls: Mutex::new(0),
            }
        }

        pub fn performed(&self) -> Vec<S> {
            self.performed.lock().unwrap().clone()
        }
    }

    /// A server error, as a failing write would get.
    pub fn unavailable() -> Error {
        Error::api(
            ApiCall::new(Verb::Apply, "Thing", "ns", "name"),
            kube::Error::Api(Box::new(kube::core::Status {
                code: 503,
                ..kube::core::Status::default()
            })),
        )
    }

    impl<S: Step + Clone + Send + Sync> Effects<S> for Recorder<S> {
        fn perform(&self, step: &S) -> impl Future<Output = Result<(), Error>> + Send {
            let index = {
                let mut calls = self.calls.lock().unwrap();
                *calls += 1;
                *calls - 1
            };
            let result = if self.fail.contains(&index) {
                Err(unavailable())
            } else {
                self.performed.lock().unwrap().push(step.clone());
                Ok(())
            };
            std::future::ready(result)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Recorder;
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    enum Toy {
        Critical(u8),
        Announce(u8),
        Last(u8),
    }

    impl Step for Toy {
        fn on_failure(&self) -> OnFailure {
            match self {
                Toy::Critical(_) => OnFailure::Stop,
                Toy::Announce(_) => OnFailure::Ignore,
                Toy::Last(_) => OnFailure::Defer,
            }
        }
    }

    fn plan() -> Vec<Toy> {
        vec![
            Toy::Critical(0),
            Toy::Announce(1),
            Toy::Last(2),
            Toy::Announce(3),
        ]
    }

    fn run(fail: &[usize]) -> (Vec<Toy>, Option<usize>) {
        let recorder = Recorder::failing(fail.iter().copied());
        let executed = futures::executor::block_on(execute(&plan(), &recorder));
        (recorder.performed(), executed.failure.map(|(i, _)| i))
    }

    #[test]
    fn a_stopping_failure_runs_nothing_after_it() {
        assert_eq!(run(&[0]), (vec![], Some(0)));
    }

    #[test]
    fn an_ignored_failure_changes_nothing_else() {
        let (performed, failure) = run(&[1]);
        assert_eq!(
            performed,
            [Toy::Critical(0), Toy::Last(2), Toy::Announce(3)]
        );
        assert_eq!(failure, None);
    }

    #[test]
    fn a_deferred_failure_lets_the_rest_run_and_fails_at_the_end() {
        let (performed, failure) = run(&[2]);
        assert_eq!(
            performed,
            [Toy::Critical(0), Toy::Announce(1), Toy::Announce(3)]
        );
        assert_eq!(failure, Some(2));
    }
}
