//! What the page is sent, as typed JSON: the graph, the live snapshot (every stage's state,
//! training curves, interruptions, preflight verdicts), a stage's details and the report.
//! `assets/app.js` reads exactly these shapes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use zflow_pipeline::plan::{self, Engine, StageState};
use zflow_pipeline::status::{self, StageStatus};
use zflow_pipeline::store::now_ms;
use zflow_stages::preflight::Verdict;

use crate::layout::{Place, layout};

/// `GET /api/graph`: the recipe's stages and where to draw them.
#[derive(Serialize)]
pub struct GraphView {
    /// The recipe's name.
    pub recipe: String,
    /// The recipe file.
    pub path: PathBuf,
    /// The store.
    pub store: PathBuf,
    /// Every stage, in the graph's node order.
    pub stages: Vec<NodeView>,
}

/// One stage in [`GraphView`].
#[derive(Serialize)]
pub struct NodeView {
    /// The stage.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The stages it reads (the graph's edges).
    pub needs: Vec<String>,
    /// Where it is drawn.
    #[serde(flatten)]
    pub place: Place,
}

/// The graph of `engine`'s recipe, laid out.
pub fn graph(engine: &Engine) -> GraphView {
    let nodes = engine.graph.nodes();
    let inputs: Vec<Vec<usize>> = (0..nodes.len())
        .map(|i| engine.graph.inputs_of(i))
        .collect();
    let places = layout(&inputs, engine.graph.topo_order());
    GraphView {
        recipe: engine.recipe.name.clone(),
        path: engine.recipe.path.clone(),
        store: engine.store.root().to_path_buf(),
        stages: nodes
            .iter()
            .zip(places)
            .map(|(n, place)| NodeView {
                name: n.name.clone(),
                kind: n.stage.kind().to_string(),
                needs: n.needs.clone(),
                place,
            })
            .collect(),
    }
}

/// Every stage's state and what interrupted training: the part of the live view that a plan
/// recomputes (`crate::live` adds the curves, which it reads incrementally).
#[derive(Clone, Serialize, PartialEq)]
pub struct Status {
    /// When it was taken (ms since the epoch).
    pub taken_ms: i64,
    /// Every stage's state, in the graph's node order, with `zflow status`'s words for it.
    pub stages: Vec<StatusView>,
    /// Restarts, rollbacks and preflight findings of every train stage, in recipe order.
    pub events: Vec<EventView>,
    /// The verdict of every preflight stage that finished, by stage.
    pub preflight: BTreeMap<String, serde_json::Value>,
}

impl Status {
    /// The train stages that have a folder (running, stopped or done), with it.
    pub fn train_folders(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.stages.iter().filter_map(|s| {
            let folder = s.status.folder.as_deref()?;
            (s.status.kind == "train").then_some((s.status.name.as_str(), folder))
        })
    }

    /// Equal but for when it was taken and the relative times that depend on that.
    pub fn same_as(&self, other: &Status) -> bool {
        self.events == other.events
            && self.preflight == other.preflight
            && self.stages.len() == other.stages.len()
            && self
                .stages
                .iter()
                .zip(&other.stages)
                .all(|(a, b)| a.status == b.status)
    }
}

/// One stage's state in a [`Status`].
#[derive(Clone, Serialize, PartialEq)]
pub struct StatusView {
    /// The typed state.
    #[serde(flatten)]
    pub status: StageStatus,
    /// `done`, `running`, `failed`, `stopped`, `pending` or `error`.
    pub word: &'static str,
    /// What `zflow status` says after the word, at [`Status::taken_ms`].
    pub detail: String,
}

/// One interruption of training.
#[derive(Clone, Serialize, PartialEq)]
pub struct EventView {
    /// The train stage.
    pub stage: String,
    /// `failure`, `loss_spike` or `preflight`.
    pub kind: String,
    /// The launch it happened in.
    pub attempt: u32,
    /// The last step before it.
    pub step: u64,
    /// When it was noticed (ms since the epoch).
    pub detected_ms: u64,
    /// Seconds until training made progress again.
    pub downtime_s: Option<f64>,
    /// What `zflow status` says of it.
    pub text: String,
}

