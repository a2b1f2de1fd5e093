//! The reference Compensation worker (see README.md next to this crate for the contract). It has
//! no business system: the state it reads is `COMPENSATION_WORKER_CURRENT` (`state@version`),
//! and "executing" a sub-action is one JSON line on stdout with its operation id. Everything
//! else is what a real worker must do: check the request's sha256, read the current state and
//! stop without doing anything if it is not the expected one, run each sub-action once under
//! its stable operation id, stop at the first one that fails or whose outcome is not known,
//! and report every outcome in the termination message.
//!
//! `COMPENSATION_WORKER_FAIL` / `COMPENSATION_WORKER_LOSE` name a sub-action whose call the
//! simulated system refuses / never answers; `COMPENSATION_WORKER_STEP_SECONDS` is how long
//! each sub-action takes. They show failures and unknown outcomes, and are used in tests.

use std::env;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn var(name: &str) -> Result<String, String> {
    env::var(name).map_err(|_| format!("{name} is not set; is this pod started by a Compensation?"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Now as RFC 3339 (UTC, whole seconds), without a time library.
fn now() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        (rest % 3600) / 60,
        rest % 60
    )
}

fn text<'a>(value: &'a Value, path: &[&str]) -> Result<&'a str, String> {
    let mut at = value;
    for key in path {
        at = at
            .get(key)
            .ok_or_else(|| format!("the request has no {}", path.join(".")))?;
    }
    at.as_str()
        .ok_or_else(|| format!("{} is not a string", path.join(".")))
}

/// Runs the compensation and returns its report and whether everything succeeded.
fn run() -> Result<(Value, bool), String> {
    let file = var("COMPENSATION_REQUEST_FILE")?;
    let approved_sha = var("COMPENSATION_REQUEST_SHA256")?;
    let bytes = std::fs::read(&file).map_err(|e| format!("reading {file}: {e}"))?;
    let sha = sha256_hex(&bytes);
    if sha != approved_sha {
        // Not the approved request: nothing is done, and the report says what was found.
        let report = json!({
            "requestSha256": sha,
            "precondition": {"held": false, "observed": "", "message": format!("{file} has sha256 {sha}, not the approved {approved_sha}; refusing to act")},
            "subActions": [],
        });
        return Ok((report, false));
    }
    let request: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{file}: {e}"))?;
    let expected = format!(
        "{}@{}",
        text(&request, &["expectedCurrentStateAndVersion", "state"])?,
        text(&request, &["expectedCurrentStateAndVersion", "version"])?
    );
    // A real worker reads the business system here, by the request's businessKey.
    let current = env::var("COMPENSATION_WORKER_CURRENT").unwrap_or_else(|_| expected.clone());
    if current != expected {
        let report = json!({
            "requestSha256": sha,
            "precondition": {"held": false, "observed": current, "message": format!("expected {expected}: the state moved on since the request; nothing was done")},
            "subActions": [],
        });
        return Ok((report, true));
    }
    let fail = env::var("COMPENSATION_WORKER_FAIL").unwrap_or_default();
    let lose = env::var("COMPENSATION_WORKER_LOSE").unwrap_or_default();
    let step = env::var("COMPENSATION_WORKER_STEP_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(0.0);
    let sub_actions = request
        .get("proposedAction")
        .and_then(|a| a.get("subActions"))
        .and_then(Value::as_array)
        .ok_or("the request has no proposedAction.subActions")?;
    let mut records = Vec::new();
    let mut all_succeeded = true;
    for sub_action in sub_actions {
        let name = text(sub_action, &["name"])?;
        let operation_id = text(sub_action, &["operationId"])?;
        let started_at = now();
        std::thread::sleep(Duration::from_secs_f64(step));
        // A real worker calls the business system with operation_id as the idempotency key.
        let (state, message) = if name == lose {
            (
                "Unknown",
                "the call went out and no answer came back; look it up by its operation id",
            )
        } else if name == fail {
            ("Failed", "the system refused the call")
        } else {
            println!(
                "{}",
                json!({"operationId": operation_id, "subAction": name, "at": started_at})
            );
            ("Succeeded", "")
        };
        records.push(json!({
            "name": name,
            "operationId": operation_id,
            "state": state,
            "startedAt": started_at,
            "finishedAt": now(),
            "message": message,
        }));
        if state != "Succeeded" {
            all_succeeded = false;
            // Nothing after a failure or an unknown outcome: the rest waits for a person.
            break;
        }
    }
    let report = json!({
        "requestSha256": sha,
        "precondition": {"held": true, "observed": current},
        "subActions": records,
    });
    Ok((report, all_succeeded))
}

fn main() -> ExitCode {
    let report_file =
        env::var("COMPENSATION_REPORT_FILE").unwrap_or_else(|_| "/dev/termination-log".into());
    match run() {
        Ok((report, succeeded)) => {
            if let Err(error) = std::fs::write(&report_file, report.to_string()) {
                eprintln!("writing the report to {report_file}: {error}");
                return ExitCode::FAILURE;
            }
            if succeeded {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(problem) => {
            // No report: the operator records every sub-action as unknown.
            eprintln!("{problem}");
            ExitCode::FAILURE
        }
    }
}
