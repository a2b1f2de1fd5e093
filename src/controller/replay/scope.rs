//! Freezing the scope on first sight: the ids, inline or from a ConfigMap, are copied into an
//! immutable ConfigMap owned by the replay. Later edits of the source change nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use crate::api::replay_job::{FrozenScope, ReplayJob};
use crate::controller::apply::FIELD_MANAGER;
use crate::controller::error::{Error, KubeContext};
use crate::core::replay_plan::scope_config_map_name;
use crate::core::replay_scope::{
    FrozenIds, ScopeProblem, check_id_list, freeze as freeze_ids, parse_id_lines,
};

use super::job::{EVENT_IDS_KEY, LABEL_REPLAY};

/// The outcome of an attempt to freeze.
pub enum Freeze {
    Frozen(FrozenScope),
    /// Why not, and whether waiting can help.
    NotFrozen {
        message: String,
        permanent: bool,
    },
}

fn not_yet(message: String) -> Freeze {
    Freeze::NotFrozen {
        message,
        permanent: false,
    }
}

/// Where the ids come from.
enum Source<'a> {
    Inline(&'a [String]),
    ConfigMap { name: &'a str, key: &'a str },
    None,
}

fn source(replay: &ReplayJob) -> Source<'_> {
    let scope = &replay.spec.scope;
    match (&scope.event_ids_from, scope.event_ids.as_slice()) {
        (Some(from), _) => Source::ConfigMap {
            name: &from.name,
            key: &from.key,
        },
        (None, []) => Source::None,
        (None, ids) => Source::Inline(ids),
    }
}

fn frozen_scope(config_map: &str, ids: &FrozenIds, at: Timestamp) -> FrozenScope {
    FrozenScope {
        config_map: config_map.to_owned(),
        count: i32::try_from(ids.count()).unwrap_or(i32::MAX),
        sha256: ids.sha256().to_owned(),
        frozen_at: Time(at),
    }
}

/// Freezes the scope of `replay` (whose uid is `uid`), or says why it cannot yet.
pub async fn freeze(
    client: &kube::Client,
    replay: &ReplayJob,
    namespace: &str,
    uid: &str,
    now: Timestamp,
) -> Result<Freeze, Error> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = scope_config_map_name(&replay.name_any(), uid);

    // An earlier reconcile may have frozen the list and stopped before writing the status: the
    // ConfigMap then is the frozen list, whatever the source says by now.
    let existing = config_maps
        .get_opt(&name)
        .await
        .context(|| format!("reading ConfigMap {namespace}/{name}"))?;
    if let Some(existing) = existing {
        if !existing.owner_references().iter().any(|o| o.uid == uid) {
            return Ok(not_yet(format!(
                "ConfigMap {name} exists but is not owned by this ReplayJob; the frozen scope must be written by the operator: delete that ConfigMap"
            )));
        }
        let text = existing
            .data
            .as_ref()
            .and_then(|d| d.get(EVENT_IDS_KEY))
            .cloned()
            .unwrap_or_default();
        let source_name = format!("ConfigMap {name} key {EVENT_IDS_KEY}");
        let frozen = parse_id_lines(&text, &source_name)
            .and_then(|ids| freeze_ids(ids, &source_name))
            .map_err(|problem| problem.to_string());
        return Ok(match frozen {
            Ok(ids) => Freeze::Frozen(frozen_scope(
                &name,
                &ids,
                existing
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .unwrap_or(now),
            )),
            Err(message) => Freeze::NotFrozen {
                message: format!("{message}; the frozen scope was altered: delete this ReplayJob"),
                permanent: true,
            },
        });
    }

    let checked = match source(replay) {
        Source::None => {
            return Ok(Freeze::NotFrozen {
                message: ScopeProblem::NoEventIds.to_string(),
                permanent: true,
            });
        }
        // The inline list is immutable: a problem with it never goes away.
        Source::Inline(ids) => match check_id_list(ids, "spec.scope.eventIds")
            .and_then(|ids| freeze_ids(ids, "spec.scope.eventIds"))
        {
            Ok(frozen) => frozen,
            Err(problem) => {
                return Ok(Freeze::NotFrozen {
                    message: format!("{problem}; create a new ReplayJob with a corrected list"),
                    permanent: true,
                });
            }
        },
        // The source ConfigMap can still be fixed until the scope is frozen.
        Source::ConfigMap { name: source, key } => {
            let found = config_maps
                .get_opt(source)
                .await
                .context(|| format!("reading ConfigMap {namespace}/{source}"))?;
            let Some(found) = found else {
                return Ok(not_yet(format!(
                    "spec.scope.eventIdsFrom: ConfigMap {source} does not exist in namespace {namespace}; create it with the event ids one per line under key {key}"
                )));
            };
            let Some(text) = found.data.as_ref().and_then(|d| d.get(key)) else {
                return Ok(not_yet(format!(
                    "spec.scope.eventIdsFrom: ConfigMap {source} has no key {key}; put the event ids there, one per line"
                )));
            };
            let source_name = format!("spec.scope.eventIdsFrom (ConfigMap {source} key {key})");
            match parse_id_lines(text, &source_name).and_then(|ids| freeze_ids(ids, &source_name)) {
                Ok(frozen) => frozen,
                Err(problem) => return Ok(not_yet(problem.to_string())),
            }
        }
    };

    let Some(owner) = replay.controller_owner_ref(&()) else {
        return Ok(not_yet(
            "the ReplayJob has no uid yet; the scope is frozen once the API server assigned one"
                .to_owned(),
        ));
    };
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                ),
                (LABEL_REPLAY.to_owned(), replay.name_any()),
            ])),
            annotations: Some(BTreeMap::from([(
                "backlog.dev/sha256".to_owned(),
                checked.sha256().to_owned(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            EVENT_IDS_KEY.to_owned(),
            checked.text().to_owned(),
        )])),
        immutable: Some(true),
        ..ConfigMap::default()
    };
    config_maps
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&config_map),
        )
        .await
        .context(|| format!("creating the frozen scope ConfigMap {namespace}/{name}"))?;
    Ok(Freeze::Frozen(frozen_scope(&name, &checked, now)))
}
