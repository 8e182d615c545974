//! Building one recipe tree from several sources: `extends:` parents, `--set` overrides and
//! `vars:` interpolation. All of it happens on located trees, so later errors still point at
//! the line (or the `--set`) that introduced a value.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use super::RecipeError;
use super::tree::{self, Key, Loc, Node, Value};

/// The largest recipe file read (a recipe is configuration, not data).
const MAX_RECIPE_BYTES: u64 = 16 << 20;

/// The longest string that `${var}` interpolation may produce: vars that repeat one another
/// grow exponentially, and would otherwise exhaust memory.
const MAX_INTERPOLATED_BYTES: usize = 1 << 20;

/// Loads `path` and, recursively, the recipes it `extends:`, merged parent first.
pub fn load_with_parents(path: &Path) -> Result<Node, RecipeError> {
    let mut seen = HashSet::new();
    load_chain(path, &mut seen, None)
}

fn load_chain(
    path: &Path,
    seen: &mut HashSet<PathBuf>,
    from: Option<&Loc>,
) -> Result<Node, RecipeError> {
    let shown = path.display().to_string();
    let fail = |msg: String| match from {
        Some(loc) => RecipeError::at(loc.clone(), msg),
        None => RecipeError::at(Loc::origin(&shown), msg),
    };
    // A recipe is a regular file of modest size: `/dev/zero` or a FIFO would read forever.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(fail(format!("recipe `{shown}` is not a regular file")));
        }
        Ok(m) if m.len() > MAX_RECIPE_BYTES => {
            return Err(fail(format!(
                "recipe `{shown}` is {} bytes, more than the {MAX_RECIPE_BYTES} a recipe may have",
                m.len()
            )));
        }
        _ => {}
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(format!("cannot read recipe `{shown}`: {e}")))?;
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    if !seen.insert(canonical) {
        return Err(RecipeError::at(
            from.cloned().unwrap_or_else(|| Loc::origin(&shown)),
            format!(
                "`extends:` forms a cycle: `{shown}` extends itself (directly or through its parents)"
            ),
        ));
    }
    let mut node = tree::parse(&text, &shown)?;
    let Value::Map(entries) = &mut node.value else {
        return Err(RecipeError::at(
            node.loc.clone(),
            format!(
                "a recipe must be a mapping of sections, found {}",
                node.type_name()
            ),
        ));
    };
    let Some(pos) = entries.iter().position(|(k, _)| k.name == "extends") else {
        return Ok(node);
    };
    let (_, parent_ref) = entries.remove(pos);
    let Some(parent_name) = parent_ref.as_str() else {
        let found = parent_ref.type_name();
        return Err(RecipeError::at(
            parent_ref.loc,
            format!("`extends` must be a path to a recipe file, found {found}"),
        ));
    };
    let parent_path = path.parent().unwrap_or(Path::new(".")).join(parent_name);
    let parent = load_chain(&parent_path, seen, Some(&parent_ref.loc))?;
    Ok(merge(parent, node))
}

/// Merges `over` into `base` key by key. Mappings merge recursively; lists of named mappings
/// (`stages:`) merge by `name` (a child entry overrides fields of the parent's entry of the
/// same name, new names are appended); anything else is replaced. A `null` in `over` removes
/// the key.
pub fn merge(base: Node, over: Node) -> Node {
    match (base.value, over.value) {
        (Value::Map(mut base_entries), Value::Map(over_entries)) => {
            for (key, value) in over_entries {
                let existing = base_entries.iter().position(|(k, _)| k.name == key.name);
                match (existing, matches!(value.value, Value::Null)) {
                    (Some(i), true) => {
                        base_entries.remove(i);
                    }
                    (Some(i), false) => {
                        let (k, old) = base_entries.remove(i);
                        base_entries.insert(i, (k, merge(old, value)));
                    }
                    (None, _) => base_entries.push((key, value)),
                }
            }
            Node {
                value: Value::Map(base_entries),
                loc: over.loc,
            }
        }
        (Value::Seq(mut base_items), Value::Seq(over_items))
            if all_named(&base_items) && all_named(&over_items) && !over_items.is_empty() =>
        {
            for item in over_items {
                let name = item.get("name").and_then(Node::as_str).map(str::to_string);
                match base_items
                    .iter()
                    .position(|b| b.get("name").and_then(Node::as_str) == name.as_deref())
                {
                    Some(i) => {
                        let old = base_items.remove(i);
                        base_items.insert(i, merge(old, item));
                    }
                    None => base_items.push(item),
                }
            }
            Node {
                value: Value::Seq(base_items),
                loc: over.loc,
            }
        }
        (_, value) => Node {
            value,
            loc: over.loc,
        },
    }
}

