//! Planning: for each stage, is its output already in the store, and if not, why will it run?
//!
//! A stage's identity can only be computed once the contents of all its inputs are known
//! (identities hash input *contents*). So planning walks the graph in topological order:
//! a stage whose inputs are all complete gets an identity and is either cached or will run;
//! a stage behind a stage that will run waits on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use crate::graph::StageGraph;
use crate::identity::{Change, IdentityDoc, diff};
use crate::recipe::{Recipe, StageNode};
use crate::store::{Manifest, Store, content_hash_of};

/// A recipe opened against its store.
pub struct Engine {
    /// The recipe.
    pub recipe: Recipe,
    /// Its stage graph.
    pub graph: StageGraph,
    /// Its store.
    pub store: Store,
    /// The directory relative paths resolve against.
    pub cwd: PathBuf,
}

/// Why a stage will run.
#[derive(Clone, Debug)]
pub enum Reason {
    /// No output of this stage name was ever completed in this store.
    NeverRun,
    /// What changed since the last completed run of this stage name.
    Changed(Vec<Change>),
    /// The identity was completed before, but its output is gone from the store.
    OutputMissing,
    /// `--force`.
    Forced,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::NeverRun => write!(f, "never run before"),
            Reason::OutputMissing => write!(f, "its output is no longer in the store"),
            Reason::Forced => write!(f, "forced (--force)"),
            Reason::Changed(changes) if changes.is_empty() => write!(f, "identity changed"),
            Reason::Changed(changes) => {
                let parts: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
                write!(f, "{}", parts.join("; "))
            }
        }
    }
}

/// A stage's state in a plan.
#[derive(Clone, Debug)]
pub enum StageState {
    /// Complete in the store.
    Cached {
        /// Its manifest.
        manifest: Arc<Manifest>,
    },
    /// All inputs are complete; the stage itself is not.
    WillRun {
        /// Identity it will have.
        identity: String,
        /// What the identity hashes.
        doc: IdentityDoc,
        /// Why it runs.
        reason: Reason,
        /// A resumable stage's partial output exists and will be continued.
        resumes: bool,
    },
    /// The identity cannot be computed (e.g. a local file it fingerprints is missing).
    Broken {
        /// What went wrong.
        error: String,
    },
    /// Some inputs will be (re)built first; the identity is known only after.
    Waits {
        /// Inputs that are not complete yet.
        on: Vec<String>,
    },
}

impl Engine {
    /// Opens `recipe`'s store and builds its graph.
    pub fn open(recipe: Recipe) -> Result<Engine> {
        let graph = StageGraph::new(&recipe)?;
        let store = Store::open(&recipe.store)?;
        let cwd = std::env::current_dir().context("reading the current directory")?;
        Ok(Engine {
            recipe,
            graph,
            store,
            cwd,
        })
    }

    /// The identity doc of node `i` given the manifests of its complete inputs: each input
    /// counts by its content hash, or by that of the files the stage reads of it
    /// ([`crate::Stage::reads_only`]).
    pub fn identity_doc(
        &self,
        node: &StageNode,
        complete: &BTreeMap<String, Arc<Manifest>>,
    ) -> Result<IdentityDoc> {
        let mut inputs = BTreeMap::new();
        for need in &node.needs {
            let Some(m) = complete.get(need) else {
                bail!("input `{need}` of `{}` is not complete", node.name)
            };
            let hash = match node.stage.reads_only(need) {
                None => m.content_hash.clone(),
                Some(reads) => content_hash_of(m.files.iter().filter(|f| reads(&f.path))),
            };
            inputs.insert(need.clone(), hash);
        }
        let external = node
            .stage
            .external_fingerprint(&self.cwd)
            .with_context(|| format!("stage `{}`: fingerprinting its files", node.name))?;
        Ok(IdentityDoc {
            kind: node.stage.kind().to_string(),
            version: node.stage.version(),
            config: node.stage.canonical_config(),
            inputs,
            external,
        })
    }

