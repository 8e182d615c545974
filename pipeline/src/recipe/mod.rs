//! Recipes: one YAML file (plus the parents it `extends:`) describing a whole pipeline.
//!
//! Loading goes: parse to located trees -> merge `extends:` parents -> apply `--set` ->
//! interpolate `vars:` -> type-check the engine's own keys and each stage's config (through
//! the [`Registry`]) -> expand sections into stage nodes -> check names and `needs`.
//! Every error names `file:line:col` and says what was expected.

mod compose;
pub mod tree;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::registry::{NodeSpec, Registry};
use crate::stage::{PreparedStage, Resources, serde_path};
pub use tree::{Loc, LocMap};

/// A recipe error with the location it is about.
#[derive(Debug, Clone)]
pub struct RecipeError {
    /// Where the problem is.
    pub loc: Loc,
    /// What is wrong and what was expected.
    pub message: String,
}

impl RecipeError {
    /// An error at `loc`.
    pub fn at(loc: Loc, message: String) -> Self {
        RecipeError { loc, message }
    }
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.loc, abbreviate(&self.message))
    }
}

/// A message of at most ~1,000 characters: one quoting a huge value from the recipe (a
/// 100 kB name) keeps its start and its end, which say what was expected.
fn abbreviate(message: &str) -> std::borrow::Cow<'_, str> {
    const KEEP: usize = 400;
    let chars = message.chars().count();
    if chars <= 3 * KEEP {
        return message.into();
    }
    let head: String = message.chars().take(KEEP).collect();
    let tail: String = message.chars().skip(chars - KEEP).collect();
    format!(
        "{head} ... ({} characters left out) ... {tail}",
        chars - 2 * KEEP
    )
    .into()
}

impl std::error::Error for RecipeError {}

/// How to load a recipe: command-line overrides.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// `--set path=value` overrides, applied in order after `extends:`.
    pub sets: Vec<String>,
    /// `--store` / `ZFLOW_STORE`: beats the recipe's `store:`.
    pub store: Option<PathBuf>,
}

/// Where stages run. Not part of any stage's identity: switching executors re-runs nothing.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ExecutorConfig {
    /// Stages run on this machine, as threads and child processes of `zflow run`.
    #[default]
    Local,
    /// Each stage attempt is a Slurm batch job (`crate::slurm`).
    Slurm(crate::slurm::SlurmConfig),
}

/// One node of the stage graph, ready to plan and run.
#[derive(Clone)]
pub struct StageNode {
    /// Unique stage name.
    pub name: String,
    /// Names of the stages whose outputs this one reads, in declaration order.
    pub needs: Vec<String>,
    /// Resources, after the recipe's `resources:` override.
    pub resources: Resources,
    /// The kind with its parsed config.
    pub stage: Arc<dyn PreparedStage>,
    /// Where the stage is defined (for messages).
    pub loc: Loc,
    /// The config as the recipe gave it, settings outside the identity (like a train stage's
    /// `launch`) included: what a job on another machine parses again.
    pub config: serde_json::Value,
}

impl fmt::Debug for StageNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageNode")
            .field("name", &self.name)
            .field("kind", &self.stage.kind())
            .field("needs", &self.needs)
            .finish()
    }
}

/// A loaded, validated recipe.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// `name:`, or the file stem.
    pub name: String,
    /// The recipe file given on the command line.
    pub path: PathBuf,
    /// The store: `--store`, else `ZFLOW_STORE` (folded into `--store` by the CLI), else the
    /// recipe's `store:`, else `./zflow-store`.
    pub store: PathBuf,
    /// Where stages run.
    pub executor: ExecutorConfig,
    /// Stage nodes, in recipe order (sections first, then `stages:`).
    pub nodes: Vec<StageNode>,
    /// The merged recipe as JSON (after extends, --set and vars).
    pub document: serde_json::Value,
}