fn all_named(items: &[Node]) -> bool {
    items
        .iter()
        .all(|n| n.get("name").and_then(Node::as_str).is_some())
}

/// Applies one `--set path.to.key=value` override. The value is parsed as YAML (so numbers,
/// booleans and `[lists]` keep their type); list items are addressed by index or, in lists
/// of named entries, by name (`stages.count.run=...`). Missing mapping keys are created.
pub fn apply_set(root: &mut Node, assignment: &str) -> Result<(), RecipeError> {
    let origin = format!("--set {assignment}");
    let Some((path, raw)) = assignment.split_once('=') else {
        return Err(RecipeError::at(
            Loc::origin(&origin),
            "expected `path.to.key=value`".to_string(),
        ));
    };
    let path = path.trim();
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(RecipeError::at(
            Loc::origin(&origin),
            format!(
                "`{path}` is not a valid key path (expected dot-separated keys like `stages.count.run`)"
            ),
        ));
    }
    let loc = Loc {
        file: origin.as_str().into(),
        line: 1,
        col: (path.len() + 2) as u64,
    };
    let mut value = parse_set_value(raw, &loc);
    relocate(&mut value, &loc);

    let segments: Vec<&str> = path.split('.').collect();
    let mut cur = root;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let here = segments[..i].join(".");
        let cur_type = cur.type_name();
        cur = match &mut cur.value {
            Value::Map(entries) => {
                let pos = match entries.iter().position(|(k, _)| k.name == *seg) {
                    Some(p) => p,
                    None => {
                        let fresh = Node {
                            value: Value::Map(Vec::new()),
                            loc: loc.clone(),
                        };
                        entries.push((
                            Key {
                                name: seg.to_string(),
                                loc: loc.clone(),
                            },
                            fresh,
                        ));
                        entries.len() - 1
                    }
                };
                &mut entries[pos].1
            }
            Value::Seq(items) => {
                let pos = match seg.parse::<usize>() {
                    Ok(idx) if idx < items.len() => idx,
                    Ok(idx) => {
                        return Err(RecipeError::at(
                            loc,
                            format!(
                                "`{here}` has {} items, index {idx} is out of range",
                                items.len()
                            ),
                        ));
                    }
                    Err(_) => items
                        .iter()
                        .position(|n| n.get("name").and_then(Node::as_str) == Some(seg))
                        .ok_or_else(|| {
                            let names: Vec<&str> = items
                                .iter()
                                .filter_map(|n| n.get("name").and_then(Node::as_str))
                                .collect();
                            RecipeError::at(
                                loc.clone(),
                                format!(
                                    "`{here}` has no entry named `{seg}` (names: {})",
                                    names.join(", ")
                                ),
                            )
                        })?,
                };
                &mut items[pos]
            }
            _ => {
                return Err(RecipeError::at(
                    loc,
                    format!("`{here}` is {cur_type}, cannot set `{seg}` inside it"),
                ));
            }
        };
        if last {
            *cur = value;
            return Ok(());
        }
    }
    unreachable!("the path has at least one segment")
}

fn parse_set_value(raw: &str, loc: &Loc) -> Node {
    let as_string = Node {
        value: Value::Str(raw.to_string()),
        loc: loc.clone(),
    };
    match tree::parse(raw, &loc.file) {
        // `echo a: b` would parse as a mapping; only an explicit `{...}` means one.
        Ok(Node {
            value: Value::Map(_),
            ..
        }) if !raw.trim_start().starts_with('{') => as_string,
        Ok(node) if !raw.trim().is_empty() => node,
        _ => as_string,
    }
}

fn relocate(node: &mut Node, loc: &Loc) {
    node.loc = loc.clone();
    match &mut node.value {
        Value::Seq(items) => items.iter_mut().for_each(|n| relocate(n, loc)),
        Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
            k.loc = loc.clone();
            relocate(v, loc)
        }),
        _ => {}
    }
}

