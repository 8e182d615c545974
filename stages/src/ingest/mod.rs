//! `ingest`: turns a fetched source into clean documents (Parquet: id, source, text).
//!
//! Reads plain text (a whole file per document, or records split by a delimiter or regex),
//! JSONL, Parquet, or Arrow IPC, streaming ([`read`]; gzip and zstd decompressed as read), from
//! the fetched folder or, for a local source, where its files are ([`crate::fetch::in_place`]) (Hugging Face `save_to_disk` folders use
//! the IPC *stream* format). The document text is a SQL expression over the columns
//! (`text: "goal || ' ' || sol1"`), an optional SQL `filter` runs in DataFusion, then Unicode
//! NFC normalisation, length limits and exact dedup by content hash within a run. Every dropped
//! document is counted by rule in `stats.parquet` / `stats.json`. A deduplicated source's
//! `dedup` stage drops the other exact and (with `near_dedup`) near duplicates over the whole
//! source, from the sorted runs of records this stage writes ([`crate::dedup`]); a shard of a
//! sharded source (`shard`) reads only its files.
//!
//! Documents keep their order (file order, then position in the file), so the output is
//! byte-identical across runs and `-j` settings. Files are read in batches of at most 8192
//! documents, so memory is bounded by a batch, not by a file or the corpus.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, RecordBatch, StringArray};
use arrow::datatypes::DataType;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::decontaminate::{Decontaminate, NgramSet};
use crate::filters::Filters;
use crate::minhash::NearDedup;
use crate::shard::Shard;

mod clean;
mod read;
mod write;

use clean::Cleaner;
use write::DocWriter;

/// The `ingest` stage kind.
pub struct Ingest;

/// File formats `ingest` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Plain UTF-8 text (gzip and zstd decompressed).
    Text,
    /// One JSON object per line (gzip and zstd decompressed).
    Jsonl,
    /// Parquet.
    Parquet,
    /// Arrow IPC, file or stream format.
    Arrow,
}

/// `ingest` settings (also the keys of a `sources:` entry besides `url`/`sha256`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// Source name written into every document's `source` column.
    pub source: String,
    /// Input format; by default from the file extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// Globs (relative to the fetched folder) of the files to read; default: all files.
    #[serde(default)]
    pub files: Vec<String>,
    /// Globs of files to skip (e.g. `*.dat` index files next to fortunes).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Text: records are separated by this exact string (e.g. "\n%\n"); default: a whole
    /// file is one document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<String>,
    /// Text: records are separated by matches of this regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_regex: Option<String>,
    /// SQL expression giving the document text (columnar formats); plain text's column is `text`.
    #[serde(default = "default_text")]
    pub text: String,
    /// SQL condition documents must meet (e.g. `length(text) > 200`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Unicode NFC normalisation.
    #[serde(default = "yes")]
    pub nfc: bool,
    /// Drop exact duplicates (by blake3 of the normalised text), keeping the first: those of
    /// a document in the same run here, the rest in the source's `dedup` stage.
    #[serde(default = "yes")]
    pub dedup: bool,
    /// Records per sorted run of `hashes/` and `bands/` ([`crate::sorted_runs`]): what dedup
    /// holds in memory at most (32 bytes a record, and the run's set of text hashes), however
    /// large the source.
    #[serde(default = "default_run_records")]
    pub dedup_run_records: usize,
    /// Drop documents shorter than this many characters (after trimming).
    #[serde(default)]
    pub min_chars: usize,
    /// Drop documents longer than this many characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chars: Option<usize>,
    /// The longest record read, in bytes (default 64 MiB, at most 1 GiB): a JSON line, a text
    /// record (a whole file when no `delimiter` or `split_regex` is set), or a string value of
    /// a Parquet or Arrow row. A longer one fails the stage with an error naming the file and
    /// the record, before more than this is held in memory (`max_chars` drops documents only
    /// once they are read). A record at the bound fits one batch's Arrow offsets, whose limit
    /// is 2 GiB.
    #[serde(
        default = "default_max_record_bytes",
        skip_serializing_if = "is_default_max_record_bytes"
    )]
    pub max_record_bytes: u64,
    /// Drop near duplicates ([`crate::minhash`]: MinHash + LSH over word n-grams; the source's
    /// `dedup` stage clusters them); `{}` takes datatrove's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_dedup: Option<NearDedup>,
    /// Read only this shard's files ([`crate::shard`]; set by `sources.<name>.shards`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Quality filters, language identification and PII redaction ([`crate::filters`]), after
    /// the length limits and before dedup.
    #[serde(default, skip_serializing_if = "Filters::is_empty")]
    pub filters: Filters,
    /// Check documents against the eval tasks' test n-grams of this `contamination` stage
    /// ([`crate::decontaminate`]), after the filters and before dedup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decontaminate: Option<Decontaminate>,
}