/// Takes the [`Status`] of `engine`'s store: a plan, the leases and run records, the train
/// stages' events and the preflight stages' verdicts.
pub fn status(engine: &Engine) -> Result<Status> {
    let states = engine.plan(&BTreeSet::new())?;
    let statuses = status::statuses(engine, &states)?;
    let taken_ms = now_ms();
    let mut events = Vec::new();
    let mut preflight = BTreeMap::new();
    for s in &statuses {
        let Some(folder) = &s.folder else { continue };
        match s.kind.as_str() {
            "train" => events.extend(zflow_stages::train::interruptions(folder).into_iter().map(
                |e| EventView {
                    stage: s.name.clone(),
                    text: e.describe(),
                    downtime_s: e.downtime_s(),
                    kind: e.kind,
                    attempt: e.attempt,
                    step: e.step,
                    detected_ms: e.detected_ms,
                },
            )),
            "preflight" => {
                if let Some(v) = Verdict::read(folder) {
                    preflight.insert(s.name.clone(), serde_json::to_value(v)?);
                }
            }
            _ => {}
        }
    }
    Ok(Status {
        taken_ms,
        stages: statuses
            .into_iter()
            .map(|s| StatusView {
                word: s.state.word(),
                detail: s.state.detail(taken_ms),
                status: s,
            })
            .collect(),
        events,
        preflight,
    })
}

/// `GET /api/stage/{name}`: what clicking a stage shows.
#[derive(Serialize)]
pub struct StageView {
    /// The stage.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its inputs.
    pub needs: Vec<String>,
    /// Where the recipe defines it.
    pub defined_at: String,
    /// Its config as the recipe gives it.
    pub config: serde_json::Value,
    /// The identity the recipe asks for, when its inputs are complete.
    pub identity: Option<String>,
    /// What `zflow why` says.
    pub why: Vec<String>,
    /// The newest attempt's log file, and its last [`LOG_TAIL_BYTES`].
    pub log: Option<LogTail>,
    /// Its output files (complete stages; a partial folder's files while it runs).
    pub outputs: Vec<OutputFile>,
    /// Whether `outputs` are a committed output (their files can be opened from the page).
    pub committed: bool,
}

/// The end of a log file.
#[derive(Serialize)]
pub struct LogTail {
    /// The file.
    pub path: PathBuf,
    /// Its size, bytes.
    pub size: u64,
    /// Its last bytes (from a line start), as text.
    pub tail: String,
}

/// One output file.
#[derive(Serialize)]
pub struct OutputFile {
    /// Path inside the stage's folder.
    pub path: String,
    /// Size, bytes.
    pub size: u64,
}

/// How much of a log the page shows.
pub const LOG_TAIL_BYTES: u64 = 32 * 1024;

/// A partial folder's listing stops here (a tokenize stage may hold many files).
const MAX_LISTED: usize = 500;

/// The details of stage `name`, or `None` when the recipe has no such stage.
pub fn stage(engine: &Engine, name: &str) -> Result<Option<StageView>> {
    let Some(i) = engine.graph.position(name) else {
        return Ok(None);
    };
    let node = &engine.graph.nodes()[i];
    let states = engine.plan(&BTreeSet::new())?;
    let (identity, outputs, committed) = match &states[i] {
        StageState::Cached { manifest } => (
            Some(manifest.identity.clone()),
            manifest
                .files
                .iter()
                .map(|f| OutputFile {
                    path: f.path.clone(),
                    size: f.size,
                })
                .collect(),
            true,
        ),
        StageState::WillRun { identity, .. } => (
            Some(identity.clone()),
            list_files(&engine.store.partial_dir(name, identity)),
            false,
        ),
        _ => (None, Vec::new(), false),
    };
    let log = identity
        .as_ref()
        .map(|id| engine.store.log_path(name, id))
        .filter(|p| p.exists())
        .or_else(|| engine.latest_log(name))
        .map(|p| log_tail(&p))
        .transpose()?;
    Ok(Some(StageView {
        name: node.name.clone(),
        kind: node.stage.kind().to_string(),
        needs: node.needs.clone(),
        defined_at: node.loc.to_string(),
        config: node.config.clone(),
        identity,
        why: plan::why(engine, &states, i),
        log,
        outputs,
        committed,
    }))
}

fn log_tail(path: &Path) -> Result<LogTail> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size = f.metadata()?.len();
    let start = size.saturating_sub(LOG_TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if start > 0
        && let Some(nl) = text.find('\n')
    {
        text.drain(..=nl);
    }
    Ok(LogTail {
        path: path.to_path_buf(),
        size,
        tail: text,
    })
}

