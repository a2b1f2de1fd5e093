//! Where the oldest unfinished event's age goes: a fluid FIFO model of the backlog under a
//! forecast of arrivals and a schedule of completion capacity.
//!
//! The events waiting now are spread over their arrival times (from `oldest_age` ago until
//! now) as the recent arrival rate spread them ([`ArrivalShape`]; evenly when it is not
//! known); later arrivals follow the forecast. The head of the queue is
//! the event at cumulative arrival = completed, so the oldest age at any time follows from the
//! two cumulative curves. Pure; used by the deadline planner to compare replica counts.

use super::arrival_shape::ArrivalShape;

/// The queue at the start of a prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueNow {
    pub backlog: f64,
    pub oldest_age: f64,
    /// When the waiting events arrived.
    pub shape: ArrivalShape,
}

impl QueueNow {
    /// The queue as its oldest partition sees it, scaled to the whole group: a partition whose
    /// head is `oldest_age` old holds at least what arrived since, so when the backlog is
    /// concentrated in the partitions of the consumers that fall behind, the total understates
    /// how much stands before the oldest head. The model works on the group's capacity, which
    /// is what the busiest consumer completes scaled to all partitions; this is its queue on
    /// the same scale.
    pub fn as_oldest_partition_sees_it(self, produce_rate: f64) -> QueueNow {
        let since_oldest = produce_rate.max(0.0) * self.oldest_age.max(0.0);
        QueueNow {
            backlog: if since_oldest.is_finite() && self.backlog > 0.0 {
                self.backlog.max(since_oldest)
            } else {
                self.backlog
            },
            ..self
        }
    }

    /// A queue whose events are taken as spread evenly over their arrival times.
    pub fn even(backlog: f64, oldest_age: f64) -> QueueNow {
        QueueNow {
            backlog,
            oldest_age,
            shape: ArrivalShape::even(),
        }
    }
}

/// What a prediction found over its horizon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outlook {
    /// Highest oldest-unfinished age over the horizon, seconds.
    pub peak_age: f64,
    /// When every event waiting now has completed (seconds from now), if within the horizon.
    pub drained_at: Option<f64>,
    pub end_backlog: f64,
    pub end_age: f64,
    /// When the age first reached the watched age, if it did within the horizon.
    pub reached_at: Option<f64>,
}

/// How finely a prediction steps: `fine` seconds until `fine_until`, `coarse` after. The near
/// future holds the next decisions, pod starts and the drain limit; far ahead, where only
/// whether the age passes a limit of hours is asked, coarse steps keep long horizons cheap.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steps {
    pub fine: f64,
    pub fine_until: f64,
    pub coarse: f64,
}

impl From<f64> for Steps {
    /// The same step throughout.
    fn from(step: f64) -> Self {
        Steps {
            fine: step,
            fine_until: 0.0,
            coarse: step,
        }
    }
}

impl Steps {
    fn at(&self, t: f64) -> f64 {
        let step = if t < self.fine_until {
            self.fine.min(self.fine_until - t)
        } else {
            self.coarse
        };
        if step.is_finite() && step > 0.0 {
            step
        } else {
            1.0
        }
    }
}

/// Predicts the queue for `horizon` seconds in `steps`; `arrivals(t)` and `capacity(t)` give
/// events per second at `t` seconds from now.
pub fn predict(
    queue: QueueNow,
    arrivals: impl Fn(f64) -> f64,
    capacity: impl Fn(f64) -> f64,
    horizon: f64,
    steps: impl Into<Steps>,
) -> Outlook {
    predict_watching(queue, arrivals, capacity, horizon, steps, f64::INFINITY)
}

/// [`predict`], also noting when the age first reaches `watched` seconds.
pub fn predict_watching(
    queue: QueueNow,
    arrivals: impl Fn(f64) -> f64,
    capacity: impl Fn(f64) -> f64,
    horizon: f64,
    steps: impl Into<Steps>,
    watched: f64,
) -> Outlook {
    let backlog = queue.backlog.max(0.0);
    let oldest_age = queue.oldest_age.max(0.0);
    let steps = steps.into();
    // Cumulative arrivals after now, at the end of each step.
    let mut arrived_curve: Vec<(f64, f64)> = Vec::new();
    let mut cursor = 0;
    let mut head = queue.shape.head(backlog, oldest_age);
    let (mut t, mut arrived, mut completed) = (0.0, 0.0, 0.0);
    let start_age = if backlog > 0.0 { oldest_age } else { 0.0 };
    let mut outlook = Outlook {
        peak_age: start_age,
        drained_at: (backlog <= 0.0).then_some(0.0),
        end_backlog: backlog,
        end_age: start_age,
        reached_at: (start_age >= watched).then_some(0.0),
    };
    while t < horizon {
        let dt = steps.at(t).min(horizon - t);
        let middle = t + dt / 2.0;
        arrived += sanitize(arrivals(middle)) * dt;
        t += dt;
        arrived_curve.push((t, arrived));
        completed = (completed + sanitize(capacity(middle)) * dt).min(backlog + arrived);
        if outlook.drained_at.is_none() && completed >= backlog * (1.0 - 1e-9) {
            outlook.drained_at = Some(t);
        }
        let waiting = backlog + arrived - completed;
        let age = if waiting <= 1e-9 * (backlog + arrived).max(1.0) {
            0.0
        } else if completed < backlog {
            t + head.seconds_ago(completed)
        } else {
            t - arrival_time(&arrived_curve, &mut cursor, completed - backlog)
        };
        outlook.peak_age = outlook.peak_age.max(age);
        if outlook.reached_at.is_none() && age >= watched {
            outlook.reached_at = Some(t);
        }
        outlook.end_backlog = waiting.max(0.0);
        outlook.end_age = age;
    }
    outlook
}