fn default_text() -> String {
    "text".into()
}
/// 4 Mi records: 128 MiB of a run, and its set.
fn default_run_records() -> usize {
    1 << 22
}
fn yes() -> bool {
    true
}
/// 64 MiB: a long book is a few MB.
const DEFAULT_MAX_RECORD_BYTES: u64 = 64 << 20;
/// 1 GiB: a batch (up to `read::BATCH_BYTES` before its last record) plus one record stays
/// under Arrow's 2 GiB of string offsets.
const MAX_RECORD_BYTES: u64 = 1 << 30;
fn default_max_record_bytes() -> u64 {
    DEFAULT_MAX_RECORD_BYTES
}
// Left out of the stage's identity at its default, so the identities of ingests written before
// the field existed stay what they were.
fn is_default_max_record_bytes(bytes: &u64) -> bool {
    *bytes == DEFAULT_MAX_RECORD_BYTES
}

impl Stage for Ingest {
    type Config = IngestConfig;
    const KIND: &'static str = "ingest";
    // 2: documents.parquet is written in row groups of 8192 documents, one input file at a time.
    // 3: near duplicates are candidate pairs verified by their signatures' similarity, and a
    // shard writes `signatures.bin`.
    // 4: exact dedup within a run only, every deduplicated source's records in sorted runs
    // (`hashes/`, `bands/`) for its `dedup` stage.
    const VERSION: u32 = 4;

    fn validate(&self, c: &IngestConfig, needs: &[String]) -> Result<(), ConfigError> {
        let contamination = c.decontaminate.as_ref().map(|d| &d.stage);
        let fetches = needs.iter().filter(|n| Some(*n) != contamination).count();
        if fetches != 1 {
            return Err(ConfigError::new(
                "needs",
                "an ingest stage reads exactly one input (its fetch stage), and its \
                 `decontaminate` stage",
            ));
        }
        if let Some(stage) = contamination
            && !needs.contains(stage)
        {
            return Err(ConfigError::new(
                "decontaminate.stage",
                format!("`{stage}` must be among the stage's needs"),
            ));
        }
        if c.delimiter.is_some() && c.split_regex.is_some() {
            return Err(ConfigError::new(
                "split_regex",
                "set either `delimiter` or `split_regex`, not both",
            ));
        }
        if let Some(re) = &c.split_regex {
            let compiled = regex::Regex::new(re)
                .map_err(|e| ConfigError::new("split_regex", format!("invalid regex: {e}")))?;
            if compiled.is_match("") {
                return Err(ConfigError::new(
                    "split_regex",
                    format!("`{re}` matches the empty string: a separator must match something"),
                ));
            }
        }
        if c.delimiter.as_deref() == Some("") {
            return Err(ConfigError::new("delimiter", "`delimiter` is empty"));
        }
        for (field, globs) in [("files", &c.files), ("exclude", &c.exclude)] {
            for (i, g) in globs.iter().enumerate() {
                glob::Pattern::new(g).map_err(|e| {
                    ConfigError::new(format!("{field}[{i}]"), format!("invalid glob `{g}`: {e}"))
                })?;
            }
        }
        if let Some(near) = &c.near_dedup {
            near.validate()?;
        }
        if !(1..=MAX_RECORD_BYTES).contains(&c.max_record_bytes) {
            return Err(ConfigError::new(
                "max_record_bytes",
                format!(
                    "{} is outside 1..={MAX_RECORD_BYTES} (1 GiB, what one Arrow batch of text holds with room to spare)",
                    c.max_record_bytes
                ),
            ));
        }
        if c.dedup_run_records == 0 {
            return Err(ConfigError::new(
                "dedup_run_records",
                "a run holds at least 1 record",
            ));
        }
        c.filters.validate()?;
        if let Some(sh) = c.shard
            && sh.index >= sh.count
        {
            return Err(ConfigError::new(
                "shard.index",
                format!(
                    "shard {} of {}: the index must be below the count",
                    sh.index, sh.count
                ),
            ));
        }
        if let Some(max) = c.max_chars
            && max < c.min_chars
        {
            return Err(ConfigError::new(
                "max_chars",
                format!("max_chars {max} is below min_chars {}", c.min_chars),
            ));
        }
        Ok(())
    }

