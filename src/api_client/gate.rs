//! The write gate: a deadline after which the operator's connections to the API server send
//! nothing. The leader opens it to the end of its term (see `core::leadership`) and closes it
//! when it steps down; because the connections check it right before every write to the socket,
//! no code path — a reconcile, an Event, a watch, a request queued before a pause — can put a
//! byte on the wire after the term, whatever it was doing when the term ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared by the connections of one client and whoever decides the deadline.
#[derive(Clone, Debug)]
pub struct WriteGate {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Instants are stored as nanoseconds since this one.
    epoch: Instant,
    /// Open while the monotonic clock is before `epoch + open_until` nanoseconds.
    open_until: AtomicU64,
}

/// `open_until` of a gate that never closes.
const ALWAYS: u64 = u64::MAX;

impl WriteGate {
    /// A gate that lets nothing through until it is opened.
    pub fn closed() -> WriteGate {
        WriteGate::with(0)
    }

    /// A gate that never closes: a single replica without leader election.
    pub fn always_open() -> WriteGate {
        WriteGate::with(ALWAYS)
    }

    fn with(open_until: u64) -> WriteGate {
        WriteGate {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                open_until: AtomicU64::new(open_until),
            }),
        }
    }

    /// Lets writes through until `deadline` (on this process's monotonic clock).
    pub fn open_until(&self, deadline: Instant) {
        let nanos = deadline
            .checked_duration_since(self.inner.epoch)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(ALWAYS - 1));
        self.inner.open_until.store(nanos, Ordering::SeqCst);
    }

    /// Lets nothing through from now on (until opened again).
    pub fn close(&self) {
        self.inner.open_until.store(0, Ordering::SeqCst);
    }

    /// Whether a write may go out at `now`.
    pub fn is_open_at(&self, now: Instant) -> bool {
        let open_until = self.inner.open_until.load(Ordering::SeqCst);
        if open_until == ALWAYS {
            return true;
        }
        let elapsed = now
            .checked_duration_since(self.inner.epoch)
            .unwrap_or(Duration::ZERO);
        u64::try_from(elapsed.as_nanos()).unwrap_or(ALWAYS) < open_until
    }

    /// Whether a write may go out now. Reads the clock: this is where the deadline is enforced.
    pub fn is_open(&self) -> bool {
        self.is_open_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_is_open_until_its_deadline_and_closes_on_demand() {
        let gate = WriteGate::closed();
        let now = Instant::now();
        assert!(!gate.is_open_at(now));
        gate.open_until(now + Duration::from_secs(2));
        assert!(gate.is_open_at(now + Duration::from_millis(1999)));
        assert!(!gate.is_open_at(now + Duration::from_secs(2)));
        assert!(!gate.is_open_at(now + Duration::from_secs(60)));
        gate.close();
        assert!(!gate.is_open_at(now));
        // A deadline already past keeps it closed.
        gate.open_until(gate.inner.epoch);
        assert!(!gate.is_open_at(now));
    }

    #[test]
    fn an_always_open_gate_never_closes_by_itself() {
        let gate = WriteGate::always_open();
        assert!(gate.is_open_at(Instant::now() + Duration::from_secs(1 << 40)));
        let shared = gate.clone();
        shared.close();
        assert!(!gate.is_open());
    }
}
