//! The train job's JSON Schema, derived from the Rust types ([`TrainJob`] and what it holds).
//! The Python worker's job types (`workers/torch/zflow_torch/job.py`) are checked against the
//! committed copy, [`SCHEMA_PATH`], by `workers/torch/tests/test_job.py`; the test below keeps
//! that copy equal to what the types say, so a field added here fails one side or the other
//! until both agree.

use crate::contract::job::TrainJob;

/// The committed schema, relative to the repository root.
pub const SCHEMA_PATH: &str = "workers/torch/zflow_torch/job.schema.json";

/// The train job's JSON Schema (draft 2020-12), as pretty JSON with a final newline.
pub fn job_schema() -> String {
    let schema = schemars::schema_for!(TrainJob);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema is JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed schema is the one the types give. `ZFLOW_BLESS=1` rewrites it.
    #[test]
    fn the_committed_schema_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(SCHEMA_PATH);
        let want = job_schema();
        if std::env::var_os("ZFLOW_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{SCHEMA_PATH} is not the schema of the train job's types: rewrite it with \
             `ZFLOW_BLESS=1 cargo test -p zflow-runtime the_committed_schema_is_current`, then \
             update workers/torch/zflow_torch/job.py to match"
        );
    }
}
