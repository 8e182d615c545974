//! Streaming readers: each input file as Arrow record batches of at most [`BATCH_ROWS`] rows
//! and about [`BATCH_BYTES`] of text, so an ingest's memory is bounded by a batch, not by a
//! file. No record is longer than the source's `max_record_bytes` (plain text without a
//! delimiter, where the whole file is one document, included): a longer one is an error before
//! more than the bound is read into memory.
//!
//! Compressed input (gzip or zstd, told by its magic bytes, whatever the name) is decompressed
//! as it is read. Errors name the file and the line (JSONL), byte offset (text) or row
//! (Parquet, Arrow).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use super::{Format, IngestConfig};

/// The most rows in one batch.
pub(super) const BATCH_ROWS: usize = 8192;
/// A batch is cut once it holds this many bytes of input.
pub(super) const BATCH_BYTES: usize = 16 << 20;

/// `path`, decompressed on the fly when it starts with gzip's or zstd's magic bytes.
pub(super) fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut raw = BufReader::with_capacity(1 << 20, file);
    let magic = raw
        .fill_buf()
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(raw),
        ))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(BufReader::with_capacity(
            1 << 20,
            zstd::stream::read::Decoder::with_buffer(raw)
                .with_context(|| format!("decompressing {}", path.display()))?,
        ))
    } else {
        Box::new(raw)
    })
}

/// Reads `path` (named `rel` in the fetched folder) in `format`, handing each batch to `each`.
/// `jsonl_fields` carries the JSON fields seen so far across the stage's files.
pub(super) fn batches(
    c: &IngestConfig,
    format: Format,
    rel: &str,
    path: &Path,
    jsonl_fields: &mut BTreeMap<String, DataType>,
    each: &mut dyn FnMut(RecordBatch) -> Result<()>,
) -> Result<()> {
    let shown = || path.display().to_string();
    let max = c.max_record_bytes;
    // Rows of the columnar formats read so far, for the row an error names.
    let mut rows = 0u64;
    let mut each_row_bounded = |batch: RecordBatch| -> Result<()> {
        check_values(&batch, max, path, rows)?;
        rows += batch.num_rows() as u64;
        each(batch)
    };
    match format {
        Format::Text => text(c, rel, path, each),
        Format::Jsonl => jsonl(path, max, jsonl_fields, each),
        Format::Parquet => {
            let file = File::open(path).with_context(|| format!("reading {}", shown()))?;
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .with_context(|| format!("{} is not a Parquet file", shown()))?
                    .with_batch_size(BATCH_ROWS)
                    .build()?;
            for batch in reader {
                each_row_bounded(batch.with_context(|| format!("reading {}", shown()))?)?;
            }
            Ok(())
        }
        Format::Arrow => {
            let mut file = File::open(path).with_context(|| format!("reading {}", shown()))?;
            let mut magic = [0u8; 6];
            let is_file = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
            let file = File::open(path)?;
            if is_file {
                for b in arrow::ipc::reader::FileReader::try_new(file, None)? {
                    each_row_bounded(b?)?;
                }
            } else {
                let reader = arrow::ipc::reader::StreamReader::try_new(BufReader::new(file), None)
                    .with_context(|| {
                        format!("{} is neither an Arrow IPC file nor stream", shown())
                    })?;
                for b in reader {
                    each_row_bounded(b?)?;
                }
            }
            Ok(())
        }
    }
}

