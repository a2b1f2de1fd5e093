//! A metrics exporter the tests control: gauges served in the Prometheus text format on a
//! loopback port, for the real Prometheus to scrape. Stopped when dropped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

type Series = BTreeMap<(String, String), f64>;

pub struct Exporter {
    address: SocketAddr,
    series: Arc<Mutex<Series>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn labels_text(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Exporter {
    pub fn start() -> Exporter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the exporter");
        let address = listener.local_addr().expect("exporter address");
        let series: Arc<Mutex<Series>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (series, stop) = (Arc::clone(&series), Arc::clone(&stop));
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let body = render(&series);
                        let _ = answer(stream, &body);
                    }
                }
            })
        };
        Exporter {
            address,
            series,
            stop,
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:PORT`, for a scrape target.
    pub fn target(&self) -> String {
        self.address.to_string()
    }

    /// Sets a gauge sample.
    pub fn set(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.series
            .lock()
            .expect("exporter lock")
            .insert((name.to_owned(), labels_text(labels)), value);
    }

    /// Removes a sample: the series goes stale in Prometheus.
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) {
        self.series
            .lock()
            .expect("exporter lock")
            .remove(&(name.to_owned(), labels_text(labels)));
    }
}

fn render(series: &Mutex<Series>) -> String {
    let series = series.lock().expect("exporter lock");
    let mut body = String::new();
    let mut typed = std::collections::BTreeSet::new();
    for ((name, labels), value) in series.iter() {
        if typed.insert(name.clone()) {
            body.push_str(&format!("# TYPE {name} gauge\n"));
        }
        body.push_str(&format!("{name}{labels} {value}\n"));
    }
    body
}

fn answer(mut stream: TcpStream, body: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    // Read the request head; the path does not matter.
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    stream.shutdown(Shutdown::Both)
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
