//! Run records: one row per stage attempt, appended to the store as Parquet.
//!
//! Each attempt is its own small Parquet file (written to a temp name, then renamed), so
//! "append" never rewrites anything and concurrent runs never contend. `zflow query` reads
//! the folder as one table named `runs`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;

use crate::store::now_ms;

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Output committed.
    Ok,
    /// The stage returned an error.
    Failed,
    /// Stopped by Ctrl-C / SIGTERM.
    Cancelled,
}

impl Status {
    /// The word stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// One stage attempt.
#[derive(Clone, Debug)]
pub struct RunRecord {
    /// Unique id of the `zflow run` invocation.
    pub run_id: String,
    /// Recipe name.
    pub recipe: String,
    /// Stage name.
    pub stage: String,
    /// Stage kind.
    pub kind: String,
    /// Full identity.
    pub identity: String,
    /// How it ended.
    pub status: Status,
    /// Error message, for failed attempts.
    pub error: Option<String>,
    /// Unix ms at start.
    pub start_ms: i64,
    /// Unix ms at end.
    pub end_ms: i64,
    /// Host name.
    pub host: String,
    /// Process id of `zflow run`.
    pub pid: u32,
    /// The stage's log file.
    pub log: String,
    /// The batch job that ran the attempt (`slurm 12 COMPLETED`), on a cluster executor.
    pub job: Option<String>,
}

/// The Arrow schema of the `runs` table.
pub fn schema() -> Arc<Schema> {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("recipe", DataType::Utf8, false),
        Field::new("stage", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("identity", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, true),
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
        Field::new("duration_s", DataType::Float64, false),
        Field::new("host", DataType::Utf8, false),
        Field::new("pid", DataType::Int64, false),
        Field::new("zflow_version", DataType::Utf8, false),
        Field::new("log", DataType::Utf8, false),
        Field::new("job", DataType::Utf8, true),
    ]))
}

/// Appends `record` to the store's records folder.
pub fn append(records_dir: &Path, record: &RunRecord) -> Result<()> {
    let r = record;
    let str1 = |s: &str| Arc::new(StringArray::from(vec![s])) as ArrayRef;
    let ts = |ms: i64| {
        Arc::new(TimestampMillisecondArray::from(vec![ms]).with_timezone("UTC")) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        str1(&r.run_id),
        str1(&r.recipe),
        str1(&r.stage),
        str1(&r.kind),
        str1(&r.identity),
        str1(r.status.as_str()),
        Arc::new(StringArray::from(vec![r.error.as_deref()])),
        ts(r.start_ms),
        ts(r.end_ms),
        Arc::new(Float64Array::from(vec![
            (r.end_ms - r.start_ms) as f64 / 1000.0,
        ])),
        str1(&r.host),
        Arc::new(Int64Array::from(vec![r.pid as i64])),
        str1(env!("CARGO_PKG_VERSION")),
        str1(&r.log),
        Arc::new(StringArray::from(vec![r.job.as_deref()])),
    ];
    let batch = RecordBatch::try_new(schema(), columns)?;
    let name = format!("{}-{}-{}", r.start_ms, r.pid, sanitize(&r.stage));
    let tmp = records_dir.join(format!(".{name}.{}.tmp", now_ms()));
    let dest = records_dir.join(format!("{name}.parquet"));
    let written = (|| -> Result<()> {
        let file =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut writer = ArrowWriter::try_new(file, schema(), None)?;
        writer.write(&batch)?;
        let file = writer.into_inner()?;
        file.sync_all()?;
        zflow_files::atomic::rename(&tmp, &dest)
    })();
    if let Err(e) = written {
        // A full disk leaves nothing behind (a half-written temporary would stay forever).
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing the run record {}", dest.display()));
    }
    zflow_files::atomic::sync_dir(records_dir)
}

