//! `zflow plan RECIPE --launch STAGE`: what starting one stage would do, without doing it.
//! Under the Slurm executor, the batch script `sbatch` would get (its options: nodes, tasks
//! and GPUs per node, CPUs per task); then, for a stage with ranks, the exact command of every
//! rank with its environment ([`crate::Stage::launch_lines`]). A user checks a 1024-GPU
//! submission here before spending a queue slot on it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::plan::{Engine, StageState};
use crate::recipe::ExecutorConfig;
use crate::stage::LaunchSite;

/// The launch of the stage at graph index `i`, given the plan `states`, as text.
pub fn render(engine: &Engine, states: &[StageState], i: usize) -> Result<String> {
    let node = &engine.graph.nodes()[i];
    let name = &node.name;
    let r = &node.resources;
    let identity = match &states[i] {
        StageState::Cached { manifest } => Some((
            manifest.identity.clone(),
            "complete in the store: it would not run",
        )),
        StageState::WillRun { identity, .. } => Some((identity.clone(), "it would run")),
        StageState::Waits { .. } | StageState::Broken { .. } => None,
    };
    let (out_dir, log) = match &identity {
        Some((id, _)) => (
            engine.store.partial_dir(name, id),
            engine.store.log_path(name, id),
        ),
        // Its inputs are not built yet, so its identity is not known.
        None => (
            engine
                .store
                .root()
                .join(format!("{name}-<identity>.partial")),
            engine
                .store
                .root()
                .join(format!(".zflow/logs/{name}-<identity>.log")),
        ),
    };
    let mut text = format!(
        "# stage `{name}` ({}): {} rank(s) on {} node(s), {} CPU(s), {} GPU(s)\n",
        identity
            .as_ref()
            .map_or("its inputs are built first", |(_, s)| s),
        r.ranks.max(1),
        r.nodes.max(1),
        r.cpus.max(1),
        r.gpus,
    );
    let slurm_nodes = match &engine.recipe.executor {
        ExecutorConfig::Local => {
            text.push_str("# executor: local (`zflow run` starts it on this machine)\n");
            None
        }
        ExecutorConfig::Slurm(cfg) => {
            let with = |ext: &str| PathBuf::from(format!("{}.{ext}", log.display()));
            let output = PathBuf::from(format!("{}.slurm-%j.out", log.display()));
            let options = crate::slurm::sbatch_options(cfg, name, r, &output, &engine.cwd);
            let exe = std::env::current_exe().context("locating the zflow binary")?;
            text.push_str(&format!(
                "# executor: slurm; `sbatch {}` gets:\n",
                with("sbatch").display()
            ));
            text.push_str(&crate::slurm::script(
                cfg,
                &options,
                &exe,
                &[(with("spec.json"), with("exit-"))],
            ));
            Some(r.nodes.max(1) as usize)
        }
    };
    let site = LaunchSite {
        stage: name.clone(),
        threads: r.cpus.max(1) as usize,
        slurm_nodes,
        out_dir: out_dir.clone(),
    };
    let lines = node.stage.launch_lines(&site)?;
    if lines.is_empty() {
        text.push_str(&format!(
            "# `zflow exec-stage` runs the stage in one process (in {})\n",
            display(&out_dir)
        ));
    } else {
        text.push_str(&format!(
            "# the stage starts its ranks{}:\n",
            if slurm_nodes.is_some() {
                ", each as a job step inside that job"
            } else {
                ""
            }
        ));
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    }
    Ok(text)
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
