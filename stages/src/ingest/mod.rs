//! `ingest`: turns a fetched source into clean documents (Parquet: id, source, text).
//!
//! Reads plain text (a whole file per document, or records split by a delimiter or regex),
//! JSONL (optionally gzipped), Parquet, or Arrow IPC (Hugging Face `save_to_disk` folders use
//! the IPC *stream* format). The document text is a SQL expression over the columns
//! (`text: "goal || ' ' || sol1"`), an optional SQL `filter` runs in DataFusion, then Unicode
//! NFC normalisation, length limits, exact dedup by content hash and (with `near_dedup`)
//! near-duplicate removal by MinHash LSH ([`crate::minhash`]). Every dropped document is counted
//! by rule in `stats.parquet` / `stats.json`. A shard of a sharded source (`shard`) reads only
//! its files and leaves what crosses shards to the source's `dedup` stage ([`crate::dedup`]).
//!
//! Documents keep their order (file order, then position in the file), so the output is
//! byte-identical across runs and `-j` settings. Files are processed one at a time, so memory
//! is bounded by the largest input file, not by the corpus.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::ingest_stats::IngestStats;
use crate::minhash::{MinHasher, NearDedup};
use crate::shard::Shard;

/// The `ingest` stage kind.
pub struct Ingest;

/// File formats `ingest` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Plain UTF-8 text (`.gz` decompressed).
    Text,
    /// One JSON object per line (`.gz` decompressed).
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
    /// Drop exact duplicates (by blake3 of the normalised text), keeping the first.
    #[serde(default = "yes")]
    pub dedup: bool,
    /// Drop documents shorter than this many characters (after trimming).
    #[serde(default)]
    pub min_chars: usize,
    /// Drop documents longer than this many characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chars: Option<usize>,
    /// Drop near duplicates ([`crate::minhash`]: MinHash + LSH over word n-grams); `{}` takes
    /// datatrove's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_dedup: Option<NearDedup>,
    /// Read only this shard's files ([`crate::shard`]; set by `sources.<name>.shards`). Its
    /// duplicates of other shards' documents are the source's `dedup` stage's to drop: this
    /// stage writes `hashes.bin` for it (with `dedup`) and `bands.bin` (with `near_dedup`), and
    /// leaves near duplicates, within the shard too, to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

fn default_text() -> String {
    "text".into()
}
fn yes() -> bool {
    true
}

impl Stage for Ingest {
    type Config = IngestConfig;
    const KIND: &'static str = "ingest";
    // 2: documents.parquet is written in row groups of 8192 documents, one input file at a time.
    const VERSION: u32 = 2;

