//! `crds/` is generated from the Rust types and checked in (the chart, GitOps
//! users and the test control plane apply it). These tests fail when the
//! files and the types drift apart.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use backlog_operator::api;

const REGENERATE: &str =
    "regenerate with `make crds` (or `cargo run -- crd --output-dir crds`) and commit the result";

fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")
}

/// The first line where `a` and `b` differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let (mut left, mut right) = (a.lines(), b.lines());
    for number in 1.. {
        match (left.next(), right.next()) {
            (None, None) => break,
            (l, r) if l == r => continue,
            (l, r) => {
                return format!(
                    "line {number}:\n  file:      {}\n  generated: {}",
                    l.unwrap_or("<end of file>"),
                    r.unwrap_or("<end of file>")
                );
            }
        }
    }
    "only in trailing whitespace".to_string()
}

#[test]
fn every_crd_file_matches_the_types() {
    let mut drifted = Vec::new();
    for crd in api::all_crds() {
        let file = crds_dir().join(api::crd_file_name(&crd));
        let generated = api::crd_yaml(&crd).expect("serialize the CRD");
        match fs::read_to_string(&file) {
            Ok(on_disk) if on_disk == generated => {}
            Ok(on_disk) => drifted.push(format!(
                "{} differs from the types; {}",
                file.display(),
                first_difference(&on_disk, &generated)
            )),
            Err(e) => drifted.push(format!("{}: {e}", file.display())),
        }
    }
    assert!(
        drifted.is_empty(),
        "crds/ is out of date; {REGENERATE}.\n{}",
        drifted.join("\n")
    );
}

#[test]
fn crds_holds_nothing_else() {
    let expected: BTreeSet<String> = api::all_crds().iter().map(api::crd_file_name).collect();
    assert_eq!(expected.len(), 4, "one file per kind: {expected:?}");
    let present: BTreeSet<String> = fs::read_dir(crds_dir())
        .expect("read crds/")
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let extra: Vec<&String> = present.difference(&expected).collect();
    assert!(
        extra.is_empty(),
        "crds/ holds files no CRD generates: {extra:?}; delete them and {REGENERATE}"
    );
    let missing: Vec<&String> = expected.difference(&present).collect();
    assert!(missing.is_empty(), "crds/ lacks {missing:?}; {REGENERATE}");
}
