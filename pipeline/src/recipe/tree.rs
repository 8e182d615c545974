//! A YAML document as a tree whose every node remembers where it was written.
//!
//! Recipes are merged (`extends:`), overridden (`--set`) and interpolated (`vars:`) before they
//! are typed, and an error found after all that must still point at the line the user wrote.
//! So we parse YAML (serde-saphyr, with its `Spanned` locations) into this small tree first,
//! do the transformations on the tree, and only then hand it to serde for typing.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// Where a value came from: a file (or `--set ...`), 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    /// The recipe file as the user named it, or `--set <path>` for command-line overrides.
    pub file: Arc<str>,
    /// 1-based line; 0 when unknown.
    pub line: u64,
    /// 1-based column; 0 when unknown.
    pub col: u64,
}

impl Loc {
    /// A location that only names its origin (no line/column known).
    pub fn origin(file: &str) -> Loc {
        Loc {
            file: Arc::from(file),
            line: 0,
            col: 0,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file)
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}

/// One YAML value with its location.
#[derive(Clone, Debug)]
pub struct Node {
    /// The value.
    pub value: Value,
    /// Where the value was written.
    pub loc: Loc,
}

/// The value of a [`Node`]. Maps keep their keys' order and locations.
#[derive(Clone, Debug)]
pub enum Value {
    /// `null`, `~` or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string scalar.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<(Key, Node)>),
}

/// A mapping key and its location.
#[derive(Clone, Debug)]
pub struct Key {
    /// The key text.
    pub name: String,
    /// Where the key was written.
    pub loc: Loc,
}

impl Node {
    /// A short human word for the node's type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// The entry named `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string value, if this node is a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Converts to JSON, recording the location of every node under its path
    /// (`stages[1].run`) in `locs`, so errors found by serde can be pointed back at the file.
    pub fn to_json(&self, path: &str, locs: &mut LocMap) -> serde_json::Value {
        locs.insert(path.to_string(), self.loc.clone());
        match &self.value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => (*b).into(),
            Value::Int(i) => (*i).into(),
            Value::Float(x) => serde_json::Number::from_f64(*x)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => s.clone().into(),
            Value::Seq(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| n.to_json(&format!("{path}[{i}]"), locs))
                .collect(),
            Value::Map(entries) => {
                let mut map = serde_json::Map::new();
                for (k, v) in entries {
                    let child = join_path(path, &k.name);
                    // The key's own location, so "unknown field" errors point at the key.
                    locs.insert(format!("{child}#key"), k.loc.clone());
                    map.insert(k.name.clone(), v.to_json(&child, locs));
                }
                serde_json::Value::Object(map)
            }
        }
    }
}

/// Path -> location of every node of a recipe, filled by [`Node::to_json`].
pub type LocMap = std::collections::HashMap<String, Loc>;

/// Appends a map key to a path: `""` + `a` = `a`, `a` + `b` = `a.b`.
pub fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Parses YAML text into a located tree. `file` is only used to label locations.
pub fn parse(text: &str, file: &str) -> Result<Node, crate::recipe::RecipeError> {
    let file: Arc<str> = Arc::from(file);
    if text.trim().is_empty() {
        return Ok(Node {
            value: Value::Map(Vec::new()),
            loc: Loc {
                file,
                line: 1,
                col: 1,
            },
        });
    }
    // YAML 1.2 booleans only (`run: y` stays a string), and `0123` stays text, not octal.
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.leading_zero_numbers_as_strings = true;
    match serde_saphyr::from_str_with_options::<Spanned<RawValue>>(text, options) {
        Ok(raw) => Ok(from_raw(raw, &file)),
        Err(e) => {
            let (line, col) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            // serde-saphyr renders a snippet with the location; keep only the first line here,
            // since we print our own location prefix.
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("invalid YAML").to_string();
            Err(crate::recipe::RecipeError::at(
                Loc { file, line, col },
                format!("invalid YAML: {first}"),
            ))
        }
    }
}