/// Replaces `${name}` in every string with the value of `vars.name` (which may itself use
/// other vars). A string that is exactly `${name}` takes the variable's type (`layers: ${n}`
/// stays an integer). `$${` writes a literal `${` (e.g. in shell commands).
pub fn interpolate(root: &mut Node) -> Result<(), RecipeError> {
    let mut raw_vars: BTreeMap<String, Node> = BTreeMap::new();
    if let Some(vars) = root.get("vars") {
        let Value::Map(entries) = &vars.value else {
            return Err(RecipeError::at(
                vars.loc.clone(),
                format!(
                    "`vars` must be a mapping of names to values, found {}",
                    vars.type_name()
                ),
            ));
        };
        for (k, v) in entries {
            if matches!(v.value, Value::Seq(_) | Value::Map(_)) {
                return Err(RecipeError::at(
                    v.loc.clone(),
                    format!(
                        "var `{}` must be a string, number or boolean, found {}",
                        k.name,
                        v.type_name()
                    ),
                ));
            }
            raw_vars.insert(k.name.clone(), v.clone());
        }
    }
    // Resolve vars that use other vars, detecting cycles.
    let mut resolved: BTreeMap<String, Node> = BTreeMap::new();
    let names: Vec<String> = raw_vars.keys().cloned().collect();
    for name in names {
        resolve_var(&name, &raw_vars, &mut resolved, &mut Vec::new())?;
    }
    substitute(root, &resolved)?;
    if let Value::Map(entries) = &mut root.value {
        for (k, v) in entries.iter_mut() {
            if k.name == "vars" {
                for (name, val) in resolved.iter() {
                    if let Value::Map(ventries) = &mut v.value
                        && let Some((_, slot)) = ventries.iter_mut().find(|(k, _)| &k.name == name)
                    {
                        *slot = val.clone();
                    }
                }
            }
        }
    }
    Ok(())
}

fn resolve_var(
    name: &str,
    raw: &BTreeMap<String, Node>,
    done: &mut BTreeMap<String, Node>,
    stack: &mut Vec<String>,
) -> Result<Node, RecipeError> {
    if let Some(v) = done.get(name) {
        return Ok(v.clone());
    }
    let node = raw[name].clone();
    if stack.iter().any(|s| s == name) {
        stack.push(name.to_string());
        return Err(RecipeError::at(
            node.loc,
            format!(
                "vars refer to each other in a cycle: {}",
                stack.join(" -> ")
            ),
        ));
    }
    stack.push(name.to_string());
    let mut out = node.clone();
    if let Value::Str(s) = &node.value {
        let mut lookup = |var: &str| -> Result<Node, RecipeError> {
            if raw.contains_key(var) {
                resolve_var(var, raw, done, stack)
            } else {
                Err(unknown_var(var, &node.loc, raw))
            }
        };
        out = interpolate_str(s, &node.loc, &mut lookup)?;
    }
    stack.pop();
    done.insert(name.to_string(), out.clone());
    Ok(out)
}

