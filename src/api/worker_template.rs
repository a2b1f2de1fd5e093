//! A worker's pod template, kept as the user wrote it.
//!
//! The CRDs check the template's outline and the fields most often written (see
//! `pod_template_schema`); the rest is stored unchecked, since embedding the whole PodSpec
//! schema would make each CRD half a megabyte, past what client-side `kubectl apply` can
//! annotate. So a template may hold a value of the wrong type elsewhere
//! (`terminationGracePeriodSeconds: "30"`). Decoded with the object, such a
//! template failed the operator's typed list of the whole kind, and with it every other
//! ReplayJob or Compensation in scope. Kept undecoded, it fails only where it is used: that
//! one object is refused with the field to fix.

use std::fmt;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::{Deserialize, Serialize};

/// A `PodTemplateSpec` as stored, decoded on use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerTemplate(serde_json::Value);

/// Why a template is not a `PodTemplateSpec`: the field (under `spec.template`) and what is
/// wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct UndecodableTemplate {
    /// The field's path in the template, such as `spec.containers[0].env[0].value`.
    pub path: String,
    pub problem: String,
}

impl fmt::Display for UndecodableTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = if self.path.is_empty() || self.path == "." {
            "spec.template".to_owned()
        } else {
            format!("spec.template.{}", self.path)
        };
        write!(
            f,
            "{field} is not what a Pod takes: {}; write it as in a Pod's spec (quote a number or \
             true/false meant as a string)",
            self.problem
        )
    }
}

impl WorkerTemplate {
    /// The template as a `PodTemplateSpec`, or the first field that is not one. A field the
    /// Pod API does not have (misspelled, or newer than this operator) is refused too: decoding
    /// would drop it, and the worker would run without what the approver read.
    pub fn decode(&self) -> Result<PodTemplateSpec, UndecodableTemplate> {
        let template: PodTemplateSpec =
            serde_path_to_error::deserialize(&self.0).map_err(|error| UndecodableTemplate {
                path: error.path().to_string(),
                problem: error.into_inner().to_string(),
            })?;
        let kept = serde_json::to_value(&template).unwrap_or_default();
        match first_dropped(&self.0, &kept, "") {
            Some(path) => Err(UndecodableTemplate {
                path,
                problem: "a Pod has no such field (misspelled, or newer than this operator), so \
                          the worker would run without it"
                    .to_owned(),
            }),
            None => Ok(template),
        }
    }
}

/// The first field of `written` (by its path) that is not in `kept`, the template decoded and
/// encoded again. A field written as null says nothing and is not counted.
fn first_dropped(
    written: &serde_json::Value,
    kept: &serde_json::Value,
    path: &str,
) -> Option<String> {
    use serde_json::Value;
    match (written, kept) {
        (Value::Object(fields), Value::Object(kept_fields)) => {
            fields.iter().find_map(|(name, value)| {
                let inner = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                match kept_fields.get(name) {
                    _ if value.is_null() => None,
                    Some(kept_value) => first_dropped(value, kept_value, &inner),
                    None => Some(inner),
                }
            })
        }
        (Value::Array(items), Value::Array(kept_items)) => items
            .iter()
            .zip(kept_items)
            .enumerate()
            .find_map(|(index, (item, kept_item))| {
                first_dropped(item, kept_item, &format!("{path}[{index}]"))
            }),
        _ => None,
    }
}

impl From<serde_json::Value> for WorkerTemplate {
    fn from(value: serde_json::Value) -> Self {
        WorkerTemplate(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_of_the_pod_api_decodes() {
        let template = WorkerTemplate::from(json!({
            "metadata": {"labels": {"app": "replay"}},
            "spec": {"containers": [{"name": "w", "image": "tool:1",
                "env": [{"name": "N", "value": "5"}], "ports": [{"containerPort": 8080}]}]}
        }));
        let pod = template.decode().expect("decodes").spec.expect("spec");
        assert_eq!(pod.containers[0].name, "w");
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_by_its_path() {
        for (template, path) in [
            (
                json!({"spec": {"containers": [{"name": "w", "image": "i",
                    "env": [{"name": "N", "value": 5}]}]}}),
                "spec.template.spec.containers[0].env[0].value",
            ),
            (
                json!({"spec": {"containers": [{"name": "w", "image": "i",
                    "ports": [{"containerPort": "8080"}]}]}}),
                "spec.template.spec.containers[0].ports[0].containerPort",
            ),
            (
                json!({"metadata": {"labels": {"canary": true}},
                    "spec": {"containers": [{"name": "w", "image": "i"}]}}),
                "spec.template.metadata.labels.canary",
            ),
        ] {
            let error = WorkerTemplate::from(template.clone())
                .decode()
                .expect_err("refused");
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("{path} is not what a Pod takes: invalid type")),
                "{template}: {message}"
            );
        }
    }

    #[test]
    fn a_field_the_pod_api_does_not_have_is_named_not_dropped() {
        for (template, path) in [
            (
                json!({"spec": {"nodeSelecter": {"disk": "ssd"},
                    "containers": [{"name": "w", "image": "i"}]}}),
                "spec.template.spec.nodeSelecter",
            ),
            (
                json!({"spec": {"containers": [{"name": "w", "image": "i",
                    "resourcez": {"limits": {"cpu": "1"}}}]}}),
                "spec.template.spec.containers[0].resourcez",
            ),
            (
                json!({"spec": {"containers": [{"name": "w", "image": "i",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valu": "2"}]}]}}),
                "spec.template.spec.containers[0].env[1].valu",
            ),
            (
                json!({"metadata": {"labelz": {"a": "b"}},
                    "spec": {"containers": [{"name": "w", "image": "i"}]}}),
                "spec.template.metadata.labelz",
            ),
        ] {
            let message = WorkerTemplate::from(template.clone())
                .decode()
                .expect_err("refused")
                .to_string();
            assert!(
                message.starts_with(&format!(
                    "{path} is not what a Pod takes: a Pod has no such field"
                )),
                "{template}: {message}"
            );
        }
        // What generated YAML often holds decodes: nulls, empty maps and lists, quantities
        // and ports written either way.
        let generated = json!({
            "metadata": {"creationTimestamp": null, "labels": {}},
            "spec": {
                "containers": [{"name": "w", "image": "i", "resources": {"limits": {"cpu": 1, "memory": "64Mi"}},
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}], "env": [],
                    "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
                "tolerations": [], "restartPolicy": "Never",
            },
        });
        WorkerTemplate::from(generated).decode().expect("decodes");
    }

    #[test]
    fn a_template_that_is_not_an_object_names_the_template() {
        let error = WorkerTemplate::from(json!("a pod"))
            .decode()
            .expect_err("refused");
        assert!(
            error
                .to_string()
                .starts_with("spec.template is not what a Pod takes"),
            "{error}"
        );
    }

    #[test]
    fn it_is_stored_exactly_as_written() {
        let written = json!({"spec": {"containers": [{"name": "w", "image": "i",
            "env": [{"name": "N", "value": 5}]}]}, "unknownField": 1});
        let template: WorkerTemplate = serde_json::from_value(written.clone()).expect("any JSON");
        assert_eq!(serde_json::to_value(&template).expect("encodes"), written);
    }
}
