//! Faults for tests: kill a component of a running control plane and start it again with the
//! same flags, ports and data, while the cluster value stays shared (`&self`) by the tests.
//! Only the control plane without a node (the node's components run in their own namespace).

use std::time::{Duration, Instant};

use crate::http::Http;
use crate::process;
use crate::{Error, LocalCluster, POLL, STOP_TIMEOUT, apiserver_probe, prometheus_probe};

/// The components that can be killed and started again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restartable {
    ApiServer,
    Prometheus,
}

impl Restartable {
    fn name(self) -> &'static str {
        match self {
            Restartable::ApiServer => "kube-apiserver",
            Restartable::Prometheus => "prometheus",
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LocalCluster {
    /// Kills `component` with SIGKILL, as a crash would, and waits until it is gone. Its ports
    /// and data stay; [`start_again`](Self::start_again) brings it back.
    pub fn kill(&self, component: Restartable) -> Result<(), Error> {
        self.refuse_on_node()?;
        let name = component.name();
        let restarted = {
            let mut list = lock(&self.restarted);
            let index = list.iter().position(|p| p.name == name);
            index.map(|i| list.remove(i))
        };
        let pid = match &restarted {
            Some(process) => process.pid,
            None => self
                .processes
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.pid)
                .ok_or_else(|| Error::InvalidArgument(format!("{name} does not run here")))?,
        };
        if let Some(mut process) = restarted {
            process.kill();
        } else {
            process::kill_pid(pid);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while process::is_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if process::is_alive(pid) {
            return Err(Error::InvalidArgument(format!(
                "{name} (pid {pid}) survived SIGKILL"
            )));
        }
        Ok(())
    }

    /// Starts `component` again with the flags, ports and data directory it had, and waits
    /// until it answers its readiness probe.
    pub fn start_again(&self, component: Restartable) -> Result<(), Error> {
        self.refuse_on_node()?;
        let name = component.name();
        let (program, args) = self
            .launched
            .get(name)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("{name} was never started here")))?;
        let spawner = self.spawner.as_ref().ok_or_else(|| {
            Error::InvalidArgument("a detached cluster cannot restart components".into())
        })?;
        // The log of the first run is kept: the new one gets a name of its own.
        let process = process::spawn_named(
            Some(spawner),
            name,
            &format!("{name}.restarted"),
            &program,
            &args,
            &self.info.state_dir,
            None,
        )?;
        let log = process.log.clone();
        lock(&self.restarted).push(process);
        let http = Http::new(Some(&self.ca_pem))?;
        let admin = self.info.tokens.get("admin").cloned();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let probe = match component {
                Restartable::ApiServer => {
                    apiserver_probe(&http, &self.info.apiserver_url, admin.as_deref())
                }
                Restartable::Prometheus => prometheus_probe(
                    &http,
                    self.info.prometheus_url.as_deref().unwrap_or_default(),
                ),
            };
            let last = match probe {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    component: name,
                    timeout: Duration::from_secs(60),
                    last,
                    tail: process::log_tail(&log, 40),
                    log,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    fn refuse_on_node(&self) -> Result<(), Error> {
        if self.info.node.is_some() {
            return Err(Error::InvalidArgument(
                "components of a cluster with a node cannot be restarted".into(),
            ));
        }
        Ok(())
    }

    /// Stops what [`start_again`](Self::start_again) started (before the rest of the cluster).
    pub(crate) fn stop_restarted(&mut self) {
        let mut restarted = lock(&self.restarted);
        while let Some(mut process) = restarted.pop() {
            process.stop(STOP_TIMEOUT);
        }
    }
}
