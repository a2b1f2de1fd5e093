//! Asserting that the API server refused a request, and what its message names.

/// The API server's refusal; panics if the request went through.
pub fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        Err(other) => panic!("{what}: expected a refusal from the API server, got {other}"),
        Ok(accepted) => panic!("{what}: the API server accepted it: {accepted:?}"),
    }
}

/// Panics unless `message` contains every fragment.
pub fn assert_mentions(message: &str, fragments: &[&str], what: &str) {
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{what}: {fragment:?} is not in the message: {message}"
        );
    }
}
