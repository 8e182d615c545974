//! `shell`: runs a bash script. Inputs are `$ZFLOW_IN_<NAME>`, the output folder `$ZFLOW_OUT`.
//!
//! ```yaml
//! - name: count
//!   kind: shell
//!   needs: [corpus]
//!   env: {MODE: fast}
//!   run: wc -c "$ZFLOW_IN_CORPUS"/* > "$ZFLOW_OUT/count.txt"
//! ```
//! The script runs with `bash -e -o pipefail`, so a failing command fails the stage.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

/// The `shell` stage kind.
pub struct Shell;

/// `shell` settings.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellConfig {
    /// The bash script.
    pub run: String,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl Stage for Shell {
    type Config = ShellConfig;
    const KIND: &'static str = "shell";
    const VERSION: u32 = 1;

    fn validate(&self, config: &ShellConfig, _needs: &[String]) -> Result<(), ConfigError> {
        if config.run.trim().is_empty() {
            return Err(ConfigError::new(
                "run",
                "`run` is empty; expected a bash script",
            ));
        }
        for key in config.env.keys() {
            let ok = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(ConfigError::new(
                    format!("env.{key}"),
                    format!("`{key}` is not a valid environment variable name"),
                ));
            }
            if key.starts_with("ZFLOW_") {
                return Err(ConfigError::new(
                    format!("env.{key}"),
                    "`ZFLOW_*` variables are set by zflow",
                ));
            }
        }
        Ok(())
    }

    fn run(&self, config: &ShellConfig, ctx: &StageContext) -> Result<()> {
        let mut cmd = Command::new("bash");
        cmd.arg("-e")
            .arg("-o")
            .arg("pipefail")
            .arg("-c")
            .arg(&config.run)
            .envs(&config.env);
        let status = ctx.run_command(cmd)?;
        if !status.success() {
            let how = match (
                status.code(),
                std::os::unix::process::ExitStatusExt::signal(&status),
            ) {
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "failed".to_string(),
            };
            let tail = crate::util::log_tail(ctx.log().path(), 8);
            bail!("the script {how}; last lines of its log:\n{tail}");
        }
        Ok(())
    }
}
