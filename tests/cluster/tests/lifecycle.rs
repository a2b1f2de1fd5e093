//! Starts real clusters (binaries from `build-control-plane.sh`'s cache or
//! `$BACKLOG_CONTROL_PLANE_BIN`) to check process ownership and cleanup.

use std::path::Path;
use std::thread;

use local_cluster::{LocalCluster, Options, Status};

fn alive(pid: u32) -> bool {
    // A zombie (state Z) has exited already.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn an_owned_cluster_outlives_its_starting_thread_and_stops_on_drop() {
    // The processes get PR_SET_PDEATHSIG, which fires when the forking
    // *thread* ends: starting from a short-lived thread must not kill them.
    let cluster = thread::spawn(|| LocalCluster::start(Options::default().prometheus(false)))
        .join()
        .expect("starter thread")
        .expect("cluster starts");
    let pids = cluster.pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    cluster
        .check_health()
        .expect("healthy after the starting thread ended");
    assert!(cluster.kubeconfig_path().is_file());
    assert!(cluster.ca_pem().contains("BEGIN CERTIFICATE"));
    assert!(cluster.apiserver_url().starts_with("https://127.0.0.1:"));
    for user in local_cluster::USERS {
        assert!(cluster.token(user).is_some(), "{user}");
    }

    let state_dir = cluster.state_dir().to_path_buf();
    drop(cluster);
    for (name, pid) in pids {
        assert!(!alive(pid), "{name} (pid {pid}) still runs after drop");
    }
    assert!(!state_dir.exists(), "temporary state dir left behind");
}

#[test]
fn a_detached_cluster_is_found_again_and_taken_down() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let dir = scratch.path().join("state");
    let info =
        LocalCluster::start_detached(Options::default().state_dir(&dir)).expect("detached start");
    let url = info.prometheus_url.clone().expect("Prometheus runs");
    assert_eq!(
        std::fs::read_to_string(dir.join("prometheus-url")).expect("prometheus-url"),
        format!("{url}\n")
    );
    match local_cluster::status(&dir).expect("status") {
        Status::Running(found) => assert_eq!(*found, info),
        other => panic!("expected a running cluster, got {other:?}"),
    }
    // A second start into the same directory must not clobber it.
    assert!(LocalCluster::start_detached(Options::default().state_dir(&dir)).is_err());

    let pids: Vec<u32> = ["etcd", "kube-apiserver", "prometheus"]
        .iter()
        .map(|name| {
            std::fs::read_to_string(dir.join(format!("{name}.pid")))
                .expect("pid file")
                .trim()
                .parse()
                .expect("pid")
        })
        .collect();
    assert!(local_cluster::down(&dir).expect("down"));
    for pid in pids {
        assert!(!alive(pid), "pid {pid} still runs after down");
    }
    assert!(!Path::new(&dir).exists());
    assert!(!local_cluster::down(&dir).expect("down again"));
}
