//! The reference ReplayJob worker (see README.md next to this crate for the contract). It has
//! no broker: "replaying" an event is one JSON line on stdout with the operation id, the event
//! id and the destination, at the rate the replay allows. Everything else is what a real worker
//! must do: check the frozen list's sha256 first, replay exactly its batch in file order, wait
//! `REPLAY_PAUSE_BETWEEN`, and exit non-zero unless every event of the batch was replayed.
//!
//! `REPLAY_WORKER_REJECT` (comma-separated event ids) makes the simulated destination refuse
//! those events, so a failing batch can be shown and tested.

use std::collections::BTreeSet;
use std::env;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Everything the worker reads from its environment.
#[derive(Debug, Clone, PartialEq)]
struct Contract {
    operation_id: String,
    destination: String,
    ids_file: String,
    ids_sha256: String,
    first_event: usize,
    event_count: usize,
    batch_size: usize,
    first_batch: usize,
    rate_per_second: f64,
    pause_between: Duration,
    index: usize,
    rejected: BTreeSet<String>,
}

fn var(name: &str) -> Result<String, String> {
    env::var(name).map_err(|_| format!("{name} is not set; is this pod started by a ReplayJob?"))
}

fn number<T: std::str::FromStr>(name: &str) -> Result<T, String> {
    let text = var(name)?;
    text.trim()
        .parse()
        .map_err(|_| format!("{name}={text:?} is not a number"))
}

impl Contract {
    fn from_env() -> Result<Contract, String> {
        Ok(Contract {
            operation_id: var("REPLAY_OPERATION_ID")?,
            destination: env::var("REPLAY_DESTINATION").unwrap_or_default(),
            ids_file: var("REPLAY_EVENT_IDS_FILE")?,
            ids_sha256: var("REPLAY_EVENT_IDS_SHA256")?,
            first_event: number("REPLAY_FIRST_EVENT")?,
            event_count: number("REPLAY_EVENT_COUNT")?,
            batch_size: number("REPLAY_BATCH_SIZE")?,
            first_batch: number("REPLAY_FIRST_BATCH")?,
            rate_per_second: number("REPLAY_RATE_PER_SECOND")?,
            pause_between: parse_duration(
                &env::var("REPLAY_PAUSE_BETWEEN").unwrap_or_else(|_| "0s".into()),
            )?,
            index: number("JOB_COMPLETION_INDEX")?,
            rejected: env::var("REPLAY_WORKER_REJECT")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// Lines `[start, end)` of the frozen list that batch `index` of this Job covers.
fn batch_lines(contract: &Contract) -> Result<(usize, usize), String> {
    if contract.batch_size == 0 {
        return Err("REPLAY_BATCH_SIZE is 0".into());
    }
    let job_end = contract.first_event + contract.event_count;
    let start = contract.first_event + contract.index * contract.batch_size;
    let end = (start + contract.batch_size).min(job_end);
    if start >= end {
        return Err(format!(
            "index {} is beyond this Job's {} events",
            contract.index, contract.event_count
        ));
    }
    Ok((start, end))
}

/// A Go duration of the forms the operator passes (`0s`, `250ms`, `10s`, `1m30s`, `2h`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut total = 0.0_f64;
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {text:?} lacks a unit"))?;
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("duration {text:?} is not a Go duration"))?;
        let unit_end = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |i| digits + i);
        let seconds = match &rest[digits..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => return Err(format!("duration {text:?} has an unknown unit {unit:?}")),
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn run() -> Result<(), String> {
    let contract = Contract::from_env()?;
    let bytes = std::fs::read(&contract.ids_file)
        .map_err(|e| format!("reading {}: {e}", contract.ids_file))?;
    let actual = sha256_hex(&bytes);
    if actual != contract.ids_sha256 {
        return Err(format!(
            "{} has sha256 {actual}, the replay froze {}; replaying nothing",
            contract.ids_file, contract.ids_sha256
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| "the event id list is not UTF-8")?;
    let lines: Vec<&str> = text.lines().collect();
    let (start, end) = batch_lines(&contract)?;
    let ids = lines
        .get(start..end)
        .ok_or_else(|| format!("lines {start}..{end} are beyond the list's {}", lines.len()))?;
    let batch = contract.first_batch + contract.index;
    let interval = if contract.rate_per_second > 0.0 {
        Duration::from_secs_f64(1.0 / contract.rate_per_second)
    } else {
        Duration::ZERO
    };
    let destination = if contract.destination.is_empty() {
        "(original topic)"
    } else {
        contract.destination.as_str()
    };
    eprintln!(
        "replay {}: batch {batch}, lines {start}..{end} of {}, to {destination}",
        contract.operation_id,
        lines.len()
    );
    let started = Instant::now();
    let mut refused = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        // Evenly paced: event n leaves no earlier than n intervals after the start.
        let due = started + interval * n as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let outcome = if contract.rejected.contains(*id) {
            refused.push(*id);
            "refused"
        } else {
            "replayed"
        };
        println!(
            "{{\"operationId\":{},\"eventId\":{},\"destination\":{},\"batch\":{batch},\"outcome\":\"{outcome}\"}}",
            json_string(&contract.operation_id),
            json_string(id),
            json_string(destination),
        );
    }
    thread::sleep(contract.pause_between);
    if refused.is_empty() {
        eprintln!(
            "batch {batch}: replayed {} of {} events",
            ids.len(),
            ids.len()
        );
        Ok(())
    } else {
        Err(format!(
            "batch {batch}: the destination refused {}",
            refused.join(", ")
        ))
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("replay-worker: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(first: usize, count: usize, size: usize, index: usize) -> Contract {
        Contract {
            operation_id: "replay-1".into(),
            destination: String::new(),
            ids_file: String::new(),
            ids_sha256: String::new(),
            first_event: first,
            event_count: count,
            batch_size: size,
            first_batch: 1,
            rate_per_second: 5.0,
            pause_between: Duration::ZERO,
            index,
            rejected: BTreeSet::new(),
        }
    }

    #[test]
    fn batches_tile_the_jobs_lines() {
        // A main Job of 5 events from line 2 in batches of 2: [2,4) [4,6) [6,7).
        let lines: Vec<_> = (0..3)
            .map(|i| batch_lines(&contract(2, 5, 2, i)).expect("batch"))
            .collect();
        assert_eq!(lines, [(2, 4), (4, 6), (6, 7)]);
        assert!(batch_lines(&contract(2, 5, 2, 3)).is_err());
        assert!(batch_lines(&contract(0, 5, 0, 0)).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