fn from_raw(raw: Spanned<RawValue>, file: &Arc<str>) -> Node {
    let loc = loc_of(&raw, file);
    let value = match raw.value {
        RawValue::Null => Value::Null,
        RawValue::Bool(b) => Value::Bool(b),
        RawValue::Int(i) => Value::Int(i),
        RawValue::Float(x) => Value::Float(x),
        RawValue::Str(s) => Value::Str(s),
        RawValue::Seq(items) => Value::Seq(items.into_iter().map(|n| from_raw(n, file)).collect()),
        RawValue::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let kloc = loc_of(&k, file);
                    (
                        Key {
                            name: k.value,
                            loc: kloc,
                        },
                        from_raw(v, file),
                    )
                })
                .collect(),
        ),
    };
    Node { value, loc }
}

fn loc_of<T>(s: &Spanned<T>, file: &Arc<str>) -> Loc {
    Loc {
        file: file.clone(),
        line: s.referenced.line(),
        col: s.referenced.column(),
    }
}

/// What serde-saphyr deserializes into; converted to [`Node`] right after.
enum RawValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<RawValue>>),
    Map(Vec<(Spanned<String>, Spanned<RawValue>)>),
}

impl<'de> Deserialize<'de> for RawValue {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<RawValue, E> {
        Ok(RawValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<RawValue, E> {
        Ok(RawValue::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawValue, E> {
        i64::try_from(v)
            .map(RawValue::Int)
            .or(Ok(RawValue::Float(v as f64)))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<RawValue, E> {
        i64::try_from(v)
            .map(RawValue::Int)
            .or(Ok(RawValue::Float(v as f64)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<RawValue, E> {
        i64::try_from(v)
            .map(RawValue::Int)
            .or(Ok(RawValue::Float(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<RawValue, E> {
        Ok(RawValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<RawValue, E> {
        Ok(RawValue::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<RawValue, E> {
        Ok(RawValue::Str(v))
    }
    fn visit_unit<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }
    fn visit_none<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<RawValue, D::Error> {
        RawValue::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<RawValue>>()? {
            items.push(item);
        }
        Ok(RawValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawValue, A::Error> {
        let mut entries: Vec<(Spanned<String>, Spanned<RawValue>)> = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let value = map.next_value::<Spanned<RawValue>>()?;
            let key = Spanned::new(key.value.0, key.referenced, key.defined);
            if entries.iter().any(|(k, _)| k.value == key.value) {
                return Err(de::Error::custom(format!("duplicate key `{}`", key.value)));
            }
            entries.push((key, value));
        }
        Ok(RawValue::Map(entries))
    }
}

/// A mapping key: YAML allows any scalar (`1: x`, `true: y`); recipes use them as text.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match RawValue::deserialize(d)? {
            RawValue::Str(s) => Ok(KeyText(s)),
            RawValue::Int(i) => Ok(KeyText(i.to_string())),
            RawValue::Float(x) => Ok(KeyText(x.to_string())),
            RawValue::Bool(b) => Ok(KeyText(b.to_string())),
            RawValue::Null => Ok(KeyText("null".into())),
            _ => Err(de::Error::custom("mapping keys must be scalars")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_point_at_values_and_keys() {
        let text = "a: 1\nb:\n  - x\n  - {c: true}\n";
        let node = parse(text, "r.yaml").unwrap();
        let mut locs = LocMap::new();
        let json = node.to_json("", &mut locs);
        assert_eq!(json["b"][1]["c"], serde_json::Value::Bool(true));
        assert_eq!(locs["a"].line, 1);
        assert_eq!(locs["b[0]"].line, 3);
        assert_eq!(locs["b[1].c#key"].line, 4);
        let node = parse("top:\n  key: value\n  other: [y, 0123]\n", "r.yaml").unwrap();
        let mut locs = LocMap::new();
        let json = node.to_json("", &mut locs);
        assert_eq!((locs["top.key#key"].line, locs["top.key#key"].col), (2, 3));
        assert_eq!((locs["top.key"].line, locs["top.key"].col), (2, 8));
        assert_eq!(json["top"]["other"], serde_json::json!(["y", "0123"]));
    }

    #[test]
    fn yaml_syntax_errors_have_a_location() {
        let err = parse("a: [1, 2\nb: 3\n", "bad.yaml").unwrap_err();
        let s = err.to_string();
        assert!(s.starts_with("bad.yaml:"), "{s}");
        assert!(err.loc.line > 0, "{s}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let err = parse("a: 1\na: 2\n", "dup.yaml").unwrap_err();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }
}
