//! The Slurm executor against real Slurm daemons (`scripts/slurm-local.sh start`: munged,
//! slurmctld and slurmd on this machine). A tiny ZAYA1 phase on 2 ranks runs as a batch job
//! whose ranks are `srun` steps; it ends byte-identical to the same recipe run locally, also
//! after the job is `scancel`led mid-phase and resumed, and after Slurm requeues it mid-phase;
//! the per-source data stages that become ready together go out as one job array. The ranks
//! are the torch engine's.
//!
//! They run where `scripts/test.sh` set them up (it starts the daemons and sets `SLURM_CONF`)
//! and always under CI; elsewhere they are ignored (see `build.rs`). A Slurm that does not
//! answer fails them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Sandbox, start_requeued_jobs_now, tiny_train_recipe_on};

/// The local Slurm's config; panics when its controller does not answer.
fn slurm_conf() -> PathBuf {
    let conf = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/slurm-local/slurm.conf")
        });
    let up = conf.exists()
        && Command::new("squeue")
            .arg("-h")
            .env("SLURM_CONF", &conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    assert!(
        up,
        "no Slurm controller answers (config {}): scripts/slurm-local.sh start",
        conf.display()
    );
    conf
}

/// The tiny training recipe on the Slurm executor.
fn slurm_recipe(ranks: usize) -> String {
    tiny_train_recipe_on("torch", ranks, 3).replace(
        "name: faults-test",
        "name: faults-test\nexecutor: {kind: slurm, poll_s: 0.3}",
    )
}

fn final_weights(sb: &Sandbox) -> Vec<u8> {
    std::fs::read(sb.output("train.p1").join("final/model.safetensors")).unwrap()
}

/// `zflow run r.yaml` with the Slurm client pointed at `conf`.
fn run(sb: &Sandbox, conf: &Path) -> std::process::Output {
    sb.cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", conf)
        .output()
        .unwrap()
}

/// The lines of slurmctld's and slurmd's logs (as `conf` names them) that mention job `id`:
/// why a job failed before its script ran is only there.
fn daemon_lines_about(conf: &Path, id: &str) -> String {
    let conf_text = std::fs::read_to_string(conf).unwrap_or_default();
    // After the `[time]`: `JobId=29`, `job 29`, `[29.batch]`, `StepId=29.0`, the id as a whole
    // number.
    let mentions = |line: &str| {
        let text = line.split_once("] ").map_or(line, |(_time, text)| text);
        text.to_lowercase().contains("job")
            && text
                .split(|c: char| !c.is_ascii_digit() && c != '_')
                .any(|word| word == id)
    };
    conf_text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SlurmctldLogFile=")
                .or_else(|| l.strip_prefix("SlurmdLogFile="))
        })
        .flat_map(|log| {
            std::fs::read_to_string(log.trim())
                .unwrap_or_default()
                .lines()
                .filter(|l| mentions(l))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the train stage's job has committed a checkpoint at `step` or later; returns
/// the job id.
fn job_past_checkpoint(sb: &Sandbox, step: u32) -> String {
    let store = sb.path().join("zflow-store");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(
            Instant::now() < deadline,
            "no checkpoint at step {step} within 240 s"
        );
        let partial = std::fs::read_dir(&store)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".partial"));
        let ckpt = partial
            .map(|p| p.join(format!("checkpoints/step-{step:08}")))
            .is_some_and(|c| c.exists());
        let job = std::fs::read_dir(store.join(".zflow/logs"))
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                e.file_name().to_string_lossy().starts_with("train.p1-")
                    && e.file_name().to_string_lossy().ends_with(".log.job")
            })
            .and_then(|e| std::fs::read_to_string(e.path()).ok());
        if let (true, Some(job)) = (ckpt, job) {
            return job.split_whitespace().nth(1).unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[cfg_attr(
    not(all(zflow_slurm, zflow_torch)),
    ignore = "needs the local Slurm and the torch engine's Python: scripts/test.sh sets them up"
)]
fn a_recipe_runs_on_slurm_and_scancel_then_rerun_resumes_to_the_same_weights() {
    let conf = slurm_conf();
    let reference = Sandbox::new();
    reference.write("r.yaml", &tiny_train_recipe_on("torch", 2, 3));
    reference.ok(&["run", "r.yaml"]);

    let sb = Sandbox::new();
    sb.write("r.yaml", &slurm_recipe(2));
    let zflow = sb
        .cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", &conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job = job_past_checkpoint(&sb, 10);
    let cancel = Command::new("scancel")
        .arg(&job)
        .env("SLURM_CONF", &conf)
        .status()
        .unwrap();
    assert!(cancel.success());
    let out = zflow.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("slurm job {job} ended CANCELLED"))
            && stderr.contains("sbatch script:")
            && stderr.contains("job output:"),
        "{stderr}"
    );
    // The two sources' fetch stages became ready together: one job array, a task each.
    let array_task = stderr
        .lines()
        .find(|l| l.contains("[fetch.") && l.contains("submitted slurm job") && l.contains("_1 ("));
    assert!(
        array_task.is_some(),
        "fetch.prose and fetch.code were not one job array:\n{stderr}"
    );
    let logs = sb.path().join("zflow-store/.zflow/logs");
    let array_outputs = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("fetch-array.slurm-")
        })
        .count();
    assert_eq!(
        array_outputs,
        2,
        "one output file per array task in {}",
        logs.display()
    );

    // The rerun submits the train stage again; it resumes from its newest checkpoint. The 12
    // others (each source's fetch, ingest, dedup_keys and dedup, the tokenizer, tokenize, mix)
    // are cached.
    let out = run(&sb, &conf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("1 ran, 12 cached"), "{stderr}");
    let log = sb.ok(&["logs", "r.yaml", "train.p1"]).stdout;
    assert!(log.contains("resum"), "the rerun did not resume:\n{log}");
    assert!(
        final_weights(&sb) == final_weights(&reference),
        "scancel + rerun on Slurm differs from the local run"
    );
    let status = sb.ok(&["status", "r.yaml"]).stdout;
    assert!(
        status.contains("job: slurm") && status.contains("COMPLETED"),
        "{status}"
    );
    let runs = sb
        .ok(&[
            "query",
            "zflow-store",
            "select count(*) as n from runs where job like 'slurm % CANCELLED%'",
        ])
        .stdout;
    assert!(runs.contains("| 1 "), "{runs}");
}