/// Plain text: a whole file per document, or records split by `delimiter` or `split_regex`,
/// as batches with columns `file` and `text`.
fn text(
    c: &IngestConfig,
    rel: &str,
    path: &Path,
    each: &mut dyn FnMut(RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut input = open(path)?;
    let mut records = Vec::new();
    let mut bytes = 0usize;
    let mut emit = |records: &mut Vec<String>, bytes: &mut usize| -> Result<()> {
        if !records.is_empty() {
            each(text_batch(rel, std::mem::take(records))?)?;
        }
        *bytes = 0;
        Ok(())
    };
    let splitter = c
        .split_regex
        .as_deref()
        .map(regex::Regex::new)
        .transpose()?;
    let max = c.max_record_bytes;
    let too_long = |offset: u64| {
        anyhow::anyhow!(
            "{}: the record at byte offset {offset} is longer than {max} bytes, the source's \
             `max_record_bytes`{}",
            path.display(),
            if c.delimiter.is_none() && c.split_regex.is_none() {
                " (with no `delimiter` or `split_regex`, the whole file is one record)"
            } else {
                ""
            }
        )
    };
    let Some(split) = Splitter::new(c.delimiter.as_deref(), splitter) else {
        let mut all = Vec::new();
        (&mut input)
            .take(max.saturating_add(1))
            .read_to_end(&mut all)
            .with_context(|| format!("reading {}", path.display()))?;
        if all.len() as u64 > max {
            return Err(too_long(0));
        }
        records.push(utf8(all, path, 0)?);
        return emit(&mut records, &mut bytes);
    };
    // The window never holds more than one record at the bound, its separator's margin and one
    // read.
    let max_pending = usize::try_from(max)
        .unwrap_or(usize::MAX)
        .saturating_add(split.margin());
    // A window of the file: records end at separators found in it. A separator is trusted only
    // `split.margin()` bytes before the window's end, where more input cannot change the match.
    let mut window: Vec<u8> = Vec::new();
    let mut offset = 0u64; // of window[0] in the (decompressed) file
    let mut eof = false;
    while !eof {
        let before = window.len();
        window.resize(before + (4 << 20), 0);
        let n = read_full(&mut input, &mut window[before..])
            .with_context(|| format!("reading {}", path.display()))?;
        window.truncate(before + n);
        eof = n == 0;
        let limit = if eof {
            window.len()
        } else {
            window.len().saturating_sub(split.margin())
        };
        let mut start = 0;
        while let Some((sep_start, sep_end)) = split.find(&window[start..])
            && start + sep_end <= limit
        {
            if sep_start as u64 > max {
                return Err(too_long(offset + start as u64));
            }
            let record = window[start..start + sep_start].to_vec();
            bytes += record.len();
            records.push(utf8(record, path, offset + start as u64)?);
            start += sep_end;
            if records.len() >= BATCH_ROWS || bytes >= BATCH_BYTES {
                emit(&mut records, &mut bytes)?;
            }
        }
        window.drain(..start);
        offset += start as u64;
        if window.len() > max_pending {
            return Err(too_long(offset));
        }
    }
    if window.len() as u64 > max {
        return Err(too_long(offset));
    }
    records.push(utf8(window, path, offset)?);
    emit(&mut records, &mut bytes)
}

/// Fills `buf` as far as the input allows; returns the bytes read (0 only at the end).
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// How text records are separated.
enum Splitter {
    Delimiter(Box<memchr::memmem::Finder<'static>>),
    Regex(regex::bytes::Regex),
}

impl Splitter {
    fn new(delimiter: Option<&str>, regex: Option<regex::Regex>) -> Option<Splitter> {
        match (delimiter, regex) {
            (Some(d), _) => Some(Splitter::Delimiter(Box::new(
                memchr::memmem::Finder::new(d.as_bytes()).into_owned(),
            ))),
            (None, Some(re)) => Some(Splitter::Regex(
                regex::bytes::Regex::new(re.as_str()).expect("a valid regex stays valid"),
            )),
            (None, None) => None,
        }
    }

    /// The first separator in `hay`, as (start, end).
    fn find(&self, hay: &[u8]) -> Option<(usize, usize)> {
        match self {
            Splitter::Delimiter(f) => f.find(hay).map(|i| (i, i + f.needle().len())),
            Splitter::Regex(re) => re.find(hay).map(|m| (m.start(), m.end())),
        }
    }

    /// How far from the window's end a match may still change as more input arrives: a
    /// delimiter's length; for a regex, 64 KiB (a separator longer than that is cut).
    fn margin(&self) -> usize {
        match self {
            Splitter::Delimiter(f) => f.needle().len(),
            Splitter::Regex(_) => 64 << 10,
        }
    }
}

fn text_batch(rel: &str, texts: Vec<String>) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let files = StringArray::from(vec![rel; texts.len()]);
    let cols: Vec<ArrayRef> = vec![Arc::new(files), Arc::new(StringArray::from(texts))];
    Ok(RecordBatch::try_new(schema, cols)?)
}

/// `bytes` as text; an error names the file and the byte offset of the first invalid byte.
fn utf8(bytes: Vec<u8>, path: &Path, offset: u64) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = offset + e.utf8_error().valid_up_to() as u64;
        anyhow::anyhow!(
            "{} is not valid UTF-8: invalid bytes at byte offset {at}",
            path.display()
        )
    })
}

