//! Stage identities: what a stage's output is a function of.
//!
//! identity = blake3(canonical JSON of {kind, version, config, inputs, external}), where
//! `inputs` maps each input stage to the *content hash* of its output (not its identity).
//! Hashing contents rather than identities gives early cutoff for free: an upstream stage that
//! re-runs and writes the same bytes leaves every downstream identity unchanged.
//! Nothing about where or how the stage runs (store path, host, executor, `-j`) is in it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The hashed description of one stage run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdentityDoc {
    /// Stage kind.
    pub kind: String,
    /// Kind version.
    pub version: u32,
    /// Canonical config.
    pub config: serde_json::Value,
    /// Input stage name -> content hash of its output.
    pub inputs: BTreeMap<String, String>,
    /// Fingerprint of files outside the store the stage reads, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<String>,
}

impl IdentityDoc {
    /// The full identity (64 hex chars).
    pub fn hash(&self) -> String {
        let value = serde_json::to_value(self).expect("identity docs serialize");
        blake3::hash(canonical_json(&value).as_bytes())
            .to_hex()
            .to_string()
    }
}

/// The first 12 hex chars of an identity, used in folder names.
pub fn short(identity: &str) -> &str {
    &identity[..12.min(identity.len())]
}

/// JSON with object keys sorted at every level and no whitespace: equal values, equal text.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// One difference between two identity docs, phrased for `zflow why`.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The kind changed.
    Kind {
        /// The kind before.
        from: String,
        /// The kind now.
        to: String,
    },
    /// The kind's version changed (its code changed what it produces).
    Version {
        /// The version before.
        from: u32,
        /// The version now.
        to: u32,
    },
    /// A config field changed (`None` = absent).
    Field {
        /// Dotted path of the field.
        path: String,
        /// Its value before.
        from: Option<serde_json::Value>,
        /// Its value now.
        to: Option<serde_json::Value>,
    },
    /// An input's content changed (or it was added/removed).
    Input {
        /// The input stage.
        name: String,
        /// Its content hash before.
        from: Option<String>,
        /// Its content hash now.
        to: Option<String>,
    },
    /// Files outside the store changed.
    External,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<serde_json::Value>| match v {
            None => "(unset)".to_string(),
            Some(v) => v.to_string(),
        };
        match self {
            Change::Kind { from, to } => write!(f, "kind changed from `{from}` to `{to}`"),
            Change::Version { from, to } => write!(f, "kind version changed from {from} to {to}"),
            Change::Field { path, from, to } => {
                write!(
                    f,
                    "field `{path}` changed from {} to {}",
                    show(from),
                    show(to)
                )
            }
            Change::Input {
                name,
                from: Some(a),
                to: Some(b),
            } => {
                write!(
                    f,
                    "input `{name}` changed (content {} -> {})",
                    short(a),
                    short(b)
                )
            }
            Change::Input {
                name, from: None, ..
            } => write!(f, "input `{name}` was added"),
            Change::Input { name, to: None, .. } => write!(f, "input `{name}` was removed"),
            Change::External => write!(f, "files it reads from outside the store changed"),
        }
    }
}

/// What changed from `old` to `new`.
pub fn diff(old: &IdentityDoc, new: &IdentityDoc) -> Vec<Change> {
    let mut out = Vec::new();
    if old.kind != new.kind {
        out.push(Change::Kind {
            from: old.kind.clone(),
            to: new.kind.clone(),
        });
    }
    if old.version != new.version {
        out.push(Change::Version {
            from: old.version,
            to: new.version,
        });
    }
    diff_values("", Some(&old.config), Some(&new.config), &mut out);
    let names: std::collections::BTreeSet<&String> =
        old.inputs.keys().chain(new.inputs.keys()).collect();
    for name in names {
        let (a, b) = (old.inputs.get(name), new.inputs.get(name));
        if a != b {
            out.push(Change::Input {
                name: name.clone(),
                from: a.cloned(),
                to: b.cloned(),
            });
        }
    }
    if old.external != new.external {
        out.push(Change::External);
    }
    out
}

fn diff_values(
    path: &str,
    a: Option<&serde_json::Value>,
    b: Option<&serde_json::Value>,
    out: &mut Vec<Change>,
) {
    use serde_json::Value::Object;
    match (a, b) {
        (Some(Object(x)), Some(Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(&child, x.get(k), y.get(k), out);
            }
        }
        (a, b) if a != b => out.push(Change::Field {
            path: path.to_string(),
            from: a.cloned(),
            to: b.cloned(),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(config: serde_json::Value) -> IdentityDoc {
        IdentityDoc {
            kind: "shell".into(),
            version: 1,
            config,
            inputs: BTreeMap::new(),
            external: None,
        }
    }

    #[test]
    fn key_order_does_not_change_identity() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":3}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":{"x":3,"y":2},"b":1}"#).unwrap();
        assert_eq!(doc(a).hash(), doc(b).hash());
        assert_ne!(doc(json!({"b": 1})).hash(), doc(json!({"b": 2})).hash());
    }

    #[test]
    fn diff_names_fields_and_inputs() {
        let mut old = doc(json!({"run": "a", "env": {"X": "1"}}));
        old.inputs.insert("corpus".into(), "aaaa".into());
        let mut new = doc(json!({"run": "b", "env": {"X": "1", "Y": "2"}}));
        new.inputs.insert("corpus".into(), "bbbb".into());
        let changes: Vec<String> = diff(&old, &new).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            changes,
            vec![
                "field `env.Y` changed from (unset) to \"2\"",
                "field `run` changed from \"a\" to \"b\"",
                "input `corpus` changed (content aaaa -> bbbb)",
            ]
        );
    }
}