#[test]
#[cfg_attr(
    not(all(zflow_slurm, zflow_torch)),
    ignore = "needs the local Slurm and the torch engine's Python: scripts/test.sh sets them up"
)]
fn a_job_requeued_mid_phase_resumes_within_the_same_run() {
    let conf = slurm_conf();
    let reference = Sandbox::new();
    reference.write("r.yaml", &tiny_train_recipe_on("torch", 1, 3));
    reference.ok(&["run", "r.yaml"]);

    let sb = Sandbox::new();
    sb.write("r.yaml", &slurm_recipe(1));
    let zflow = sb
        .cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", &conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job = job_past_checkpoint(&sb, 10);
    // What a node failure or preemption does to a `--requeue` job.
    let requeue = Command::new("scontrol")
        .args(["requeue", &job])
        .env("SLURM_CONF", &conf)
        .status()
        .unwrap();
    assert!(requeue.success());
    start_requeued_jobs_now(&conf, zflow.id());
    let out = zflow.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stderr}\nwhat the Slurm daemons logged about job {job}:\n{}",
        daemon_lines_about(&conf, &job)
    );
    assert!(
        stderr.contains(&format!("slurm requeued job {job}")),
        "{stderr}"
    );
    let log = sb.ok(&["logs", "r.yaml", "train.p1"]).stdout;
    assert!(
        log.contains("(restart 1): running train.p1") && log.contains("resum"),
        "{log}"
    );
    assert!(
        final_weights(&sb) == final_weights(&reference),
        "the requeued run differs from the local run"
    );
}

#[test]
#[cfg_attr(
    not(zflow_slurm),
    ignore = "needs the local Slurm: scripts/test.sh starts it and sets SLURM_CONF"
)]
fn slurm_reuses_a_local_run_and_reports_failed_jobs() {
    let conf = slurm_conf();
    let sb = Sandbox::new();
    let stages = "stages:\n  - {name: hello, kind: shell, run: 'echo hi > $ZFLOW_OUT/hi.txt'}\n  - {name: preflight, kind: preflight, ranks: 2, on_outlier: report}\n";
    sb.write("r.yaml", &format!("name: s\n{stages}"));
    sb.ok(&["run", "r.yaml"]);
    // Same stages on Slurm: everything is cached, nothing is submitted.
    sb.write(
        "r.yaml",
        &format!("name: s\nexecutor: {{kind: slurm}}\n{stages}"),
    );
    let out = run(&sb, &conf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("0 ran, 2 cached") && !stderr.contains("submitted"),
        "{stderr}"
    );

    // A stage that fails in its job: job id, state, exit code and the log paths.
    sb.write("r.yaml", "name: s\nexecutor: {kind: slurm, poll_s: 0.3}\nstages:\n  - {name: boom, kind: shell, run: 'echo going down; exit 3'}\n");
    let out = run(&sb, &conf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ended FAILED with exit code 1:0, stage exit status 1")
            && stderr.contains(".log.sbatch")
            && stderr.contains("stage log:")
            && stderr.contains("the job output's last")
            && stderr.contains("going down"),
        "{stderr}"
    );
    let out_file = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("job output:"))
        .unwrap()
        .trim()
        .to_string();
    assert!(
        std::fs::read_to_string(&out_file)
            .unwrap()
            .contains("going down"),
        "{out_file}"
    );

    // A SLURM_CONF that names no file: said at once, naming it.
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", sb.path().join("missing.conf"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("missing.conf names no file"),
        "{stderr}"
    );
    // No controller answering where the configuration says: named, with what was tried.
    let text = std::fs::read_to_string(&conf).unwrap();
    let dead: String = text
        .lines()
        .map(|l| match l.strip_prefix("SlurmctldPort=") {
            Some(_) => "SlurmctldPort=1".to_string(),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    sb.write("dead.conf", &dead);
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", sb.path().join("dead.conf"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not reachable") && stderr.contains("squeue"),
        "{stderr}"
    );
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not on PATH"),
        "{stderr}"
    );
}