/// JSON lines, one object each, in batches. Each batch's schema is inferred from its lines,
/// plus (as nulls) every field an earlier batch of the stage had, so an expression over a field
/// that some lines lack sees NULL there. A field whose first line comes after a batch the
/// expression was run on is an error for that batch (DataFusion names the field).
fn jsonl(
    path: &Path,
    max: u64,
    fields: &mut BTreeMap<String, DataType>,
    each: &mut dyn FnMut(RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut input = open(path)?;
    let mut values = Vec::new();
    let mut bytes = 0usize;
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        // At most the bound and the line's end: a longer line is never held whole.
        let n = (&mut input)
            .take(max.saturating_add(1))
            .read_until(b'\n', &mut line)
            .with_context(|| format!("{} line {}: reading", path.display(), number + 1))?;
        if n == 0 {
            break;
        }
        number += 1;
        let content = line.len() - usize::from(line.ends_with(b"\n"));
        if content as u64 > max {
            bail!(
                "{} line {number}: longer than {max} bytes, the source's `max_record_bytes`",
                path.display()
            );
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&line)
            .with_context(|| format!("{} line {number}: not a JSON object", path.display()))?;
        if !v.is_object() {
            bail!(
                "{} line {number}: expected a JSON object per line",
                path.display()
            );
        }
        bytes += n;
        values.push(v);
        if values.len() >= BATCH_ROWS || bytes >= BATCH_BYTES {
            each(json_batch(&values, fields)?)?;
            values.clear();
            bytes = 0;
        }
    }
    if !values.is_empty() {
        each(json_batch(&values, fields)?)?;
    }
    Ok(())
}

/// Refuses a batch holding a string longer than `max` bytes, naming the file, the row (its
/// first row is row `first_row` of the file, counted from 0) and the column.
fn check_values(batch: &RecordBatch, max: u64, path: &Path, first_row: u64) -> Result<()> {
    use arrow::array::{Array, AsArray};
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let lengths: Box<dyn Iterator<Item = usize>> = match column.data_type() {
            DataType::Utf8 => {
                let a = column.as_string::<i32>();
                Box::new((0..a.len()).map(move |i| a.value_length(i) as usize))
            }
            DataType::LargeUtf8 => {
                let a = column.as_string::<i64>();
                Box::new((0..a.len()).map(move |i| a.value_length(i) as usize))
            }
            DataType::Utf8View => {
                let a = column.as_string_view();
                Box::new((0..a.len()).map(move |i| a.value(i).len()))
            }
            _ => continue,
        };
        for (row, len) in lengths.enumerate() {
            if len as u64 > max {
                bail!(
                    "{} row {}: column `{}` holds {len} bytes, more than the source's `max_record_bytes` ({max})",
                    path.display(),
                    first_row + row as u64,
                    field.name()
                );
            }
        }
    }
    Ok(())
}