    fn reads_only(&self, c: &IngestConfig, input: &str) -> Option<zflow_pipeline::FileFilter> {
        if c.decontaminate.as_ref().is_some_and(|d| d.stage == input) {
            return None;
        }
        // A shard reads its own files only, so only they count for its identity. (An unsharded
        // ingest counts its whole input, as it always has: its identity stays what it was.)
        c.shard?;
        let selection = Selection::new(c).ok()?;
        Some(Box::new(move |path: &str| selection.keeps(path)))
    }

    fn run(&self, c: &IngestConfig, ctx: &StageContext) -> Result<()> {
        let contamination = c.decontaminate.as_ref().map(|d| d.stage.as_str());
        let input = ctx
            .inputs()
            .iter()
            .find(|(name, _)| Some(name.as_str()) != contamination)
            .map(|(_, dir)| dir.clone())
            .context("ingest has no input")?;
        let ngrams = contamination
            .map(|stage| NgramSet::load(ctx.input(stage)?))
            .transpose()?;
        let files = select_files(&input, c)?;
        // A shard may hold no file (more shards than files): it is an empty part of its source.
        if files.is_empty() && c.shard.is_none() {
            bail!(
                "source `{}`: no files to read in {} (files: {:?}, exclude: {:?})",
                c.source,
                input.display(),
                c.files,
                c.exclude
            );
        }
        let format = match (c.format, files.first()) {
            (Some(f), _) => f,
            (None, Some(first)) => guess_format(first).with_context(|| {
                format!(
                    "source `{}`: cannot tell the format of {}; set `format:`",
                    c.source,
                    first.display()
                )
            })?,
            (None, None) => Format::Text,
        };
        ctx.progress()
            .set_message(format!("reading {} {format:?} files", files.len()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // One partition: documents come back in input order, so output is deterministic.
        let sql = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        let mut cleaner = Cleaner::new(c, ngrams, ctx.out_dir())?;
        let mut writer = DocWriter::create(ctx.out_dir(), &c.source)?;
        let mut jsonl_fields = BTreeMap::new();
        ctx.progress().set_length(files.len() as u64);
        for file in &files {
            ctx.check_cancelled()?;
            let rel = file.strip_prefix(&input).unwrap_or(file).to_string_lossy();
            let path = crate::fetch::in_place::resolve(&input, file, ctx.cache_dir(), ctx.cwd())?;
            // Batch by batch: memory is bounded by a batch, not by the file or the corpus.
            read::batches(c, format, &rel, &path, &mut jsonl_fields, &mut |batch| {
                let read = batch.num_rows() as u64;
                let texts = runtime.block_on(select_texts(&sql, c, batch))?;
                cleaner.stats.docs_in += read;
                cleaner.stats.dropped[0].1 += read.saturating_sub(texts.len() as u64);
                for text in texts {
                    if let Some(kept) = cleaner.keep(text)? {
                        writer.push(kept)?;
                    }
                }
                Ok(())
            })?;
            ctx.progress().inc(1);
        }
        writer.finish()?;
        let (stats, flagged) = cleaner.finish()?;
        if c.decontaminate.as_ref().map(|d| d.action) == Some(crate::decontaminate::Action::Flag) {
            std::fs::write(
                ctx.out_dir().join("contaminated.json"),
                serde_json::to_vec(&flagged)?,
            )?;
        }
        crate::ingest_stats::write(ctx.out_dir(), &c.source, &stats)?;
        ctx.progress().set_message(format!(
            "{} of {} documents kept",
            stats.docs_out, stats.docs_in
        ));
        tracing::info!(
            "{} documents in, {} out ({} bytes)",
            stats.docs_in,
            stats.docs_out,
            stats.bytes_out
        );
        if stats.docs_out == 0 && c.shard.is_none() {
            bail!(
                "source `{}`: every document was dropped ({} read; dropped by rule: {:?}); check `filter`, `min_chars` and `text`",
                c.source,
                stats.docs_in,
                stats.dropped
            );
        }
        Ok(())
    }
}

/// Which files of the fetched folder an ingest stage reads: its `files` and `exclude` globs
/// (each matched against the relative path and the file name), never a hidden file, and only
/// its shard's.
pub(crate) struct Selection {
    include: Vec<glob::Pattern>,
    exclude: Vec<glob::Pattern>,
    shard: Option<Shard>,
}

impl Selection {
    fn new(c: &IngestConfig) -> Result<Selection> {
        Selection::of(&c.files, &c.exclude, c.shard)
    }

    /// The selection of `files` and `exclude` globs (empty `files`: all), in `shard`.
    pub(crate) fn of(
        files: &[String],
        exclude: &[String],
        shard: Option<Shard>,
    ) -> Result<Selection> {
        let patterns = |globs: &[String]| -> Result<Vec<glob::Pattern>> {
            Ok(globs
                .iter()
                .map(|g| glob::Pattern::new(g))
                .collect::<Result<_, _>>()?)
        };
        Ok(Selection {
            include: patterns(files)?,
            exclude: patterns(exclude)?,
            shard,
        })
    }

    /// Whether the file at `rel` (relative to the fetched folder, `/`-separated) is read.
    pub(crate) fn keeps(&self, rel: &str) -> bool {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        let hit = |pats: &[glob::Pattern]| pats.iter().any(|g| g.matches(rel) || g.matches(name));
        !(name.starts_with('.')
            || hit(&self.exclude)
            || (!self.include.is_empty() && !hit(&self.include))
            || self.shard.is_some_and(|s| !s.holds(rel)))
    }
}

fn select_files(root: &Path, c: &IngestConfig) -> Result<Vec<PathBuf>> {
    let selection = Selection::new(c)?;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(root).unwrap_or(&p);
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if selection.keeps(&rel.join("/")) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn guess_format(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    let name = [".gz", ".zst", ".zstd"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(&name);
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") || name.ends_with(".json") {
        Some(Format::Jsonl)
    } else if name.ends_with(".parquet") {
        Some(Format::Parquet)
    } else if name.ends_with(".arrow") || name.ends_with(".ipc") || name.ends_with(".feather") {
        Some(Format::Arrow)
    } else {
        Some(Format::Text)
    }
}

/// Runs the text expression and filter over one batch in DataFusion; returns the texts kept,
/// in order.
async fn select_texts(
    sql: &SessionContext,
    c: &IngestConfig,
    batch: RecordBatch,
) -> Result<Vec<String>> {
    sql.deregister_table("docs")?;
    sql.register_table(
        "docs",
        Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?),
    )?;
    let filter = c
        .filter
        .as_deref()
        .map(|f| format!(" WHERE {f}"))
        .unwrap_or_default();
    let query = format!(
        "SELECT CAST({} AS VARCHAR) AS text FROM docs{filter}",
        c.text
    );
    // DataFusion's own message names the missing column and lists the valid ones.
    let df = sql.sql(&query).await.map_err(|e| {
        anyhow::anyhow!(
            "source `{}`: `text: {}`{} failed: {e}",
            c.source,
            c.text,
            c.filter
                .as_deref()
                .map(|f| format!(" / `filter: {f}`"))
                .unwrap_or_default()
        )
    })?;
    let mut texts = Vec::new();
    for batch in df.collect().await? {
        let col = arrow::compute::cast(batch.column(0), &DataType::Utf8)?;
        let strings = col
            .as_any()
            .downcast_ref::<StringArray>()
            .context("text is not a string")?;
        // A NULL text (missing field) counts as an empty document.
        texts.extend(strings.iter().map(|s| s.unwrap_or_default().to_string()));
    }
    Ok(texts)
}