fn substitute(node: &mut Node, vars: &BTreeMap<String, Node>) -> Result<(), RecipeError> {
    match &mut node.value {
        Value::Str(s) if s.contains('$') => {
            let loc = node.loc.clone();
            let mut lookup = |var: &str| {
                vars.get(var)
                    .cloned()
                    .ok_or_else(|| unknown_var(var, &loc, vars))
            };
            *node = interpolate_str(&s.clone(), &loc, &mut lookup)?;
        }
        Value::Seq(items) => {
            for n in items {
                substitute(n, vars)?;
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries {
                if k.name != "vars" {
                    substitute(v, vars)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn unknown_var(var: &str, loc: &Loc, vars: &BTreeMap<String, Node>) -> RecipeError {
    let known: Vec<&str> = vars.keys().map(String::as_str).collect();
    RecipeError::at(
        loc.clone(),
        format!(
            "unknown var `${{{var}}}` (defined vars: {}); write `$${{{var}}}` for a literal `${{{var}}}`",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ),
    )
}

fn interpolate_str(
    s: &str,
    loc: &Loc,
    lookup: &mut dyn FnMut(&str) -> Result<Node, RecipeError>,
) -> Result<Node, RecipeError> {
    // The whole string is one reference: keep the var's type.
    if let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
        && is_var_name(inner)
    {
        let mut v = lookup(inner)?;
        v.loc = loc.clone();
        return Ok(v);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                return Err(RecipeError::at(
                    loc.clone(),
                    format!("unclosed `${{` in `{s}`"),
                ));
            };
            let name = &tail[..end];
            if !is_var_name(name) {
                return Err(RecipeError::at(
                    loc.clone(),
                    format!(
                        "`${{{name}}}` is not a var name (letters, digits, `_`, `-`); write `$${{` for a literal `${{`"
                    ),
                ));
            }
            let v = lookup(name)?;
            match &v.value {
                Value::Str(t) => out.push_str(t),
                Value::Int(i) => out.push_str(&i.to_string()),
                Value::Float(x) => out.push_str(&x.to_string()),
                Value::Bool(b) => out.push_str(&b.to_string()),
                Value::Null => {}
                _ => unreachable!("vars are scalars"),
            }
            if out.len() > MAX_INTERPOLATED_BYTES {
                return Err(RecipeError::at(
                    loc.clone(),
                    format!(
                        "expanding the vars in this value gives more than {MAX_INTERPOLATED_BYTES} bytes (at `${{{name}}}`): vars that repeat one another grow exponentially"
                    ),
                ));
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(Node {
        value: Value::Str(out),
        loc: loc.clone(),
    })
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Node {
        tree::parse(s, "t.yaml").unwrap()
    }
    fn json(n: &Node) -> serde_json::Value {
        n.to_json("", &mut Default::default())
    }

    #[test]
    fn merge_maps_and_named_lists() {
        let base =
            p("a: 1\nb: {c: 2, d: 3}\nstages:\n  - {name: x, run: one}\n  - {name: y, run: two}\n");
        let over =
            p("b: {c: 20, d: null}\nstages:\n  - {name: y, run: TWO}\n  - {name: z, run: three}\n");
        let m = json(&merge(base, over));
        assert_eq!(m["a"], 1);
        assert_eq!(m["b"], serde_json::json!({"c": 20}));
        let runs: Vec<_> = m["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["run"].clone())
            .collect();
        assert_eq!(runs, vec!["one", "TWO", "three"]);
    }

    #[test]
    fn set_by_name_index_and_new_key() {
        let mut r = p("stages:\n  - {name: x, run: one}\n");
        apply_set(&mut r, "stages.x.run=two words: yes").unwrap();
        apply_set(&mut r, "stages.0.cpus=4").unwrap();
        apply_set(&mut r, "vars.list=[1, 2]").unwrap();
        let j = json(&r);
        assert_eq!(j["stages"][0]["run"], "two words: yes");
        assert_eq!(j["stages"][0]["cpus"], 4);
        assert_eq!(j["vars"]["list"], serde_json::json!([1, 2]));
        let e = apply_set(&mut r, "stages.nope.run=1").unwrap_err();
        assert!(e.to_string().contains("no entry named `nope`"), "{e}");
        assert!(apply_set(&mut r, "novalue").is_err());
    }

    #[test]
    fn vars_interpolate_and_keep_type() {
        let mut r = p(
            "vars: {n: 4, base: /data, p: '${base}/x'}\nlayers: ${n}\npath: '${p}/y'\nsh: 'echo $${HOME} $HOME'\n",
        );
        interpolate(&mut r).unwrap();
        let j = json(&r);
        assert_eq!(j["layers"], 4);
        assert_eq!(j["path"], "/data/x/y");
        assert_eq!(j["sh"], "echo ${HOME} $HOME");
    }

    #[test]
    fn unknown_and_cyclic_vars_are_errors_with_locations() {
        let mut r = p("vars: {a: x}\nb: 'hi ${nope}'\n");
        let e = interpolate(&mut r).unwrap_err();
        assert_eq!(e.loc.line, 2);
        assert!(e.to_string().contains("unknown var `${nope}`"), "{e}");
        let mut r = p("vars: {a: '${b}', b: '${a}'}\n");
        let e = interpolate(&mut r).unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
    }
}