fn json_batch(
    values: &[serde_json::Value],
    seen: &mut BTreeMap<String, DataType>,
) -> Result<RecordBatch> {
    use arrow::json::reader::{ReaderBuilder, infer_json_schema_from_iterator};
    let inferred = infer_json_schema_from_iterator(values.iter().map(|v| Ok(v.clone())))?;
    let mut all: Vec<Field> = inferred
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    for (name, dtype) in seen.iter() {
        if inferred.field_with_name(name).is_err() {
            all.push(Field::new(name, dtype.clone(), true));
        }
    }
    for f in inferred.fields() {
        seen.insert(f.name().clone(), f.data_type().clone());
    }
    let schema = Arc::new(Schema::new(all));
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_batch_size(values.len().max(1))
        .build_decoder()?;
    decoder.serialize(values)?;
    let mut batches = Vec::new();
    while let Some(batch) = decoder.flush()? {
        batches.push(batch);
    }
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::MAX_RECORD_BYTES;
    use std::io::Write;

    fn config(delimiter: Option<&str>, split_regex: Option<&str>) -> IngestConfig {
        let mut v = serde_json::json!({"source": "t"});
        if let Some(d) = delimiter {
            v["delimiter"] = d.into();
        }
        if let Some(r) = split_regex {
            v["split_regex"] = r.into();
        }
        serde_json::from_value(v).unwrap()
    }

    fn texts(c: &IngestConfig, path: &Path) -> Vec<String> {
        let mut out = Vec::new();
        batches(c, Format::Text, "f", path, &mut BTreeMap::new(), &mut |b| {
            let col = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            out.extend(col.iter().map(|s| s.unwrap().to_string()));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn text_records_split_across_window_boundaries_as_split_in_one_piece() {
        let dir = tempfile::tempdir().unwrap();
        // Records of every length around the 4 MiB window, separated by "\n%\n".
        let mut body = String::new();
        let mut want = Vec::new();
        for i in 0..40 {
            let rec = "x".repeat(((i * 997_331) % (6 << 20)) + i);
            body.push_str(&rec);
            want.push(rec);
            if i < 39 {
                body.push_str("\n%\n");
            }
        }
        let plain = dir.path().join("a.txt");
        std::fs::write(&plain, &body).unwrap();
        assert_eq!(texts(&config(Some("\n%\n"), None), &plain), want);
        assert_eq!(texts(&config(None, Some(r"\n%+\n")), &plain), want);
        // The same through zstd and gzip.
        let zst = dir.path().join("a.txt.zst");
        std::fs::write(&zst, zstd::encode_all(body.as_bytes(), 3).unwrap()).unwrap();
        assert_eq!(texts(&config(Some("\n%\n"), None), &zst), want);
        let gz = dir.path().join("a.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(body.as_bytes()).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        // The whole file (~120 MiB) as one record, under a bound raised to fit it.
        let mut whole = config(None, None);
        whole.max_record_bytes = MAX_RECORD_BYTES;
        assert_eq!(texts(&whole, &gz), vec![body.clone()]);
    }

    #[test]
    fn invalid_utf8_is_named_by_its_offset_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.txt");
        let mut bytes = b"one\n%\ntwo\n%\n".to_vec();
        bytes.extend([0xff, 0xfe]);
        std::fs::write(&p, bytes).unwrap();
        let err = batches(
            &config(Some("\n%\n"), None),
            Format::Text,
            "bad.txt",
            &p,
            &mut BTreeMap::new(),
            &mut |_| Ok(()),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("byte offset 12"), "{err:#}");
    }

    #[test]
    fn jsonl_batches_keep_fields_earlier_lines_had_and_name_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl.zst");
        let mut body = String::new();
        for i in 0..(BATCH_ROWS + 5) {
            if i < BATCH_ROWS {
                body.push_str(&format!("{{\"text\": \"d{i}\", \"title\": \"t\"}}\n"));
            } else {
                body.push_str(&format!("{{\"text\": \"d{i}\"}}\n"));
            }
        }
        std::fs::write(&p, zstd::encode_all(body.as_bytes(), 3).unwrap()).unwrap();
        let mut rows = Vec::new();
        batches(
            &config(None, None),
            Format::Jsonl,
            "a",
            &p,
            &mut BTreeMap::new(),
            &mut |b| {
                rows.push((b.num_rows(), b.schema().field_with_name("title").is_ok()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(rows, vec![(BATCH_ROWS, true), (5, true)]);

        std::fs::write(&p, "{\"text\": \"a\"}\n\n{\"text\": oops}\n").unwrap();
        let err = batches(
            &config(None, None),
            Format::Jsonl,
            "a",
            &p,
            &mut BTreeMap::new(),
            &mut |_| Ok(()),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("line 3"), "{err:#}");
    }

    /// Reads `path` in `format` with `max_record_bytes` of `max`: the records' count, or the
    /// error.
    fn bounded(delimiter: Option<&str>, format: Format, path: &Path, max: u64) -> Result<usize> {
        let mut c = config(delimiter, None);
        c.max_record_bytes = max;
        let mut n = 0;
        batches(&c, format, "f", path, &mut BTreeMap::new(), &mut |b| {
            n += b.num_rows();
            Ok(())
        })
        .map(|()| n)
    }

    #[test]
    fn a_record_past_the_bound_is_refused_by_file_and_record_before_it_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let err = |r: Result<usize>| format!("{:#}", r.unwrap_err());
        // A record exactly at the bound is read; one byte more is refused.
        let text = dir.path().join("a.txt");
        std::fs::write(&text, "0123456789\n%\n01234567890").unwrap();
        assert_eq!(bounded(Some("\n%\n"), Format::Text, &text, 11).unwrap(), 2);
        let e = err(bounded(Some("\n%\n"), Format::Text, &text, 10));
        assert!(
            e.contains("a.txt: the record at byte offset 13 is longer than 10 bytes"),
            "{e}"
        );
        // A whole file as one document.
        let e = err(bounded(None, Format::Text, &text, 10));
        assert!(
            e.contains("offset 0") && e.contains("the whole file is one record"),
            "{e}"
        );
        // No separator for 64 MiB: refused once the window passes the bound, not at the end.
        let endless = dir.path().join("endless.txt.zst");
        let body = vec![b'x'; 48 << 20];
        std::fs::write(&endless, zstd::encode_all(&body[..], 3).unwrap()).unwrap();
        let e = err(bounded(Some("\n%\n"), Format::Text, &endless, 1 << 20));
        assert!(
            e.contains("endless.txt.zst: the record at byte offset 0"),
            "{e}"
        );
        // A JSON line, compressed: named by its line.
        let jsonl = dir.path().join("a.jsonl.zst");
        let long = format!("{{\"text\": \"{}\"}}", "y".repeat(3 << 20));
        let lines = format!("{{\"text\": \"short\"}}\n{long}\n");
        std::fs::write(&jsonl, zstd::encode_all(lines.as_bytes(), 3).unwrap()).unwrap();
        assert_eq!(bounded(None, Format::Jsonl, &jsonl, 4 << 20).unwrap(), 2);
        let e = err(bounded(None, Format::Jsonl, &jsonl, 1 << 20));
        assert!(
            e.contains("a.jsonl.zst line 2: longer than 1048576 bytes"),
            "{e}"
        );
        // A Parquet row: named by its row and column.
        let parquet = dir.path().join("a.parquet");
        let texts = StringArray::from(vec!["short".to_string(), "z".repeat(2000)]);
        let batch = RecordBatch::try_from_iter([("text", Arc::new(texts) as ArrayRef)]).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            File::create(&parquet).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert_eq!(bounded(None, Format::Parquet, &parquet, 2000).unwrap(), 2);
        let e = err(bounded(None, Format::Parquet, &parquet, 1999));
        assert!(
            e.contains("a.parquet row 1: column `text` holds 2000 bytes"),
            "{e}"
        );
    }
}