fn sanitize(rate: f64) -> f64 {
    if rate.is_finite() { rate.max(0.0) } else { 0.0 }
}

/// When the `position`-th event after now arrived (seconds from now), interpolated within
/// its step; `cursor` only moves forward because positions only grow.
fn arrival_time(curve: &[(f64, f64)], cursor: &mut usize, position: f64) -> f64 {
    while *cursor + 1 < curve.len() && curve[*cursor].1 < position {
        *cursor += 1;
    }
    let (end, at_end) = curve.get(*cursor).copied().unwrap_or((0.0, 0.0));
    let (start, at_start) = match cursor.checked_sub(1).and_then(|i| curve.get(i)) {
        Some(previous) => *previous,
        None => (0.0, 0.0),
    };
    if at_end <= at_start {
        return end;
    }
    start + (end - start) * ((position - at_start) / (at_end - at_start)).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn flat(value: f64) -> impl Fn(f64) -> f64 {
        move |_| value
    }

    #[test]
    fn a_queue_that_keeps_up_stays_empty() {
        let o = predict(
            QueueNow::even(0.0, 0.0),
            flat(100.0),
            flat(120.0),
            600.0,
            5.0,
        );
        assert_eq!(o.peak_age, 0.0);
        assert_eq!(o.drained_at, Some(0.0));
    }

    #[test]
    fn a_backlog_drains_at_the_spare_rate_and_its_age_falls() {
        // 60 000 waiting over the last 60 s, 1000/s arriving, 1500/s completed: the events
        // waiting now are done after 40 s, the queue is empty after 120 s.
        let o = predict(
            QueueNow::even(60_000.0, 60.0),
            flat(1000.0),
            flat(1500.0),
            600.0,
            1.0,
        );
        assert_eq!(o.drained_at, Some(40.0));
        assert!((o.peak_age - 60.0).abs() < 1.0, "{o:?}");
        assert_eq!(o.end_age, 0.0);
    }

    #[test]
    fn too_little_capacity_ages_the_head_at_one_minus_mu_over_lambda() {
        let o = predict(
            QueueNow::even(0.0, 0.0),
            flat(1000.0),
            flat(750.0),
            400.0,
            1.0,
        );
        assert!((o.end_age - 100.0).abs() < 2.0, "{o:?}");
        assert!((o.end_backlog - 100_000.0).abs() < 1.0, "{o:?}");
    }

    #[test]
    fn a_pause_ages_every_event() {
        let o = predict(
            QueueNow::even(0.0, 0.0),
            flat(100.0),
            |t| if t < 30.0 { 0.0 } else { 1000.0 },
            120.0,
            1.0,
        );
        assert!((o.peak_age - 30.0).abs() < 1.5, "{o:?}");
        assert_eq!(o.end_age, 0.0);
    }

    #[test]
    fn a_spike_at_the_head_ages_the_queue_while_it_is_worked_through() {
        // 110 s of a 4873/s spike, then 39 s of 701/s: 563 000 waiting, the oldest 149 s
        // old, 2496/s completed from now on. The spike's events take 215 s to complete and
        // the head moves through them at half the speed of time: the age passes 250 s.
        // Spread evenly, the same queue seems to peak at 226 s.
        let (backlog, age) = (4873.0 * 110.0 + 701.0 * 39.0, 149.0);
        let shape = ArrivalShape::from_runs(&[(39.0, 701.0), (600.0, 4873.0)], 0.0);
        let shaped = predict(
            QueueNow {
                backlog,
                oldest_age: age,
                shape,
            },
            flat(701.0),
            flat(2496.0),
            600.0,
            1.0,
        );
        let even = predict(
            QueueNow::even(backlog, age),
            flat(701.0),
            flat(2496.0),
            600.0,
            1.0,
        );
        assert!((shaped.peak_age - 254.0).abs() < 3.0, "{shaped:?}");
        assert!((even.peak_age - 226.0).abs() < 3.0, "{even:?}");
        assert_eq!(shaped.drained_at, even.drained_at);
    }

    proptest! {
        #[test]
        fn more_capacity_never_ages_the_queue_more(
            backlog in 0.0..1e6f64,
            age in 0.0..600.0f64,
            lambda in 0.0..5000.0f64,
            mu in 0.0..5000.0f64,
            extra in 0.0..2000.0f64,
        ) {
            let queue = QueueNow::even(backlog, age);
            let less = predict(queue, flat(lambda), flat(mu), 900.0, 5.0);
            let more = predict(queue, flat(lambda), flat(mu + extra), 900.0, 5.0);
            prop_assert!(more.peak_age <= less.peak_age + 1e-6);
            prop_assert!(more.end_backlog <= less.end_backlog + 1e-6);
        }

        #[test]
        fn the_age_never_exceeds_the_start_age_plus_the_elapsed_time(
            backlog in 0.0..1e6f64,
            age in 0.0..600.0f64,
            lambda in 0.0..5000.0f64,
            mu in 0.0..5000.0f64,
        ) {
            let o = predict(QueueNow::even(backlog, age), flat(lambda), flat(mu), 900.0, 5.0);
            prop_assert!(o.peak_age <= age + 900.0 + 1e-6);
            prop_assert!(o.end_backlog >= 0.0);
        }
    }
}
