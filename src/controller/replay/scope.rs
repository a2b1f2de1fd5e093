//! Freezing the scope on first sight: the ids, inline or from a ConfigMap, are copied into an
//! immutable ConfigMap owned by the replay, created with a plain create so that a ConfigMap
//! someone put under its name first is never taken for it. Later edits of the source change
//! nothing, and the frozen ConfigMap is checked again before every stage.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};

use crate::api::replay_job::{FrozenScope, ReplayJob};
use crate::controller::apply::FIELD_MANAGER;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::core::replay_plan::{ScopeCheck, scope_config_map_name};
use crate::core::replay_scope::{
    FrozenIds, RecordedScope, ScopeProblem, StoredScope, check_id_list, freeze as freeze_ids,
    parse_id_lines, verify_stored,
};

use super::job::{EVENT_IDS_KEY, LABEL_REPLAY};
use super::memory::{Child, ChildMemory, Created};

/// The frozen ids' sha256, on the scope ConfigMap.
const SHA256_ANNOTATION: &str = "backlog.dev/sha256";

/// The outcome of an attempt to freeze.
pub enum Freeze {
    Frozen(FrozenScope),
    /// Why not, and whether waiting can help.
    NotFrozen {
        message: String,
        permanent: bool,
    },
    /// A ConfigMap under the frozen scope's name that the operator did not create.
    Foreign {
        message: String,
    },
}

fn not_yet(message: String) -> Freeze {
    Freeze::NotFrozen {
        message,
        permanent: false,
    }
}

fn foreign(name: &str) -> Freeze {
    Freeze::Foreign {
        message: format!(
            "ConfigMap {name} exists but was not created by the operator for this ReplayJob; the frozen scope is only ever a ConfigMap the operator created, whatever its owner references say. Find out who created it (the API server's audit log), delete it and create a new ReplayJob"
        ),
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

fn frozen_scope(config_map: &str, uid: &str, ids: &FrozenIds, at: Timestamp) -> FrozenScope {
    FrozenScope {
        config_map: config_map.to_owned(),
        config_map_uid: Some(uid.to_owned()),
        count: i32::try_from(ids.count()).unwrap_or(i32::MAX),
        sha256: ids.sha256().to_owned(),
        frozen_at: Time(at),
    }
}

/// When the API server created `config_map` (`now` if it does not say).
fn created_at(config_map: &ConfigMap, now: Timestamp) -> Timestamp {
    config_map
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0)
}

/// Freezes the scope of `replay` (whose uid is `uid`), or says why it cannot yet.
pub async fn freeze(
    client: &kube::Client,
    replay: &ReplayJob,
    namespace: &str,
    uid: &str,
    now: Timestamp,
    memory: &ChildMemory,
) -> Result<Freeze, Error> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = scope_config_map_name(&replay.name_any(), uid);

    // A ConfigMap under the name that this process created, and whose record in the status
    // did not happen (yet), is the list, whatever the source says by now. One it does not
    // remember is adopted only if it is exactly what would be created now.
    let existing = match config_maps.get_opt(&name).await {
        Ok(existing) => existing,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Ok(not_yet(not_permitted("read", namespace, &status.message)));
        }
        Err(error) => {
            return Err(error).during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, &name));
        }
    };
    if let Some(existing) = existing {
        let existing_uid = existing.uid().unwrap_or_default();
        if memory.recall(uid, Child::Scope) != Some(Created::Uid(existing_uid.clone())) {
            return adopt_or_refuse(replay, &config_maps, namespace, &name, existing, now).await;
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
            Ok(ids) if existing.immutable == Some(true) => Freeze::Frozen(frozen_scope(
                &name,
                &existing_uid,
                &ids,
                created_at(&existing, now),
            )),
            Ok(_) => Freeze::Foreign {
                message: format!(
                    "ConfigMap {name}, the frozen scope, is not immutable; create a new ReplayJob"
                ),
            },
            Err(message) => Freeze::Foreign {
                message: format!("{message}; the frozen scope was altered: create a new ReplayJob"),
            },
        });
    }

    let checked = match intended_ids(replay, &config_maps, namespace).await? {
        Ok(checked) => checked,
        Err(not_frozen) => return Ok(not_frozen),
    };
    let Some(config_map) = intended(replay, namespace, &name, &checked) else {
        return Ok(not_yet(
            "the ReplayJob has no uid yet; the scope is frozen once the API server assigned one"
                .to_owned(),
        ));
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match config_maps.create(&params, &config_map).await {
        Ok(created) => {
            let created_uid = created.uid().unwrap_or_default();
            memory.remember(uid, Child::Scope, Created::Uid(created_uid.clone()));
            Ok(Freeze::Frozen(frozen_scope(
                &name,
                &created_uid,
                &checked,
                now,
            )))
        }
        // Created by someone else between the read above and this create.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(foreign(&name)),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            Ok(not_yet(not_permitted("create", namespace, &status.message)))
        }
        Err(error) => {
            Err(error).during(|| ApiCall::on::<ConfigMap>(Verb::Create, namespace, &name))
        }
    }
}