    /// Why node `node` with identity `identity` is not cached.
    pub fn reason(&self, node: &StageNode, identity: &str, doc: &IdentityDoc) -> Reason {
        match self.store.last_completed(&node.name) {
            None => Reason::NeverRun,
            Some(last) if last.identity == identity => Reason::OutputMissing,
            Some(last) => Reason::Changed(diff(&last.identity_doc, doc)),
        }
    }

    /// Whether a resumable stage has a partial output to continue.
    pub fn has_partial(&self, node: &StageNode, identity: &str) -> bool {
        node.stage.resumable() && self.store.partial_dir(&node.name, identity).exists()
    }

    /// The plan for every stage, in recipe order. `force` stages are treated as not cached.
    pub fn plan(&self, force: &BTreeSet<usize>) -> Result<Vec<StageState>> {
        let nodes = self.graph.nodes();
        let mut states: Vec<Option<StageState>> = vec![None; nodes.len()];
        let mut complete: BTreeMap<String, Arc<Manifest>> = BTreeMap::new();
        for &i in self.graph.topo_order() {
            let node = &nodes[i];
            let waiting: Vec<String> = node
                .needs
                .iter()
                .filter(|n| !complete.contains_key(*n))
                .cloned()
                .collect();
            if !waiting.is_empty() {
                states[i] = Some(StageState::Waits { on: waiting });
                continue;
            }
            let doc = match self.identity_doc(node, &complete) {
                Ok(doc) => doc,
                Err(e) => {
                    states[i] = Some(StageState::Broken {
                        error: format!("{e:#}"),
                    });
                    continue;
                }
            };
            let identity = doc.hash();
            let cached = if force.contains(&i) {
                None
            } else {
                self.store.manifest(&node.name, &identity)
            };
            states[i] = Some(match cached {
                Some(manifest) => {
                    let manifest = Arc::new(manifest);
                    complete.insert(node.name.clone(), manifest.clone());
                    StageState::Cached { manifest }
                }
                None => {
                    let reason = if force.contains(&i) {
                        Reason::Forced
                    } else {
                        self.reason(node, &identity, &doc)
                    };
                    let resumes = self.has_partial(node, &identity);
                    StageState::WillRun {
                        identity,
                        doc,
                        reason,
                        resumes,
                    }
                }
            });
        }
        Ok(states
            .into_iter()
            .map(|s| s.expect("every node planned"))
            .collect())
    }

    /// The output folder of a cached stage.
    pub fn output_dir(&self, name: &str, identity: &str) -> PathBuf {
        self.store.output_dir(name, identity)
    }

    /// The log file path of the newest attempt of stage `name` at any identity.
    pub fn latest_log(&self, name: &str) -> Option<PathBuf> {
        let dir = self.store.root().join(".zflow/logs");
        let prefix = format!("{name}-");
        let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
        for entry in std::fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            let fname = entry.file_name().to_string_lossy().into_owned();
            // `<name>-<12 hex>.log`: the suffix must be exactly that, so `a` does not match `a-b`.
            let Some(rest) = fname
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".log"))
            else {
                continue;
            };
            if rest.len() != 12 || !rest.chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            let modified = entry.metadata().and_then(|m| m.modified()).ok()?;
            if best.as_ref().is_none_or(|(t, _)| modified > *t) {
                best = Some((modified, entry.path()));
            }
        }
        best.map(|(_, p)| p)
    }
}