fn list_files(dir: &Path) -> Vec<OutputFile> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if out.len() >= MAX_LISTED {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(path),
                Ok(m) => {
                    if let Ok(rel) = path.strip_prefix(dir) {
                        out.push(OutputFile {
                            path: rel.to_string_lossy().into_owned(),
                            size: m.len(),
                        });
                    }
                }
                Err(_) => {}
            }
            if out.len() >= MAX_LISTED {
                break;
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// `GET /api/report`: the recipe's report, when its `report` stage is complete.
#[derive(Serialize)]
pub struct ReportView {
    /// The report stage.
    pub stage: String,
    /// `report.md` as HTML, its images pointing at `api/file/<stage>/...`.
    pub html: String,
}

/// The report of every complete stage of kind `report` (most recipes have one).
pub fn reports(engine: &Engine) -> Result<Vec<ReportView>> {
    let states = engine.plan(&BTreeSet::new())?;
    let mut out = Vec::new();
    for (node, state) in engine.graph.nodes().iter().zip(&states) {
        if node.stage.kind() != "report" {
            continue;
        }
        let StageState::Cached { manifest } = state else {
            continue;
        };
        let md_path = engine
            .output_dir(&node.name, &manifest.identity)
            .join("report.md");
        let md = std::fs::read_to_string(&md_path)
            .with_context(|| format!("reading {}", md_path.display()))?;
        out.push(ReportView {
            stage: node.name.clone(),
            html: markdown_html(&md, &format!("api/file/{}/", node.name)),
        });
    }
    Ok(out)
}

/// CommonMark (with tables) to HTML; relative links and images resolve under `base`. Raw
/// HTML in the Markdown is shown as text, not run.
pub fn markdown_html(md: &str, base: &str) -> String {
    use pulldown_cmark::{CowStr, Event, Options, Parser, Tag};
    let relative =
        |url: &CowStr| !url.contains("://") && !url.starts_with('/') && !url.starts_with('#');
    let events = Parser::new_ext(md, Options::ENABLE_TABLES).map(|e| match e {
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) if relative(&dest_url) => Event::Start(Tag::Image {
            link_type,
            dest_url: format!("{base}{dest_url}").into(),
            title,
            id,
        }),
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) if relative(&dest_url) => Event::Start(Tag::Link {
            link_type,
            dest_url: format!("{base}{dest_url}").into(),
            title,
            id,
        }),
        Event::Html(h) | Event::InlineHtml(h) => Event::Text(h),
        other => other,
    });
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

/// An output file opened for serving, checked against its stage's manifest.
pub struct ServedFile {
    /// The file, at its start.
    pub file: std::fs::File,
    /// Its size in bytes (the manifest's).
    pub len: u64,
    /// Where it is.
    pub path: PathBuf,
}

/// Output file `rel` of stage `name`, opened, when the stage is complete and the file is in
/// its manifest (`Ok(None)` otherwise): nothing outside the store's outputs is ever served.
/// No symbolic link is followed on the way (a committed output has none,
/// [`zflow_pipeline::store::resolve_links`]; a store written before that may), and the file
/// must still have the size and blake3 its manifest recorded: a file changed since the commit
/// is refused (`Err`), not served. The check streams the file, so memory stays bounded.
pub fn output_file(engine: &Engine, name: &str, rel: &str) -> Result<Option<ServedFile>> {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(i) = engine.graph.position(name) else {
        return Ok(None);
    };
    let states = engine.plan(&BTreeSet::new())?;
    let StageState::Cached { manifest } = &states[i] else {
        return Ok(None);
    };
    let Some(entry) = manifest.files.iter().find(|f| f.path == rel) else {
        return Ok(None);
    };
    let mut path = engine.output_dir(name, &manifest.identity);
    for part in Path::new(rel).components() {
        let std::path::Component::Normal(part) = part else {
            anyhow::bail!("`{rel}` is not a plain relative path");
        };
        path.push(part);
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(
            !meta.file_type().is_symlink(),
            "{} is a symbolic link; the page serves only the store's own files",
            path.display()
        );
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    anyhow::ensure!(
        len == entry.size,
        "{} is {len} bytes, but {} bytes were committed: it changed since, so it is not served",
        path.display(),
        entry.size
    );
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(&mut file)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        hasher.finalize().to_hex().as_str() == entry.blake3,
        "{} changed since its stage committed it (its blake3 differs from the manifest's), so it is not served",
        path.display()
    );
    file.seek(SeekFrom::Start(0))?;
    Ok(Some(ServedFile { file, len, path }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_images_resolve_under_the_stage_and_raw_html_is_text() {
        let html = markdown_html(
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n![loss](plots/loss.png) <script>x()</script>",
            "api/file/report/",
        );
        assert!(html.contains("<table>"), "{html}");
        assert!(
            html.contains(r#"src="api/file/report/plots/loss.png""#),
            "{html}"
        );
        assert!(!html.contains("<script>"), "{html}");
    }
}
