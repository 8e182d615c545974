//! `zflow query STORE "SQL"`: SQL (DataFusion) over the store's Parquet tables.
//!
//! Tables: `runs` (every stage attempt, see [`zflow_pipeline::records`]) and `stages` (every completed
//! output in the store: stage, identity, content hash, files, bytes, timings), plus one table
//! per Parquet file that completed stages wrote at the top of their output folder, named
//! `"<stage>/<file stem>"` (e.g. `"ingest.web/stats"`), newest identity of each stage.
//!
//! Queries are read-only: DDL (`CREATE ...`), DML (`INSERT`, `COPY ... TO`) and statements
//! (`SET`, ...) are refused before anything runs, so a query never writes a file or changes
//! what the store's tables hold.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::{ParquetReadOptions, SessionContext};

use zflow_pipeline::store::{MANIFEST, Manifest};

/// Runs `sql` against the store at `store` and returns the result as a text table.
pub async fn query(store: &Path, sql: &str) -> Result<String> {
    let ctx = SessionContext::new();
    let records = store.join(".zflow/records");
    let has_records = std::fs::read_dir(&records)
        .map(|d| {
            d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        })
        .unwrap_or(false);
    if has_records {
        ctx.register_parquet(
            "runs",
            records.to_string_lossy().as_ref(),
            ParquetReadOptions::default(),
        )
        .await
        .context("reading run records")?;
    } else {
        let empty = RecordBatch::new_empty(zflow_pipeline::records::schema());
        ctx.register_table(
            "runs",
            Arc::new(MemTable::try_new(
                zflow_pipeline::records::schema(),
                vec![vec![empty]],
            )?),
        )?;
    }
    let (stages, outputs) = read_manifests(store)?;
    ctx.register_table("stages", Arc::new(stages))?;
    for (table, path) in outputs {
        ctx.register_parquet(
            format!("\"{table}\""),
            path.to_string_lossy().as_ref(),
            ParquetReadOptions::default(),
        )
        .await
        .with_context(|| format!("reading {}", path.display()))?;
    }
    let read_only = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let df = ctx
        .sql_with_options(sql, read_only)
        .await
        .with_context(|| {
            format!("in query `{sql}` (queries are read-only: SELECT, WITH, EXPLAIN)")
        })?;
    let batches = df.collect().await?;
    Ok(arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
}

type OutputTables = Vec<(String, std::path::PathBuf)>;

fn read_manifests(store: &Path) -> Result<(MemTable, OutputTables)> {
    let mut manifests: Vec<Manifest> = Vec::new();
    for entry in
        std::fs::read_dir(store).with_context(|| format!("reading store {}", store.display()))?
    {
        let path = entry?.path();
        if let Ok(bytes) = std::fs::read(path.join(MANIFEST))
            && let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
        {
            manifests.push(m);
        }
    }
    manifests.sort_by_key(|m| (m.stage.clone(), m.finished_ms));
    let mut outputs: std::collections::BTreeMap<String, std::path::PathBuf> = Default::default();
    for m in &manifests {
        let dir = store.join(format!(
            "{}-{}",
            m.stage,
            zflow_pipeline::identity::short(&m.identity)
        ));
        for f in &m.files {
            if !f.path.contains('/') && f.path.ends_with(".parquet") {
                let stem = f.path.trim_end_matches(".parquet");
                // Later (newer) manifests overwrite earlier ones.
                outputs.insert(format!("{}/{stem}", m.stage), dir.join(&f.path));
            }
        }
    }
    let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("stage", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("identity", DataType::Utf8, false),
        Field::new("content_hash", DataType::Utf8, false),
        Field::new("files", DataType::Int64, false),
        Field::new("bytes", DataType::Int64, false),
        Field::new("started", ts.clone(), false),
        Field::new("finished", ts, false),
    ]));
    let col_s = |f: &dyn Fn(&Manifest) -> String| {
        Arc::new(StringArray::from_iter_values(manifests.iter().map(f))) as ArrayRef
    };
    let col_i = |f: &dyn Fn(&Manifest) -> i64| {
        Arc::new(Int64Array::from_iter_values(manifests.iter().map(f))) as ArrayRef
    };
    let col_t = |f: &dyn Fn(&Manifest) -> i64| {
        Arc::new(
            TimestampMillisecondArray::from_iter_values(manifests.iter().map(f))
                .with_timezone("UTC"),
        ) as ArrayRef
    };
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            col_s(&|m| m.stage.clone()),
            col_s(&|m| m.identity_doc.kind.clone()),
            col_s(&|m| m.identity.clone()),
            col_s(&|m| m.content_hash.clone()),
            col_i(&|m| m.files.len() as i64),
            col_i(&|m| m.files.iter().map(|f| f.size as i64).sum()),
            col_t(&|m| m.started_ms),
            col_t(&|m| m.finished_ms),
        ],
    )?;
    Ok((
        MemTable::try_new(schema, vec![vec![batch]])?,
        outputs.into_iter().collect(),
    ))
}
