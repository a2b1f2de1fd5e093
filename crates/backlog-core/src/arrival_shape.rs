//! When the events waiting now arrived: the recent arrival rate, read backwards from now, as
//! the shape of the queue. The backlog and the oldest age say how many events wait and over
//! how long; they do not say where in that stretch they are dense. After a spike the oldest
//! events are the spike's, and the head ages while the consumers work through them, however
//! little arrives now; spread evenly, the same queue looks like it ages slower and a count that
//! falls short looks like it suffices. Pure; the trajectory model reads the head from it.

/// Steps a shape keeps at most (a demand history holds fewer runs).
const MAX_STEPS: usize = 28;

/// λ as a function of how long ago, in steps: step `i` covers from `steps[i].0` seconds ago
/// back to the next step's start; the last reaches back without end. No steps: even.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArrivalShape {
    steps: [(f64, f64); MAX_STEPS],
    len: usize,
}

impl Default for ArrivalShape {
    fn default() -> Self {
        Self::even()
    }
}

impl ArrivalShape {
    /// No knowledge of when the events arrived: they are taken as spread evenly.
    pub const fn even() -> Self {
        Self {
            steps: [(0.0, 0.0); MAX_STEPS],
            len: 0,
        }
    }

    /// From runs of λ, newest first, each as (seconds ago its reading started, λ). A rate is
    /// read over a window, so a reading reflects the arrivals about half a window before it:
    /// `reading_lag` moves every change that far back, and the newest run reaches to now.
    /// Anything not finite or negative leaves the shape even.
    pub fn from_runs(runs_newest_first: &[(f64, f64)], reading_lag: f64) -> Self {
        let valid = |value: f64| value.is_finite() && value >= 0.0;
        if !valid(reading_lag)
            || runs_newest_first.is_empty()
            || runs_newest_first
                .iter()
                .any(|&(ago, rate)| !valid(ago) || !valid(rate))
        {
            return Self::even();
        }
        let mut shape = Self::even();
        let mut previous_start = 0.0_f64;
        for (i, &(_, rate)) in runs_newest_first.iter().enumerate().take(MAX_STEPS) {
            // The newest run starts now; each older one where the newer one began.
            let start = match i
                .checked_sub(1)
                .and_then(|newer| runs_newest_first.get(newer))
            {
                Some(&(newer_ago, _)) => (newer_ago + reading_lag).max(previous_start),
                None => 0.0,
            };
            shape.steps[i] = (start, rate);
            shape.len = i + 1;
            previous_start = start;
        }
        shape
    }

    pub fn is_even(&self) -> bool {
        self.len == 0
    }

    /// The shape `seconds` later, with `rate` arriving meanwhile.
    pub fn aged_by(&self, seconds: f64, rate: f64) -> Self {
        if self.is_even() || !(seconds.is_finite() && seconds > 0.0) {
            return *self;
        }
        let mut aged = Self::even();
        aged.steps[0] = (0.0, if rate.is_finite() { rate.max(0.0) } else { 0.0 });
        aged.len = 1;
        for &(start, step_rate) in &self.steps[..self.len] {
            if aged.len == MAX_STEPS {
                break;
            }
            aged.steps[aged.len] = (start + seconds, step_rate);
            aged.len += 1;
        }
        aged
    }

    /// The queue's head as it moves: where the events waiting now sit in time.
    pub fn head(&self, backlog: f64, oldest_age: f64) -> Head {
        let mut head = Head {
            backlog,
            oldest_age,
            pieces: Vec::new(),
            cursor: 0,
        };
        if self.is_even() || !(backlog > 0.0 && oldest_age > 0.0) {
            return head;
        }
        // Oldest first: (seconds ago the piece ends toward now, its λ, events before its end).
        let mut events = 0.0;
        for i in (0..self.len).rev() {
            let (start, rate) = self.steps[i];
            let end = self
                .steps
                .get(i + 1)
                .filter(|_| i + 1 < self.len)
                .map_or(oldest_age, |older| older.0.min(oldest_age));
            if start >= oldest_age || end <= start {
                continue;
            }
            events += rate * (end - start);
            head.pieces.push(Piece {
                newer_edge: start,
                older_edge: end,
                rate,
                events_before_end: events,
            });
        }
        if !(events.is_finite() && events > 0.0) {
            head.pieces.clear();
        } else {
            // The backlog is measured, the rates only read: their shape, the backlog's size.
            let scale = backlog / events;
            for piece in &mut head.pieces {
                piece.rate *= scale;
                piece.events_before_end *= scale;
            }
        }
        head
    }
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    newer_edge: f64,
    older_edge: f64,
    rate: f64,
    /// Events of the queue from its oldest through this piece's newer edge.
    events_before_end: f64,
}

/// The events waiting now, oldest first, for [`Head::seconds_ago`] lookups in growing order.
#[derive(Clone, Debug)]
pub struct Head {
    backlog: f64,
    oldest_age: f64,
    pieces: Vec<Piece>,
    cursor: usize,
}

impl Head {
    /// How long before now the event `completed` places behind the oldest arrived. Calls
    /// must not decrease `completed` (the cursor only moves forward).
    pub fn seconds_ago(&mut self, completed: f64) -> f64 {
        if self.pieces.is_empty() {
            return if self.backlog > 0.0 {
                self.oldest_age * (1.0 - completed / self.backlog).clamp(0.0, 1.0)
            } else {
                0.0
            };
        }
        while self.cursor + 1 < self.pieces.len()
            && self.pieces[self.cursor].events_before_end < completed
        {
            self.cursor += 1;
        }
        let piece = self.pieces[self.cursor];
        let before = piece.events_before_end - piece.rate * (piece.older_edge - piece.newer_edge);
        if piece.rate <= 0.0 {
            return piece.newer_edge;
        }
        (piece.older_edge - (completed - before) / piece.rate)
            .clamp(piece.newer_edge, piece.older_edge)
    }
}

#[cfg(test)]
mod tests;
