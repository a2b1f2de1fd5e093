//! Proves the test environment itself: a real API server of the pinned
//! version, real authentication and RBAC, and a real Prometheus that picks up
//! scrape targets added at runtime.

mod support;

use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![
            server_reports_the_pinned_version,
            rbac_forbids_carol_but_not_admin,
            users_authenticate_with_their_groups,
            fresh_namespaces_are_distinct,
            prometheus_scrapes_targets_added_at_runtime,
        ],
        true,
    )
}

fn server_reports_the_pinned_version(env: &TestEnv) {
    let version = env
        .block_on(env.admin().apiserver_version())
        .expect("GET /version");
    assert_eq!(
        version.git_version,
        format!("v{}", local_cluster::kubernetes_version())
    );
    assert_eq!(local_cluster::kubernetes_version(), "1.36.3");
}

fn rbac_forbids_carol_but_not_admin(env: &TestEnv) {
    env.block_on(async {
        let as_admin = Api::<Namespace>::all(env.admin())
            .list(&ListParams::default())
            .await
            .expect("admin lists namespaces");
        assert!(
            as_admin
                .items
                .iter()
                .any(|ns| ns.metadata.name.as_deref() == Some("kube-system"))
        );

        match Api::<Namespace>::all(env.client("carol"))
            .list(&ListParams::default())
            .await
        {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
            other => panic!("carol listing namespaces: expected 403 Forbidden, got {other:?}"),
        }
    });
}

fn users_authenticate_with_their_groups(env: &TestEnv) {
    let expected: [(&str, &[&str]); 4] = [
        ("admin", &["system:masters", "system:authenticated"]),
        ("alice", &["backlog-approvers", "system:authenticated"]),
        ("bob", &["backlog-approvers", "system:authenticated"]),
        ("carol", &["system:authenticated"]),
    ];
    env.block_on(async {
        for (user, groups) in expected {
            let review = Api::<SelfSubjectReview>::all(env.client(user))
                .create(&PostParams::default(), &SelfSubjectReview::default())
                .await
                .unwrap_or_else(|e| panic!("SelfSubjectReview as {user}: {e}"));
            let info = review
                .status
                .and_then(|s| s.user_info)
                .unwrap_or_else(|| panic!("SelfSubjectReview of {user} without userInfo"));
            assert_eq!(info.username.as_deref(), Some(user));
            let mut got = info.groups.unwrap_or_default();
            got.sort();
            let mut want: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
            want.sort();
            assert_eq!(got, want, "groups of {user}");
        }
    });
}

fn fresh_namespaces_are_distinct(env: &TestEnv) {
    let a = env.fresh_namespace("Support Check");
    let b = env.fresh_namespace("Support Check");
    assert_ne!(a, b);
    assert!(a.starts_with("support-check-"), "{a}");
    env.block_on(async {
        let namespaces = Api::<Namespace>::all(env.admin());
        for name in [&a, &b] {
            namespaces
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
        }
    });
}

fn prometheus_scrapes_targets_added_at_runtime(env: &TestEnv) {
    let exporter = support::exporter::Exporter::start();
    exporter.set("local_cluster_test_gauge", &[], 42.0);
    let job = "control-plane-test";
    env.add_scrape_target(job, &exporter.target(), &[("origin", "test")]);

    let prometheus =
        prometheus_http_query::Client::try_from(env.prometheus_url()).expect("Prometheus client");
    env.block_on(async {
        let up_query = format!(r#"up{{job="{job}",origin="test"}}"#);
        wait_until(
            Duration::from_secs(30),
            "Prometheus scrapes the runtime target (up == 1)",
            || async {
                let result = prometheus
                    .query(&up_query)
                    .get()
                    .await
                    .map_err(|e| e.to_string())?;
                match result.data() {
                    prometheus_http_query::response::Data::Vector(v)
                        if v.iter().any(|s| s.sample().value() == 1.0) =>
                    {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;

        let gauge = prometheus
            .query(format!(r#"local_cluster_test_gauge{{job="{job}"}}"#))
            .get()
            .await
            .expect("query the gauge");
        match gauge.data() {
            prometheus_http_query::response::Data::Vector(v) => {
                assert_eq!(v.len(), 1, "{v:?}");
                assert_eq!(v[0].sample().value(), 42.0);
            }
            other => panic!("unexpected result {other:?}"),
        }

        env.remove_scrape_target(job);
        wait_until(
            Duration::from_secs(30),
            "Prometheus drops the removed target",
            || async {
                let targets = prometheus.targets(None).await.map_err(|e| e.to_string())?;
                let left: Vec<_> = targets
                    .active()
                    .iter()
                    .filter(|t| t.labels().get("job").map(String::as_str) == Some(job))
                    .map(|t| t.scrape_url().to_string())
                    .collect();
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("still scraped: {left:?}"))
                }
            },
        )
        .await;
    });
}