    fn validate(&self, c: &IngestConfig, needs: &[String]) -> Result<(), ConfigError> {
        if needs.len() != 1 {
            return Err(ConfigError::new(
                "needs",
                "an ingest stage reads exactly one input (its fetch stage)",
            ));
        }
        if c.delimiter.is_some() && c.split_regex.is_some() {
            return Err(ConfigError::new(
                "split_regex",
                "set either `delimiter` or `split_regex`, not both",
            ));
        }
        if let Some(re) = &c.split_regex {
            regex::Regex::new(re)
                .map_err(|e| ConfigError::new("split_regex", format!("invalid regex: {e}")))?;
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

    fn reads_only(&self, c: &IngestConfig, _input: &str) -> Option<zflow_pipeline::FileFilter> {
        // A shard reads its own files only, so only they count for its identity. (An unsharded
        // ingest counts its whole input, as it always has: its identity stays what it was.)
        c.shard?;
        let selection = Selection::new(c).ok()?;
        Some(Box::new(move |path: &str| selection.keeps(path)))
    }

    fn run(&self, c: &IngestConfig, ctx: &StageContext) -> Result<()> {
        let input = ctx
            .inputs()
            .values()
            .next()
            .context("ingest has no input")?
            .clone();
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
        // One file at a time: memory is bounded by the largest file, not the corpus.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut cleaner = Cleaner::new(c);
        let mut writer = DocWriter::create(ctx.out_dir(), &c.source)?;
        ctx.progress().set_length(files.len() as u64);
        for file in &files {
            ctx.check_cancelled()?;
            let (texts, read) =
                runtime.block_on(select_texts(c, format, &input, std::slice::from_ref(file)))?;
            cleaner.stats.docs_in += read;
            cleaner.stats.dropped[0].1 += read.saturating_sub(texts.len() as u64);
            for text in texts {
                if let Some(kept) = cleaner.keep(text) {
                    writer.push(kept)?;
                }
            }
            ctx.progress().inc(1);
        }
        writer.finish()?;
        if let Some(hashes) = cleaner.hashes {
            crate::dedup::write_records(&ctx.out_dir().join(crate::dedup::EXACT), hashes)?;
        }
        if let Some(Near::Record { bands, .. }) = cleaner.near {
            crate::dedup::write_records(&ctx.out_dir().join(crate::dedup::NEAR), bands)?;
        }
        let stats = cleaner.stats;
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
    let name = name.strip_suffix(".gz").unwrap_or(&name);
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

fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {}", path.display()))?;
        bytes = out;
    }
    Ok(bytes)
}

fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        anyhow::anyhow!(
            "{} is not valid UTF-8: invalid bytes at byte offset {at}",
            path.display()
        )
    })
}

/// Runs the text expression and filter in DataFusion; returns (texts kept in order, docs read).
async fn select_texts(
    c: &IngestConfig,
    format: Format,
    root: &Path,
    files: &[PathBuf],
) -> Result<(Vec<String>, u64)> {
    // One partition: documents come back in input order, so output is deterministic.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
    let text_expr = match format {
        Format::Text => {
            let batch = text_batch(c, root, files)?;
            ctx.register_table(
                "docs",
                Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?),
            )?;
            "text".to_string()
        }
        Format::Jsonl => {
            let batches = jsonl_batches(files)?;
            let schema = batches
                .first()
                .map(|b| b.schema())
                .context("no JSON lines read")?;
            ctx.register_table("docs", Arc::new(MemTable::try_new(schema, vec![batches])?))?;
            c.text.clone()
        }
        Format::Arrow => {
            let batches = arrow_batches(files)?;
            let schema = batches
                .first()
                .map(|b| b.schema())
                .context("no Arrow batches read")?;
            ctx.register_table("docs", Arc::new(MemTable::try_new(schema, vec![batches])?))?;
            c.text.clone()
        }
        Format::Parquet => {
            let paths: Vec<String> = files
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let df = ctx
                .read_parquet(paths, ParquetReadOptions::default())
                .await?;
            ctx.register_table("docs", df.into_view())?;
            c.text.clone()
        }
    };
    let total: u64 = {
        let batches = ctx
            .sql("SELECT count(*) FROM docs")
            .await?
            .collect()
            .await?;
        batches
            .first()
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .map(|a| a.value(0) as u64)
            })
            .unwrap_or(0)
    };
    let filter = c
        .filter
        .as_deref()
        .map(|f| format!(" WHERE {f}"))
        .unwrap_or_default();
    let sql = format!("SELECT CAST({text_expr} AS VARCHAR) AS text FROM docs{filter}");
    // DataFusion's own message names the missing column and lists the valid ones.
    let df = ctx.sql(&sql).await.map_err(|e| {
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
        let col = batch.column(0);
        let col = arrow::compute::cast(col, &DataType::Utf8)?;
        let strings = col
            .as_any()
            .downcast_ref::<StringArray>()
            .context("text is not a string")?;
        for i in 0..strings.len() {
            // A NULL text (missing field) counts as an empty document.
            texts.push(if strings.is_null(i) {
                String::new()
            } else {
                strings.value(i).to_string()
            });
        }
    }
    Ok((texts, total))
}

