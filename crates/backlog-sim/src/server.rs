//! The workload simulator as a server: the same model, advancing with the wall clock (or a
//! chosen speed-up), following a replica count the caller reads (the operator reads it from
//! the real API server) and serving the metrics a Kafka consumer would have, for a real
//! Prometheus to scrape.
//!
//! With speed-up S the served numbers are those of a workload S times faster: counters count
//! the same events (so `rate()` over them is S times the model's rate), ages are divided by S.
//! A budget for it therefore states its deadline and per-replica rate in wall-clock terms.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use super::scenario::Model;
use super::workload::Workload;

/// What the server exposes, refreshed by the model thread.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Model seconds since the start.
    pub model_time: f64,
    pub produced_total: f64,
    pub completed_total: f64,
    pub partition_backlogs: Vec<f64>,
    /// Seconds, already divided by the speed-up.
    pub oldest_age: f64,
    pub replicas: u32,
    pub ready: u32,
    /// Events per model second.
    pub produce_rate: f64,
    /// Events per model second the ready consumers can complete.
    pub capacity: f64,
    pub finished: bool,
}

/// What the served model takes as its number of consumers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ConsumerCount {
    /// The target's spec.replicas, with the scenario's pod start delay (no pods need to run).
    #[default]
    SpecReplicas,
    /// The target's status.readyReplicas: real pods on a real node, so their start and stop
    /// delays are real (the scenario's start delay is not added).
    ReadyPods,
}

/// Where the server gets its replicas and what it calls its series.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Where the consumer count is read from: the namespace and the Deployment (or other
    /// apps/v1 kind) whose replicas (see `consumers`) it is.
    pub namespace: String,
    pub target_kind: String,
    pub target_name: String,
    pub speed: f64,
    /// Topic and consumer group label values.
    pub topic: String,
    pub consumers: ConsumerCount,
}

/// A running workload server; stops when dropped.
pub struct WorkloadServer {
    pub address: SocketAddr,
    pub snapshot: Arc<Mutex<Snapshot>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    model_thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("speed must be a positive number, got {0}")]
    Speed(f64),
}

fn lock(snapshot: &Mutex<Snapshot>) -> std::sync::MutexGuard<'_, Snapshot> {
    snapshot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wall-clock pacing of the model thread.
const TICK: Duration = Duration::from_millis(50);

impl WorkloadServer {
    /// Starts the model thread, the replica poller and the metrics endpoint. The poller asks
    /// `read_replicas` for the consumer count every 200 ms; `None` keeps the last count.
    pub async fn start<Read, Reading>(
        mut model: Model,
        options: ServeOptions,
        read_replicas: Read,
    ) -> Result<Self, ServeError>
    where
        Read: FnMut() -> Reading + Send + 'static,
        Reading: Future<Output = Option<u32>> + Send + 'static,
    {
        if options.consumers == ConsumerCount::ReadyPods {
            model.pod_start_delay = 0.0;
        }
        if !(options.speed.is_finite() && options.speed > 0.0) {
            return Err(ServeError::Speed(options.speed));
        }
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| ServeError::Listen {
                address: options.listen,
                source,
            })?;
        let address = listener.local_addr().map_err(|source| ServeError::Listen {
            address: options.listen,
            source,
        })?;
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let replicas = Arc::new(AtomicU32::new(model.initial_replicas));

        let model_thread = {
            let (snapshot, stop, replicas) = (snapshot.clone(), stop.clone(), replicas.clone());
            let speed = options.speed;
            std::thread::spawn(move || run_model(&model, speed, &snapshot, &stop, &replicas))
        };