impl Recipe {
    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&StageNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

/// The engine's own top-level keys; other keys must belong to a registered section.
const CORE_KEYS: &[&str] = &["name", "description", "vars", "store", "executor", "stages"];

/// Loads and validates the recipe at `path`.
pub fn load(path: &Path, opts: &LoadOptions, registry: &Registry) -> Result<Recipe, RecipeError> {
    let mut root = compose::load_with_parents(path)?;
    for set in &opts.sets {
        compose::apply_set(&mut root, set)?;
    }
    compose::interpolate(&mut root)?;
    let mut locs = LocMap::new();
    let doc = root.to_json("", &mut locs);
    let at = |path: &str, message: String| RecipeError::at(locate(&locs, path, &root.loc), message);

    let obj = doc.as_object().expect("the composed recipe is a mapping");
    let section_keys: &[&str] = registry.sections().map(|s| s.keys()).unwrap_or_default();
    for key in obj.keys() {
        if !CORE_KEYS.contains(&key.as_str()) && !section_keys.contains(&key.as_str()) {
            let mut expected: Vec<&str> = CORE_KEYS.to_vec();
            expected.extend(section_keys);
            return Err(RecipeError::at(
                locate(&locs, &format!("{key}#key"), &root.loc),
                format!(
                    "unknown top-level field `{key}`, expected one of: {}",
                    expected.join(", ")
                ),
            ));
        }
    }

    let name = match obj.get("name") {
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err(at("name", "`name` must be a string".into())),
    };
    if let Some(d) = obj.get("description")
        && !d.is_string()
    {
        return Err(at("description", "`description` must be a string".into()));
    }
    let store = match (&opts.store, obj.get("store")) {
        (Some(s), _) => s.clone(),
        (None, Some(serde_json::Value::String(s))) => PathBuf::from(s),
        (None, Some(_)) => return Err(at("store", "`store` must be a path (a string)".into())),
        (None, None) => PathBuf::from("./zflow-store"),
    };
    let executor = match obj.get("executor") {
        None => ExecutorConfig::default(),
        Some(v) => typed::<ExecutorConfig>(v, "executor", &locs, &root.loc)?,
    };
    if let ExecutorConfig::Slurm(slurm) = &executor {
        slurm.check().map_err(|(path, message)| {
            RecipeError::at(locate_error(&locs, &path, &message, &root.loc), message)
        })?;
    }

    // Sections first, then explicit stages.
    let mut specs: Vec<NodeSpec> = Vec::new();
    if let Some(sections) = registry.sections() {
        let nodes = sections.expand(&doc).map_err(|e| {
            RecipeError::at(
                locate_error(&locs, &e.path, &e.message, &root.loc),
                e.message,
            )
        })?;
        specs.extend(nodes);
    }
    if let Some(stages) = obj.get("stages") {
        let Some(list) = stages.as_array() else {
            return Err(at(
                "stages",
                "`stages` must be a list of stage entries".into(),
            ));
        };
        for (i, entry) in list.iter().enumerate() {
            specs.push(stage_entry(
                entry,
                &format!("stages[{i}]"),
                &locs,
                &root.loc,
            )?);
        }
    }

    let mut nodes: Vec<StageNode> = Vec::with_capacity(specs.len());
    let mut seen: HashMap<String, String> = HashMap::new();
    // Input variable -> (stage name, its recipe path): `a-b`, `a_b` and `a.b` would all be
    // `$ZFLOW_IN_A_B`, and one of them would silently win in a stage that reads both.
    let mut input_vars: HashMap<String, (String, String)> = HashMap::new();
    for spec in specs {
        let loc = locate(&locs, &spec.path, &root.loc);
        if !valid_stage_name(&spec.name) {
            return Err(RecipeError::at(
                locate(&locs, &join(&spec.path, "name"), &root.loc),
                format!(
                    "`{}` is not a valid stage name (letters, digits, `_`, `-`, `.`, not starting with `.`, at most {MAX_STAGE_NAME} characters)",
                    spec.name
                ),
            ));
        }
        let var = crate::stage::input_env_var(&spec.name);
        if let Some((other, prev)) = input_vars
            .get(&var)
            .filter(|(other, _)| *other != spec.name)
        {
            return Err(RecipeError::at(
                loc,
                format!(
                    "stages `{}` and `{other}` (at {}) both reach their dependents as `${var}`; rename one",
                    spec.name,
                    locate(&locs, prev, &root.loc)
                ),
            ));
        }
        input_vars.insert(var, (spec.name.clone(), spec.path.clone()));
        if let Some(prev) = seen.insert(spec.name.clone(), spec.path.clone()) {
            return Err(RecipeError::at(
                loc,
                format!(
                    "stage name `{}` is used twice (also at {})",
                    spec.name,
                    locate(&locs, &prev, &root.loc)
                ),
            ));
        }
        let Some(kind) = registry.kind(&spec.kind) else {
            return Err(RecipeError::at(
                locate(&locs, &join(&spec.path, "kind"), &root.loc),
                format!(
                    "unknown stage kind `{}`, expected one of: {}",
                    spec.kind,
                    registry.kind_names().join(", ")
                ),
            ));
        };
        let stage = kind
            .prepare(spec.config.clone(), &spec.needs)
            .map_err(|e| {
                let path = join(&spec.path, &e.path);
                RecipeError::at(
                    locate_error(&locs, &path, &e.message, &root.loc),
                    format!("stage `{}`: {}", spec.name, e.message),
                )
            })?;
        let resources = spec.resources.clone().unwrap_or_else(|| stage.resources());
        nodes.push(StageNode {
            name: spec.name,
            needs: spec.needs,
            resources,
            stage,
            loc,
            config: spec.config,
        });
    }

    // Every `needs` names a stage.
    let names: BTreeMap<&str, ()> = nodes.iter().map(|n| (n.name.as_str(), ())).collect();
    for (spec_path, node) in seen_paths(&nodes, &seen) {
        for (j, need) in node.needs.iter().enumerate() {
            if !names.contains_key(need.as_str()) {
                let close = closest(need, names.keys().copied());
                return Err(RecipeError::at(
                    locate(&locs, &format!("{spec_path}.needs[{j}]"), &node.loc),
                    format!(
                        "stage `{}` needs `{need}`, which is not a stage of this recipe{}",
                        node.name,
                        close
                            .map(|c| format!(" (did you mean `{c}`?)"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
    }

    Ok(Recipe {
        name,
        path: path.to_path_buf(),
        store,
        executor,
        nodes,
        document: doc,
    })
}

fn seen_paths<'a>(
    nodes: &'a [StageNode],
    seen: &HashMap<String, String>,
) -> Vec<(String, &'a StageNode)> {
    nodes.iter().map(|n| (seen[&n.name].clone(), n)).collect()
}

/// The keys every `stages:` entry may have besides its kind's config.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryCommon {
    name: String,
    kind: String,
    #[serde(default)]
    needs: Vec<String>,
    #[serde(default)]
    resources: Option<Resources>,
}

fn stage_entry(
    entry: &serde_json::Value,
    path: &str,
    locs: &LocMap,
    root: &Loc,
) -> Result<NodeSpec, RecipeError> {
    let Some(map) = entry.as_object() else {
        return Err(RecipeError::at(
            locate(locs, path, root),
            "a stage entry must be a mapping with `name`, `kind` and the kind's settings".into(),
        ));
    };
    let mut common = serde_json::Map::new();
    let mut config = serde_json::Map::new();
    for (k, v) in map {
        if matches!(k.as_str(), "name" | "kind" | "needs" | "resources") {
            common.insert(k.clone(), v.clone());
        } else {
            config.insert(k.clone(), v.clone());
        }
    }
    let common: EntryCommon = typed(&serde_json::Value::Object(common), path, locs, root)?;
    Ok(NodeSpec {
        name: common.name,
        kind: common.kind,
        config: serde_json::Value::Object(config),
        needs: common.needs,
        resources: common.resources,
        path: path.to_string(),
    })
}

/// Deserializes `value` (found at recipe path `path`) into `T`, mapping a serde error to the
/// location of the offending key or value.
pub fn typed<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    path: &str,
    locs: &LocMap,
    root: &Loc,
) -> Result<T, RecipeError> {
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let inner = join(path, &serde_path(e.path()));
        let message = e.inner().to_string();
        RecipeError::at(
            locate_error(locs, &inner, &message, root),
            format!("`{inner}`: {message}"),
        )
    })
}

fn join(path: &str, child: &str) -> String {
    match (path.is_empty(), child.is_empty()) {
        (_, true) => path.to_string(),
        (true, false) => child.to_string(),
        (false, false) if child.starts_with('[') => format!("{path}{child}"),
        _ => format!("{path}.{child}"),
    }
}

/// The location for an error at `path`; for "unknown field `x`" errors, the key `x` itself.
fn locate_error(locs: &LocMap, path: &str, message: &str, root: &Loc) -> Loc {
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
    {
        let key_path = if path.ends_with(field) {
            path.to_string()
        } else {
            join(path, field)
        };
        if let Some(loc) = locs.get(&format!("{key_path}#key")) {
            return loc.clone();
        }
    }
    locate(locs, path, root)
}

/// The location recorded for `path`, or for its nearest ancestor that has one.
pub fn locate(locs: &LocMap, path: &str, root: &Loc) -> Loc {
    let mut p = path.to_string();
    loop {
        if let Some(loc) = locs.get(&p) {
            return loc.clone();
        }
        let cut = p.rfind(['.', '[']);
        match cut {
            Some(i) => p.truncate(i),
            None if !p.is_empty() => p.clear(),
            None => return root.clone(),
        }
    }
}

/// The longest stage name: a name becomes store folder and log names with a 12-character
/// identity and a suffix, which must stay under the file system's 255-byte limit.
const MAX_STAGE_NAME: usize = 200;

fn valid_stage_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STAGE_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
}

/// The candidate closest to `word` by edit distance, if reasonably close.
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min()
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = if ca == b[j] {
                prev
            } else {
                1 + prev.min(row[j]).min(row[j + 1])
            };
            prev = cur;
        }
    }
    row[b.len()]
}