fn text_batch(c: &IngestConfig, root: &Path, files: &[PathBuf]) -> Result<RecordBatch> {
    let splitter = c
        .split_regex
        .as_deref()
        .map(regex::Regex::new)
        .transpose()?;
    let (mut names, mut texts) = (Vec::new(), Vec::new());
    for path in files {
        let text = utf8(read_maybe_gz(path)?, path)?;
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        let records: Vec<&str> = match (&c.delimiter, &splitter) {
            (Some(d), _) => text.split(d.as_str()).collect(),
            (None, Some(re)) => re.split(&text).collect(),
            (None, None) => vec![text.as_str()],
        };
        for r in records {
            names.push(rel.clone());
            texts.push(r.to_string());
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(names)),
            Arc::new(StringArray::from(texts)),
        ],
    )?)
}

fn jsonl_batches(files: &[PathBuf]) -> Result<Vec<RecordBatch>> {
    use arrow::json::reader::{ReaderBuilder, infer_json_schema_from_iterator};
    // One schema over all files, so a field missing from some lines is a NULL, not an error.
    let mut values = Vec::new();
    for path in files {
        let text = utf8(read_maybe_gz(path)?, path)?;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{} line {}: not a JSON object", path.display(), n + 1))?;
            if !v.is_object() {
                bail!(
                    "{} line {}: expected a JSON object per line",
                    path.display(),
                    n + 1
                );
            }
            values.push(v);
        }
    }
    let schema = Arc::new(infer_json_schema_from_iterator(
        values.iter().map(|v| Ok(v.clone())),
    )?);
    let mut decoder = ReaderBuilder::new(schema).build_decoder()?;
    decoder.serialize(&values)?;
    let mut out = Vec::new();
    while let Some(batch) = decoder.flush()? {
        out.push(batch);
    }
    Ok(out)
}

fn arrow_batches(files: &[PathBuf]) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for path in files {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        if bytes.starts_with(b"ARROW1") {
            let reader =
                arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)?;
            for b in reader {
                out.push(b?);
            }
        } else {
            let reader =
                arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
                    .with_context(|| {
                        format!("{} is neither an Arrow IPC file nor stream", path.display())
                    })?;
            for b in reader {
                out.push(b?);
            }
        }
    }
    Ok(out)
}

/// NFC, length limits and dedup, in that order, one document at a time, counting drops.
struct Cleaner<'a> {
    c: &'a IngestConfig,
    seen: HashSet<[u8; 32]>,
    stats: IngestStats,
    /// Of a deduplicated shard: every kept document's hash, for the source's dedup stage.
    hashes: Option<Vec<crate::dedup::DocHash>>,
    /// With `near_dedup`: what near-duplicate detection keeps.
    near: Option<Near>,
}

/// Near-duplicate detection in an ingest stage.
enum Near {
    /// Unsharded: drop a document one of whose bands an earlier document had.
    Drop {
        hasher: MinHasher,
        seen: HashSet<[u8; 16]>,
    },
    /// A shard: record every kept document's bands for the source's dedup stage.
    Record {
        hasher: MinHasher,
        bands: Vec<crate::dedup::DocHash>,
    },
}

impl<'a> Cleaner<'a> {
    fn new(c: &'a IngestConfig) -> Self {
        let near = c.near_dedup.map(|settings| {
            let hasher = MinHasher::new(settings);
            match c.shard {
                None => Near::Drop {
                    hasher,
                    seen: HashSet::new(),
                },
                Some(_) => Near::Record {
                    hasher,
                    bands: Vec::new(),
                },
            }
        });
        let mut rules = vec!["filter", "empty", "min_chars", "max_chars", "duplicate"];
        if matches!(near, Some(Near::Drop { .. })) {
            rules.push("near_duplicate");
        }
        let dropped = rules.iter().map(|r| (r.to_string(), 0, 0)).collect();
        Cleaner {
            c,
            seen: HashSet::new(),
            stats: IngestStats {
                dropped,
                ..Default::default()
            },
            hashes: (c.shard.is_some() && c.dedup).then(Vec::new),
            near,
        }
    }