        let poller = tokio::spawn(poll_replicas(read_replicas, replicas, stop.clone()));
        let app = Router::new()
            .route("/metrics", get(metrics))
            .with_state((snapshot.clone(), options.clone()));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            snapshot,
            stop,
            tasks: vec![poller, server],
            model_thread: Some(model_thread),
        })
    }

    pub fn snapshot(&self) -> Snapshot {
        lock(&self.snapshot).clone()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks.drain(..) {
            task.abort();
        }
        if let Some(thread) = self.model_thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for WorkloadServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Steps the model to keep up with wall-clock time × speed.
fn run_model(
    model: &Model,
    speed: f64,
    snapshot: &Mutex<Snapshot>,
    stop: &AtomicBool,
    replicas: &AtomicU32,
) {
    let mut workload = Workload::new(model);
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let wanted = replicas.load(Ordering::SeqCst);
        if wanted != workload.replicas() {
            workload.scale_to(wanted);
        }
        let target = (started.elapsed().as_secs_f64() * speed).min(model.duration);
        while workload.now + model.step <= target {
            workload.step();
        }
        *lock(snapshot) = Snapshot {
            model_time: workload.now,
            produced_total: workload.produced_total,
            completed_total: workload.completed_total,
            partition_backlogs: workload.partition_backlogs(),
            oldest_age: workload.oldest_age() / speed,
            replicas: workload.replicas(),
            ready: workload.ready_replicas(),
            produce_rate: model.production_rate(workload.now),
            capacity: workload.capacity(),
            finished: workload.now + model.step > model.duration,
        };
        std::thread::sleep(TICK);
    }
}

/// Follows the replica count the caller reads.
async fn poll_replicas<Read, Reading>(
    mut read_replicas: Read,
    replicas: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
) where
    Read: FnMut() -> Reading,
    Reading: Future<Output = Option<u32>>,
{
    while !stop.load(Ordering::SeqCst) {
        if let Some(count) = read_replicas().await {
            replicas.store(count, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn metrics(
    State((snapshot, options)): State<(Arc<Mutex<Snapshot>>, ServeOptions)>,
) -> String {
    render(&lock(&snapshot), &options)
}

/// The exposition: kafka_exporter's series for lag and offsets, and the consumer-side series
/// no lag exporter has (oldest unfinished age, completions).
pub fn render(snapshot: &Snapshot, options: &ServeOptions) -> String {
    let topic = &options.topic;
    let group = &options.target_name;
    let partitions = snapshot.partition_backlogs.len().max(1);
    let produced_per_partition = snapshot.produced_total / partitions as f64;
    let lag: f64 = snapshot.partition_backlogs.iter().sum();
    let mut out = String::new();
    let _ = writeln!(out, "# TYPE kafka_topic_partitions gauge");
    let _ = writeln!(
        out,
        "kafka_topic_partitions{{topic=\"{topic}\"}} {partitions}"
    );
    let _ = writeln!(out, "# TYPE kafka_topic_partition_current_offset gauge");
    for partition in 0..partitions {
        let _ = writeln!(
            out,
            "kafka_topic_partition_current_offset{{topic=\"{topic}\",partition=\"{partition}\"}} {:.0}",
            produced_per_partition.floor()
        );
    }
    let _ = writeln!(out, "# TYPE kafka_consumergroup_lag gauge");
    for (partition, backlog) in snapshot.partition_backlogs.iter().enumerate() {
        let _ = writeln!(
            out,
            "kafka_consumergroup_lag{{consumergroup=\"{group}\",topic=\"{topic}\",partition=\"{partition}\"}} {:.0}",
            backlog.round()
        );
    }
    let _ = writeln!(out, "# TYPE kafka_consumergroup_lag_sum gauge");
    let _ = writeln!(
        out,
        "kafka_consumergroup_lag_sum{{consumergroup=\"{group}\",topic=\"{topic}\"}} {:.0}",
        lag.round()
    );
    let _ = writeln!(
        out,
        "# TYPE consumer_oldest_unfinished_event_age_seconds gauge"
    );
    let _ = writeln!(
        out,
        "consumer_oldest_unfinished_event_age_seconds{{consumer=\"{group}\"}} {:.3}",
        snapshot.oldest_age
    );
    let _ = writeln!(out, "# TYPE consumer_events_completed_total counter");
    let _ = writeln!(
        out,
        "consumer_events_completed_total{{consumer=\"{group}\"}} {:.0}",
        snapshot.completed_total.floor()
    );
    let _ = writeln!(out, "# TYPE workload_replicas gauge");
    let _ = writeln!(
        out,
        "workload_replicas{{consumer=\"{group}\"}} {}",
        snapshot.replicas
    );
    let _ = writeln!(
        out,
        "workload_ready_replicas{{consumer=\"{group}\"}} {}",
        snapshot.ready
    );
    out
}

/// A model duration at `speed`, as a Go duration string for a budget.
pub fn wall_duration(model_seconds: f64, speed: f64) -> String {
    let millis = (model_seconds / speed * 1000.0).round().max(0.0);
    backlog_consumer::format_go_duration(Duration::from_millis(millis as u64))
}