/// Renders a plan as a table, one line per stage.
pub fn render(engine: &Engine, states: &[StageState]) -> String {
    let nodes = engine.graph.nodes();
    let width = nodes.iter().map(|n| n.name.len()).max().unwrap_or(5).max(5);
    let kinds = nodes
        .iter()
        .map(|n| n.stage.kind().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::new();
    let (mut cached, mut run, mut wait, mut broken) = (0, 0, 0, 0);
    for &i in engine.graph.topo_order() {
        let n = &nodes[i];
        let (word, detail) = match &states[i] {
            StageState::Cached { manifest } => {
                cached += 1;
                (
                    "cached",
                    short_path(
                        &engine.output_dir(&n.name, &manifest.identity),
                        engine.store.root(),
                    )
                    .to_string(),
                )
            }
            StageState::WillRun {
                reason, resumes, ..
            } => {
                run += 1;
                let resume = if *resumes {
                    " (resumes its partial output)"
                } else {
                    ""
                };
                ("run", format!("{reason}{resume}"))
            }
            StageState::Waits { on } => {
                wait += 1;
                ("run", format!("after {}", names_list(on)))
            }
            StageState::Broken { error } => {
                broken += 1;
                ("error", error.clone())
            }
        };
        out.push_str(&format!(
            "  {word:<7} {:<width$}  {:<kinds$}  {detail}\n",
            n.name,
            n.stage.kind()
        ));
    }
    out.push_str(&format!(
        "{} stages: {cached} cached, {} to run ({run} ready, {wait} after their inputs)",
        nodes.len(),
        run + wait
    ));
    if broken > 0 {
        out.push_str(&format!(", {broken} cannot be planned (see `error` lines)"));
    }
    out.push('\n');
    out
}

fn short_path(p: &Path, root: &Path) -> String {
    p.strip_prefix(root)
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| p.display().to_string())
}

/// Stage names for a line of text: all of them, or for a long list (a stage after thousands of
/// shards) the first few and how many more.
pub fn names_list(names: &[String]) -> String {
    const SHOWN: usize = 4;
    if names.len() <= SHOWN + 1 {
        return names.join(", ");
    }
    format!(
        "{} and {} more",
        names[..SHOWN].join(", "),
        names.len() - SHOWN
    )
}

/// What `zflow why` says of node `i`: cached (when, where), or why it will run; a stage that
/// waits on its inputs is explained through theirs, indented below it.
pub fn why(engine: &Engine, states: &[StageState], i: usize) -> Vec<String> {
    let mut lines = Vec::new();
    why_into(engine, states, i, 0, crate::store::now_ms(), &mut lines);
    lines
}

fn why_into(
    engine: &Engine,
    states: &[StageState],
    i: usize,
    depth: usize,
    now_ms: i64,
    lines: &mut Vec<String>,
) {
    let pad = "  ".repeat(depth);
    let node = &engine.graph.nodes()[i];
    match &states[i] {
        StageState::Cached { manifest } => lines.push(format!(
            "{pad}{}: cached ({}), output {}",
            node.name,
            ago(now_ms, manifest.finished_ms),
            engine.output_dir(&node.name, &manifest.identity).display()
        )),
        StageState::WillRun {
            reason, resumes, ..
        } => {
            lines.push(format!(
                "{pad}{}: will run{}",
                node.name,
                if *resumes {
                    " (resuming its partial output)"
                } else {
                    ""
                }
            ));
            match reason {
                Reason::Changed(changes) if !changes.is_empty() => {
                    lines.extend(changes.iter().map(|c| format!("{pad}  - {c}")))
                }
                other => lines.push(format!("{pad}  - {other}")),
            }
        }
        StageState::Broken { error } => {
            lines.push(format!("{pad}{}: cannot be planned: {error}", node.name))
        }
        StageState::Waits { on } => {
            lines.push(format!(
                "{pad}{}: will run after its inputs {}; its identity depends on their new contents",
                node.name,
                on.join(", ")
            ));
            for name in on {
                if let Some(j) = engine.graph.position(name) {
                    why_into(engine, states, j, depth + 1, now_ms, lines);
                }
            }
        }
    }
}
/// "12s ago", "3m ago", "2h ago", "4d ago".
pub fn ago(now_ms: i64, ms: i64) -> String {
    let s = (now_ms - ms).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}