    /// Whether `text` is a near duplicate of an earlier document (unsharded); a shard records
    /// the bands of the document it is about to keep instead, and says no.
    fn near_duplicate(&mut self, text: &str) -> bool {
        let doc = self.stats.docs_out;
        match &mut self.near {
            None => false,
            Some(Near::Drop { hasher, seen }) => {
                let keys = hasher.band_keys(text);
                // Every band goes in, also a dropped document's: the rule compares with every
                // earlier document, as the dedup stage's merge does across shards.
                let mut hit = false;
                for k in keys {
                    hit |= !seen.insert(k);
                }
                hit
            }
            Some(Near::Record { hasher, bands }) => {
                let bytes = text.len() as u64;
                bands.extend(
                    hasher
                        .band_keys(text)
                        .into_iter()
                        .map(|hash| crate::dedup::DocHash { hash, doc, bytes }),
                );
                false
            }
        }
    }

    /// The cleaned text, or `None` (counted under its rule) when a rule drops it.
    fn keep(&mut self, text: String) -> Option<String> {
        let c = self.c;
        self.stats.bytes_in += text.len() as u64;
        let text: String = if c.nfc { text.nfc().collect() } else { text };
        let chars = text.trim().chars().count();
        let rule = if chars == 0 {
            "empty"
        } else if chars < c.min_chars {
            "min_chars"
        } else if c.max_chars.is_some_and(|m| chars > m) {
            "max_chars"
        } else {
            // One hash per text: the stage's own dedup set and a shard's record share it.
            let hash = c.dedup.then(|| blake3::hash(text.as_bytes()));
            if hash.is_some_and(|h| !self.seen.insert(*h.as_bytes())) {
                "duplicate"
            } else if self.near_duplicate(&text) {
                "near_duplicate"
            } else {
                if let (Some(hashes), Some(h)) = (&mut self.hashes, &hash) {
                    let bytes = text.len() as u64;
                    hashes.push(crate::dedup::DocHash::of(h, self.stats.docs_out, bytes));
                }
                self.stats.docs_out += 1;
                self.stats.bytes_out += text.len() as u64;
                return Some(text);
            }
        };
        if let Some(entry) = self.stats.dropped.iter_mut().find(|(r, _, _)| r == rule) {
            entry.1 += 1;
            entry.2 += text.len() as u64;
        }
        None
    }
}

/// `documents.parquet`, written in row groups of [`DocWriter::CHUNK`] documents as they come.
struct DocWriter {
    writer: ArrowWriter<std::fs::File>,
    schema: Arc<Schema>,
    source: String,
    next_id: u64,
    pending: Vec<String>,
}

impl DocWriter {
    const CHUNK: usize = 8192;

    fn create(out: &Path, source: &str) -> Result<DocWriter> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("source", DataType::Utf8, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let file = std::fs::File::create(out.join("documents.parquet"))?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        Ok(DocWriter {
            writer,
            schema,
            source: source.to_string(),
            next_id: 0,
            pending: Vec::new(),
        })
    }

    fn push(&mut self, text: String) -> Result<()> {
        self.pending.push(text);
        if self.pending.len() >= Self::CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let n = self.pending.len();
        let ids = UInt64Array::from_iter_values(self.next_id..self.next_id + n as u64);
        let sources = StringArray::from(vec![self.source.as_str(); n]);
        let texts = StringArray::from_iter_values(self.pending.iter());
        let cols: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(sources), Arc::new(texts)];
        self.writer
            .write(&RecordBatch::try_new(self.schema.clone(), cols)?)?;
        // Row groups of exactly CHUNK documents, whatever the file boundaries: deterministic bytes.
        self.writer.flush()?;
        self.next_id += n as u64;
        self.pending.clear();
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.flush()?;
        self.writer.close()?;
        Ok(())
    }
}