/// The ids the scope would freeze now, from the spec's source; `Err` says why not yet.
async fn intended_ids(
    replay: &ReplayJob,
    config_maps: &Api<ConfigMap>,
    namespace: &str,
) -> Result<Result<FrozenIds, Freeze>, Error> {
    Ok(Ok(match source(replay) {
        Source::None => {
            return Ok(Err(Freeze::NotFrozen {
                message: ScopeProblem::NoEventIds.to_string(),
                permanent: true,
            }));
        }
        // The inline list is immutable: a problem with it never goes away.
        Source::Inline(ids) => match check_id_list(ids, "spec.scope.eventIds")
            .and_then(|ids| freeze_ids(ids, "spec.scope.eventIds"))
        {
            Ok(frozen) => frozen,
            Err(problem) => {
                return Ok(Err(Freeze::NotFrozen {
                    message: format!("{problem}; create a new ReplayJob with a corrected list"),
                    permanent: true,
                }));
            }
        },
        // The source ConfigMap can still be fixed until the scope is frozen.
        Source::ConfigMap { name: source, key } => {
            let found = match config_maps.get_opt(source).await {
                Ok(found) => found,
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    return Ok(Err(not_yet(not_permitted(
                        "read",
                        namespace,
                        &status.message,
                    ))));
                }
                Err(error) => {
                    return Err(error)
                        .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, source));
                }
            };
            let Some(found) = found else {
                return Ok(Err(not_yet(format!(
                    "spec.scope.eventIdsFrom: ConfigMap {source} does not exist in namespace {namespace}; create it with the event ids one per line under key {key}"
                ))));
            };
            let Some(text) = found.data.as_ref().and_then(|d| d.get(key)) else {
                return Ok(Err(not_yet(format!(
                    "spec.scope.eventIdsFrom: ConfigMap {source} has no key {key}; put the event ids there, one per line"
                ))));
            };
            let source_name = format!("spec.scope.eventIdsFrom (ConfigMap {source} key {key})");
            match parse_id_lines(text, &source_name).and_then(|ids| freeze_ids(ids, &source_name)) {
                Ok(frozen) => frozen,
                Err(problem) => return Ok(Err(not_yet(problem.to_string()))),
            }
        }
    }))
}