/// How old a record's temporary file must be before a run takes it for a crashed writer's
/// (a record is written in milliseconds; a live writer's temporary is never this old).
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files that writers killed mid-write left in `records_dir` (`.*.tmp`,
/// older than [`STALE_TEMPORARY`], so a concurrent run's write in flight is never touched).
pub fn remove_stale_temporaries(records_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(records_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMPORARY);
        if name.starts_with('.') && name.ends_with(".tmp") && old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Bytes held for one attempt's run record: a record is ~5 KB, its error text at most a few.
const RESERVE_BYTES: usize = 256 << 10;

/// Disk space held for an attempt's run record while the attempt runs, so that an attempt that
/// fails because the store's disk is full (a checkpoint that no longer fits) still leaves its
/// record, error included, and `zflow status` says what happened. Dropping it frees the space:
/// [`append`] the record right after.
///
/// The file is `.reserve-<host>-<pid>-<stage>-<ms>` in the records folder; one that a killed
/// run left is removed by the next reserve taken on the same host once its pid is gone.
pub struct Reserve(Option<std::path::PathBuf>);

impl Reserve {
    /// Holds [`RESERVE_BYTES`] in `records_dir` for an attempt of `stage`. A disk already full
    /// holds nothing (the attempt still runs; its record may then be lost, as before).
    pub fn hold(records_dir: &Path, stage: &str) -> Reserve {
        let host = sanitize(&crate::lease::hostname());
        remove_dead_reserves(records_dir, &host);
        let pid = std::process::id();
        let path = records_dir.join(format!(
            ".reserve-{host}-{pid}-{}-{}",
            sanitize(stage),
            now_ms()
        ));
        match std::fs::write(&path, vec![0u8; RESERVE_BYTES]) {
            Ok(()) => Reserve(Some(path)),
            Err(e) => {
                tracing::warn!("no space held for the run record of `{stage}`: {e}");
                let _ = std::fs::remove_file(&path);
                Reserve(None)
            }
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes the reserves of runs on `host` whose process is gone.
fn remove_dead_reserves(records_dir: &Path, host: &str) {
    let Ok(entries) = std::fs::read_dir(records_dir) else {
        return;
    };
    let prefix = format!(".reserve-{host}-");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        // SAFETY: signal 0 sends nothing; it asks whether the process exists (EPERM: it does,
        // as another user's).
        let gone = |pid: i32| {
            (unsafe { libc::kill(pid, 0) }) != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        };
        if pid.is_some_and(gone) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Reads every record in the folder (used by `zflow status`; `zflow query` uses DataFusion).
pub fn read_all(records_dir: &Path) -> Result<Vec<RunRecord>> {
    use arrow::array::Array;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(records_dir) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("parquet") {
            continue;
        }
        let file = std::fs::File::open(&path)?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
        for batch in reader {
            let batch = batch?;
            let s = |name: &str| {
                batch
                    .column_by_name(name)
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
            };
            let t = |name: &str| {
                batch.column_by_name(name).and_then(|c| {
                    c.as_any()
                        .downcast_ref::<TimestampMillisecondArray>()
                        .cloned()
                })
            };
            let (
                Some(run_id),
                Some(recipe),
                Some(stage),
                Some(kind),
                Some(identity),
                Some(status),
                Some(error),
            ) = (
                s("run_id"),
                s("recipe"),
                s("stage"),
                s("kind"),
                s("identity"),
                s("status"),
                s("error"),
            )
            else {
                continue;
            };
            let (Some(start), Some(end), Some(host), Some(log)) =
                (t("start"), t("end"), s("host"), s("log"))
            else {
                continue;
            };
            // Older records have no `job` column.
            let job = s("job");
            let pid = batch
                .column_by_name("pid")
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>().cloned());
            for i in 0..batch.num_rows() {
                out.push(RunRecord {
                    run_id: run_id.value(i).into(),
                    recipe: recipe.value(i).into(),
                    stage: stage.value(i).into(),
                    kind: kind.value(i).into(),
                    identity: identity.value(i).into(),
                    status: match status.value(i) {
                        "ok" => Status::Ok,
                        "cancelled" => Status::Cancelled,
                        _ => Status::Failed,
                    },
                    error: (!error.is_null(i)).then(|| error.value(i).to_string()),
                    start_ms: start.value(i),
                    end_ms: end.value(i),
                    host: host.value(i).into(),
                    pid: pid.as_ref().map(|p| p.value(i) as u32).unwrap_or(0),
                    log: log.value(i).into(),
                    job: job
                        .as_ref()
                        .filter(|j| !j.is_null(i))
                        .map(|j| j.value(i).to_string()),
                });
            }
        }
    }
    out.sort_by_key(|r| (r.start_ms, r.end_ms));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let rec = RunRecord {
            run_id: "r1".into(),
            recipe: "demo".into(),
            stage: "fetch.x".into(),
            kind: "fetch".into(),
            identity: "abc".into(),
            status: Status::Failed,
            error: Some("boom".into()),
            start_ms: 1000,
            end_ms: 3500,
            host: "h".into(),
            pid: 42,
            log: "/tmp/l".into(),
            job: None,
        };
        append(dir.path(), &rec).unwrap();
        append(
            dir.path(),
            &RunRecord {
                status: Status::Ok,
                error: None,
                start_ms: 4000,
                job: Some("slurm 7 COMPLETED".into()),
                ..rec.clone()
            },
        )
        .unwrap();
        let all = read_all(dir.path()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].error.as_deref(), Some("boom"));
        assert_eq!(all[1].status, Status::Ok);
        assert_eq!(all[1].error, None);
        assert_eq!(all[0].pid, 42);
        assert_eq!(
            (all[0].job.as_deref(), all[1].job.as_deref()),
            (None, Some("slurm 7 COMPLETED"))
        );
    }
}
