//! The operator binary's allocator options (src/main.rs) are in effect: jemalloc reads them
//! from an exported symbol before `main`, and a misspelt symbol or option would be ignored
//! without a word, leaving freed memory resident. jemalloc prints the options it runs with
//! when asked to print its statistics at exit.

#![cfg(feature = "jemalloc")]

use std::process::Command;

#[test]
fn the_binary_returns_free_pages_from_a_background_thread() {
    let out_dir = std::env::temp_dir().join(format!("allocator-test-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_backlog-operator"))
        .args(["crd", "--output-dir"])
        .arg(&out_dir)
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("run backlog-operator crd");
    let _ = std::fs::remove_dir_all(&out_dir);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for option in [
        "opt.background_thread: true",
        "opt.dirty_decay_ms: 1000",
        "opt.muzzy_decay_ms: 0",
        "opt.narenas: 1",
        "opt.tcache: false",
    ] {
        assert!(
            printed.contains(option),
            "{option} is not in jemalloc's statistics:\n{printed}"
        );
    }
}
