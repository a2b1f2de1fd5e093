//! Starting and stopping the control-plane processes.
//!
//! Two lifetimes exist. *Owned* processes belong to a `LocalCluster` value
//! (tests): they get `PR_SET_PDEATHSIG=SIGKILL`, so they die with the test
//! process even when it is killed. The kernel sends that signal when the
//! *thread* that forked the child exits, so owned processes are spawned from a
//! dedicated thread that lives exactly as long as the cluster, whichever
//! thread started it. *Detached* processes (`local-cluster up`) run in a
//! session of their own and outlive the command; their pids are recorded in
//! pid files so `down` can stop them later.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{Error, io_error};

/// How often state is polled while waiting for a process to start or stop.
const POLL: Duration = Duration::from_millis(50);

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The thread that forks owned processes; see the module comment.
pub(crate) struct Spawner {
    requests: Option<mpsc::Sender<SpawnRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    pub(crate) fn new() -> Result<Self, Error> {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        let thread = thread::Builder::new()
            .name("local-cluster-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    // The requester may have gone away; then the child is
                    // dropped here and its pdeathsig fires with this thread.
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(|e| io_error("starting the process-spawner thread", e))?;
        Ok(Spawner {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    fn spawn(&self, command: Command) -> io::Result<Child> {
        let gone = || io::Error::other("the process-spawner thread has stopped");
        let (reply, answer) = mpsc::channel();
        self.requests
            .as_ref()
            .ok_or_else(gone)?
            .send((command, reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One started process.
pub(crate) struct Process {
    pub name: &'static str,
    pub pid: u32,
    pub log: PathBuf,
    pid_file: PathBuf,
    /// Present while this process (of ours) is its parent.
    child: Option<Child>,
}

/// Starts `program` with its output in `<state_dir>/<name>.log` and its pid
/// in `<state_dir>/<name>.pid`. With a spawner the process is owned, without
/// one it is detached. With `netns` (a file such as `/run/netns/NAME`) it runs
/// in that network namespace, and only there: it shares every other namespace,
/// the mounts included, with this process.
pub(crate) fn spawn(
    spawner: Option<&Spawner>,
    name: &'static str,
    program: &Path,
    args: &[String],
    state_dir: &Path,
    netns: Option<&Path>,
) -> Result<Process, Error> {
    spawn_named(spawner, name, name, program, args, state_dir, netns)
}

/// Like [`spawn`], with the log and pid files named after `files` instead of `name` (a
/// component started again keeps the log of its first run).
pub(crate) fn spawn_named(
    spawner: Option<&Spawner>,
    name: &'static str,
    files: &str,
    program: &Path,
    args: &[String],
    state_dir: &Path,
    netns: Option<&Path>,
) -> Result<Process, Error> {
    let log = state_dir.join(format!("{files}.log"));
    let out = File::create(&log).map_err(|e| io_error(format!("creating {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| io_error(format!("opening {}", log.display()), e))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(state_dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // Opened here, entered in the child between fork and exec; closed on exec.
    let namespace = netns
        .map(|path| {
            File::open(path).map_err(|e| io_error(format!("opening {}", path.display()), e))
        })
        .transpose()?;
    if let Some(namespace) = &namespace {
        let fd = namespace.as_raw_fd();
        // SAFETY: setns is a plain, async-signal-safe syscall.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    let child = match spawner {
        Some(spawner) => {
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: only async-signal-safe calls (prctl, getppid, _exit)
            // run between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The parent may have died before prctl took effect.
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    Ok(())
                });
            }
            spawner.spawn(command)
        }
        None => {
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                command.pre_exec(|| {
                    // A session of its own: no terminal signals (Ctrl-C in the
                    // shell that ran `up`) reach it.
                    if libc::setsid() < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            command.spawn()
        }
    }
    .map_err(|e| io_error(format!("starting {}", program.display()), e))?;

    let pid = child.id();
    let pid_file = state_dir.join(format!("{files}.pid"));
    let process = Process {
        name,
        pid,
        log,
        pid_file,
        child: Some(child),
    };
    fs::write(&process.pid_file, format!("{pid}\n"))
        .map_err(|e| io_error(format!("writing {}", process.pid_file.display()), e))?;
    Ok(process)
}

impl Process {
    /// `Some(description)` once the process has exited.
    pub(crate) fn exit_status(&mut self) -> Option<String> {
        match self.child.as_mut() {
            Some(child) => match child.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                Ok(None) => None,
                Err(e) => Some(format!("unknown state: {e}")),
            },
            None => (!is_alive(self.pid)).then(|| "exited".to_string()),
        }
    }

    /// Gives up parenthood: the process keeps running after we are gone
    /// (detached mode, once it is ready).
    pub(crate) fn release(mut self) {
        self.child.take();
    }

    /// SIGKILL at once, as a crash; waits for the exit. Removes the pid file.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        } else {
            kill_pid(self.pid);
        }
        let _ = fs::remove_file(&self.pid_file);
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Removes the pid file.
    pub(crate) fn stop(&mut self, timeout: Duration) {
        if let Some(mut child) = self.child.take() {
            if let Ok(None) = child.try_wait() {
                signal(self.pid, libc::SIGTERM);
                let deadline = Instant::now() + timeout;
                while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    thread::sleep(POLL);
                }
                if let Ok(None) = child.try_wait() {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        } else {
            terminate_pid(self.pid, timeout);
        }
        let _ = fs::remove_file(&self.pid_file);
    }
}

/// Stops a process known only by its pid (recorded by an earlier `up`).
pub(crate) fn terminate_pid(pid: u32, timeout: Duration) {
    if !is_alive(pid) {
        return;
    }
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && is_alive(pid) {
        thread::sleep(POLL);
    }
    if is_alive(pid) {
        signal(pid, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && is_alive(pid) {
            thread::sleep(POLL);
        }
    }
}

/// SIGKILL to a process known by its pid (an owned child is reaped by its `Process` later).
pub(crate) fn kill_pid(pid: u32) {
    if is_alive(pid) {
        signal(pid, libc::SIGKILL);
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain syscall; a vanished pid only yields ESRCH.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Alive and not a zombie (a zombie has exited; only its parent's wait is
/// missing).
pub(crate) fn is_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself
    // contain spaces or parentheses.
    match stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
    {
        Some(state) => state != "Z" && state != "X",
        None => false,
    }
}

/// Whether `pid` is one of the processes started for `state_dir`: each of
/// them has the state directory (or, for a node, its runtime directory, also
/// given) in its command line. Guards `down` against signalling an unrelated
/// process that reused a recorded pid.
pub(crate) fn belongs_to(pid: u32, state_dir: &Path) -> bool {
    belongs_to_any(pid, &[state_dir])
}

pub(crate) fn belongs_to_any(pid: u32, dirs: &[&Path]) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    dirs.iter().any(|dir| {
        let needle = dir.as_os_str().as_encoded_bytes();
        !needle.is_empty() && cmdline.windows(needle.len()).any(|w| w == needle)
    })
}

/// The pid recorded in a pid file.
pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_of_pids() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX));
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("x.log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        fs::write(&log, text).expect("write");
        assert_eq!(log_tail(&log, 2), "line 99\nline 100");
        assert!(log_tail(&dir.path().join("none"), 2).contains("no log"));
    }
}