/// The frozen scope's ConfigMap for `checked`; `None` while the replay has no uid.
fn intended(
    replay: &ReplayJob,
    namespace: &str,
    name: &str,
    checked: &FrozenIds,
) -> Option<ConfigMap> {
    let owner = replay.controller_owner_ref(&())?;
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                ),
                (LABEL_REPLAY.to_owned(), replay.name_any()),
            ])),
            annotations: Some(BTreeMap::from([(
                SHA256_ANNOTATION.to_owned(),
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
    })
}

/// A ConfigMap under the scope's name that this process does not remember creating: the
/// operator's own when it died between the create and the status record, or someone else's.
/// It is taken as the frozen scope only if it is byte for byte what the operator would create
/// now (the same ids, immutable, owned by this replay): then it freezes what the operator
/// would freeze, whoever created it. Anything else is foreign.
async fn adopt_or_refuse(
    replay: &ReplayJob,
    config_maps: &Api<ConfigMap>,
    namespace: &str,
    name: &str,
    existing: ConfigMap,
    now: Timestamp,
) -> Result<Freeze, Error> {
    let checked = match intended_ids(replay, config_maps, namespace).await? {
        Ok(checked) => checked,
        Err(_) => return Ok(foreign(name)),
    };
    match intended(replay, namespace, name, &checked) {
        Some(intended) if same_scope(&intended, &existing) => {
            let existing_uid = existing.uid().unwrap_or_default();
            tracing::info!(replay = %replay.name_any(), namespace = %namespace, configmap = %name, configmap_uid = %existing_uid, "adopted the frozen scope this replay's create left unrecorded");
            Ok(Freeze::Frozen(frozen_scope(
                name,
                &existing_uid,
                &checked,
                created_at(&existing, now),
            )))
        }
        _ => Ok(foreign(name)),
    }
}

/// Whether `found` is the ConfigMap `intended` describes: the same data and nothing else,
/// immutable, and controlled by the same replay.
pub fn same_scope(intended: &ConfigMap, found: &ConfigMap) -> bool {
    let binary_empty = found
        .binary_data
        .as_ref()
        .is_none_or(|binary| binary.is_empty());
    found.immutable == Some(true)
        && binary_empty
        && found.data == intended.data
        && found.metadata.owner_references == intended.metadata.owner_references
        && found.annotations().get(SHA256_ANNOTATION)
            == intended.annotations().get(SHA256_ANNOTATION)
}

/// The operator may not touch ConfigMaps in the namespace: say who grants it.
fn not_permitted(verb: &str, namespace: &str, refusal: &str) -> String {
    format!(
        "the operator may not {verb} ConfigMaps in namespace {namespace} ({refusal}): replays and budgets there need a namespace admin to bind the operator's namespace ClusterRole to its ServiceAccount (see the README's Security section)"
    )
}

/// Checks that the frozen scope's ConfigMap is still the one the operator created, immutable,
/// with the approved bytes.
pub async fn check(
    client: &kube::Client,
    namespace: &str,
    recorded: &FrozenScope,
) -> Result<ScopeCheck, Error> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let found = match config_maps.get_opt(&recorded.config_map).await {
        Ok(found) => found,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Ok(ScopeCheck::Unreadable(not_permitted(
                "read",
                namespace,
                &status.message,
            )));
        }
        Err(error) => {
            return Err(error)
                .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, &recorded.config_map));
        }
    };
    let uid = found.as_ref().and_then(|c| c.uid()).unwrap_or_default();
    let stored = found.as_ref().map(|c| StoredScope {
        uid: &uid,
        immutable: c.immutable == Some(true),
        text: c
            .data
            .as_ref()
            .and_then(|d| d.get(EVENT_IDS_KEY))
            .map(String::as_str),
    });
    Ok(
        match verify_stored(
            RecordedScope {
                config_map: &recorded.config_map,
                uid: recorded.config_map_uid.as_deref(),
                sha256: &recorded.sha256,
            },
            stored,
        ) {
            Ok(()) => ScopeCheck::Intact,
            Err(changed) => ScopeCheck::Changed(changed),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config_map(ids: &str, immutable: bool, owner: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {
                "name": "orders-scope-5e3c",
                "uid": "c-1",
                "annotations": {"backlog.dev/sha256": "abc"},
                "ownerReferences": [{
                    "apiVersion": "backlog.dev/v1alpha1", "kind": "ReplayJob", "name": "orders",
                    "uid": owner, "controller": true, "blockOwnerDeletion": true
                }]
            },
            "data": {EVENT_IDS_KEY: ids},
            "immutable": immutable
        }))
        .unwrap()
    }

    #[test]
    fn only_the_very_scope_the_operator_would_freeze_is_adopted() {
        let intended = config_map("a\nb\n", true, "r-1");
        assert!(same_scope(&intended, &config_map("a\nb\n", true, "r-1")));
        for (what, found) in [
            ("other ids", config_map("a\nc\n", true, "r-1")),
            ("mutable", config_map("a\nb\n", false, "r-1")),
            ("another owner", config_map("a\nb\n", true, "r-2")),
        ] {
            assert!(!same_scope(&intended, &found), "{what}");
        }
        let mut extra = config_map("a\nb\n", true, "r-1");
        extra
            .data
            .as_mut()
            .unwrap()
            .insert("more".into(), "x".into());
        assert!(!same_scope(&intended, &extra), "an extra key");
    }
}
