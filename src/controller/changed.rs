//! A watch filtered to the objects whose generation, labels or annotations changed since it
//! last passed them on: what a reconcile reads of an object besides what it wrote itself, so
//! its own status writes do not trigger it again.
//!
//! kube's `predicate_filter` does the same with a key of three strings per object (its name,
//! namespace and uid); at thousands of budgets that was two hundred bytes a budget. Here an
//! object is a keyed 64-bit digest of those, and what it last showed another: two objects
//! sharing a digest could hide a change of one behind the other only if their properties
//! also shared one, which the random key makes as likely as guessing it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use kube::Resource;
use kube::runtime::watcher;
use tokio::time::Instant;

/// An object not seen for this long is forgotten (deleted objects do not stay), and passed on
/// again when it shows up, as kube's filter does.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// `events`, less the objects whose generation, labels and annotations are as last passed on.
pub fn only_changed<K, S>(events: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Send,
    S: Stream<Item = Result<K, watcher::Error>> + Send,
{
    let mut seen = Seen::new(Instant::now());
    events.filter(move |event| {
        future::ready(match event {
            Ok(object) => seen.changed(object, Instant::now()),
            Err(_) => true,
        })
    })
}

struct Seen {
    keys: RandomState,
    /// By object: what it showed, and when (seconds after `started`).
    objects: HashMap<u64, (u64, u32)>,
    started: Instant,
    swept_at: u32,
}

impl Seen {
    fn new(started: Instant) -> Self {
        Seen {
            keys: RandomState::new(),
            objects: HashMap::new(),
            started,
            swept_at: 0,
        }
    }

    fn changed<K: Resource>(&mut self, object: &K, now: Instant) -> bool {
        let meta = object.meta();
        let key = self.keys.hash_one((&meta.namespace, &meta.name, &meta.uid));
        let shows = self
            .keys
            .hash_one((meta.generation, &meta.labels, &meta.annotations));
        let forget_after = u32::try_from(FORGET_AFTER.as_secs()).unwrap_or(u32::MAX);
        let at = u32::try_from(now.saturating_duration_since(self.started).as_secs())
            .unwrap_or(u32::MAX);
        if at.saturating_sub(self.swept_at) >= forget_after {
            self.objects
                .retain(|_, (_, seen_at)| at.saturating_sub(*seen_at) < forget_after);
            self.swept_at = at;
        }
        match self.objects.insert(key, (shows, at)) {
            Some((showed, seen_at)) => {
                showed != shows || at.saturating_sub(seen_at) >= forget_after
            }
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn object(name: &str, generation: i64, label: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                uid: Some(format!("uid-{name}")),
                generation: Some(generation),
                labels: Some(BTreeMap::from([("tier".into(), label.into())])),
                resource_version: Some(format!("{generation}{label}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_new_objects_and_changes_of_what_a_reconcile_reads_pass() {
        let start = Instant::now();
        let mut seen = Seen::new(start);
        assert!(seen.changed(&object("a", 1, "x"), start));
        assert!(seen.changed(&object("b", 1, "x"), start));
        // A status write: a new resourceVersion, the same generation, labels and annotations.
        let mut written = object("a", 1, "x");
        written.metadata.resource_version = Some("99".into());
        assert!(!seen.changed(&written, start));
        assert!(seen.changed(&object("a", 2, "x"), start));
        assert!(seen.changed(&object("a", 2, "y"), start));
        let mut annotated = object("a", 2, "y");
        annotated.metadata.annotations = Some(BTreeMap::from([("note".into(), "1".into())]));
        assert!(seen.changed(&annotated, start));
        assert!(!seen.changed(&annotated, start));
        // Deleted and created again under its name: another object.
        let mut successor = object("b", 1, "x");
        successor.metadata.uid = Some("uid-b2".into());
        assert!(seen.changed(&successor, start));
    }

    #[test]
    fn objects_not_seen_for_long_are_forgotten_and_pass_again() {
        let start = Instant::now();
        let mut seen = Seen::new(start);
        assert!(seen.changed(&object("a", 1, "x"), start));
        assert!(seen.changed(&object("gone", 1, "x"), start));
        let later = start + FORGET_AFTER / 2;
        assert!(!seen.changed(&object("a", 1, "x"), later));
        let much_later = start + FORGET_AFTER + Duration::from_secs(1);
        assert!(!seen.changed(&object("a", 1, "x"), much_later));
        assert_eq!(
            seen.objects.len(),
            1,
            "the one not seen for an hour is gone"
        );
        assert!(seen.changed(&object("gone", 1, "x"), much_later));
    }

    #[tokio::test]
    async fn the_stream_drops_what_did_not_change() {
        let events = futures::stream::iter(vec![
            Ok(object("a", 1, "x")),
            Ok(object("a", 1, "x")),
            Ok(object("a", 2, "x")),
        ]);
        let passed: Vec<_> = only_changed(events).collect().await;
        let generations: Vec<_> = passed
            .iter()
            .filter_map(|event| event.as_ref().ok()?.metadata.generation)
            .collect();
        assert_eq!(generations, [1, 2]);
    }
}
