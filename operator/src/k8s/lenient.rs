//! `Lenient<K>`: a custom resource read one object at a time, so that one object the
//! operator cannot parse does not stop it for all the others.
//!
//! The watcher deserializes a whole list at once; with `K` itself, one object the API server
//! accepted but `K` refuses (stored before an upgrade tightened the types, or by a looser
//! CRD) fails the list, and the controller reconciles nothing. `Lenient<K>` deserializes
//! every object: its metadata always, its body into `K` when it can, and otherwise into an
//! [`Unreadable`] naming the field and why, which the controller reports on the object.
//!
//! Invariants:
//! - deserializing a `Lenient<K>` fails only when the metadata is malformed, which the API
//!   server never sends (it validates metadata for every kind);
//! - `Lenient<K>` is the same resource as `K` (kind, group, version, plural, scope), so an
//!   `Api<Lenient<K>>` reads and watches the very objects an `Api<K>` would.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::api::ObjectMeta;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A `K` as read from the API server: parsed, or the reason it could not be.
#[derive(Clone, Debug)]
pub struct Lenient<K> {
    /// The object's metadata (always readable).
    pub metadata: ObjectMeta,
    /// The object, or why it could not be parsed.
    pub parsed: Result<K, Unreadable>,
}

/// Why an object could not be parsed, and what of its status could still be read.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreadable {
    /// The field and the reason, e.g. `spec.scaling.interval: invalid duration "…": out of
    /// range`.
    pub message: String,
    /// The conditions its status already carries (empty when they are unreadable too), so
    /// that reporting the problem keeps the others and their transition times.
    pub conditions: Vec<Condition>,
}

impl<K> Lenient<K> {
    /// The parsed object, or why there is none.
    pub fn get(&self) -> Result<&K, &Unreadable> {
        self.parsed.as_ref()
    }
}

/// A parsed object (what tests and callers holding a `K` pass to the controller).
impl<K: Resource> From<K> for Lenient<K> {
    fn from(k: K) -> Self {
        Lenient {
            metadata: k.meta().clone(),
            parsed: Ok(k),
        }
    }
}

impl<K: DeserializeOwned> Lenient<K> {
    /// Reads `value` as a `K`, keeping the reason when it is not one.
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        let metadata = match value.get("metadata") {
            Some(m) => ObjectMeta::deserialize(m)?,
            None => ObjectMeta::default(),
        };
        let parsed = serde_path_to_error::deserialize::<_, K>(&value).map_err(|e| Unreadable {
            message: describe(&e),
            conditions: status_conditions(&value),
        });
        Ok(Lenient { metadata, parsed })
    }
}

/// `path: reason`, or the reason alone when the whole object is wrong.
fn describe(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    if path.is_empty() || path == "." {
        e.inner().to_string()
    } else {
        format!("{path}: {}", e.inner())
    }
}

/// `status.conditions`, if they are readable on their own.
fn status_conditions(value: &Value) -> Vec<Condition> {
    value
        .pointer("/status/conditions")
        .and_then(|c| Vec::<Condition>::deserialize(c).ok())
        .unwrap_or_default()
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        Lenient::from_value(value).map_err(D::Error::custom)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tidegate_api::{InferencePool, TierPolicy};

    fn pool(interval: &str) -> Value {
        json!({
            "apiVersion": "tidegate.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "ns", "generation": 2},
            "spec": {
                "model": {"name": "m", "uri": "file:///m"},
                "engine": {"image": "e"},
                "replicas": {"min": 1, "max": 2},
                "scaling": {"interval": interval}
            },
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        })
    }

    #[test]
    fn readable_object_parses() {
        let l: Lenient<InferencePool> = serde_json::from_value(pool("15s")).unwrap();
        assert_eq!(l.metadata.name.as_deref(), Some("p"));
        assert_eq!(l.get().unwrap().spec.scaling.interval.as_secs_f64(), 15.0);
    }

    #[test]
    fn unreadable_object_names_the_field_and_keeps_conditions() {
        let l: Lenient<InferencePool> = serde_json::from_value(pool("9999999999h")).unwrap();
        assert_eq!(l.metadata.generation, Some(2));
        let bad = l.get().unwrap_err();
        assert!(
            bad.message
                .starts_with("spec.scaling.interval: invalid duration"),
            "{}",
            bad.message
        );
        assert!(bad.message.contains("out of range"), "{}", bad.message);
        assert_eq!(bad.conditions.len(), 1);
        assert_eq!(bad.conditions[0].type_, "Ready");
    }

    #[test]
    fn one_bad_object_does_not_fail_the_list() {
        let list = json!({"items": [pool("1s"), pool("9999999999h"), pool("2s")]});
        let items: Vec<Lenient<InferencePool>> =
            serde_json::from_value(list["items"].clone()).unwrap();
        let ok: Vec<bool> = items.iter().map(|i| i.get().is_ok()).collect();
        assert_eq!(ok, [true, false, true]);
        // The same list as plain InferencePools fails as a whole: the bug this type fixes.
        assert!(serde_json::from_value::<Vec<InferencePool>>(list["items"].clone()).is_err());
    }

    #[test]
    fn same_resource_as_the_inner_type() {
        assert_eq!(Lenient::<TierPolicy>::plural(&()), TierPolicy::plural(&()));
        assert_eq!(
            Lenient::<InferencePool>::url_path(&(), Some("ns")),
            InferencePool::url_path(&(), Some("ns"))
        );
    }
}
