//! Fault tolerance through the real binary: data-parallel torch workers (PyTorch over gloo),
//! injected crashes, hangs, deaths mid-checkpoint, corrupted checkpoints and SIGKILLs of
//! `zflow run` itself, each run ending with final weights bit-identical to the uninterrupted
//! run; and reshaping a 2-rank checkpoint for 1 and 4 ranks.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Sandbox, free_port, stage_dir};

/// One short phase of a tiny ZAYA1 (see [`common::tiny_train_recipe`]) on the torch engine.
fn recipe(ranks: usize, max_restarts: u32) -> String {
    common::tiny_train_recipe_on("torch", ranks, max_restarts)
}

/// [`recipe`] on training engine `engine`.
fn recipe_on(engine: &str, ranks: usize, max_restarts: u32) -> String {
    common::tiny_train_recipe_on(engine, ranks, max_restarts)
}

/// `recipe` with Muon's Newton-Schulz iterations in f32 (`train.muon.ns_dtype`), for tests
/// that compare runs on different numbers of ranks: their gradient sums round differently,
/// which bf16 iterations turn into updates that part after a few steps, and f32 ones do not.
fn exact_across_world_sizes(recipe: String) -> String {
    with_train_setting(&recipe, "muon: {ns_dtype: f32}")
}

/// `recipe` with `setting` (one `key: value` line) first in its `train:` section.
fn with_train_setting(recipe: &str, setting: &str) -> String {
    assert!(recipe.contains("\ntrain:\n"), "{recipe}");
    recipe.replace("\ntrain:\n", &format!("\ntrain:\n  {setting}\n"))
}

fn final_weights(sb: &Sandbox) -> Vec<u8> {
    std::fs::read(sb.output("train.p1").join("final/model.safetensors")).unwrap()
}

/// The train stage's log.
fn log(sb: &Sandbox) -> String {
    sb.ok(&["logs", "r.yaml", "train.p1"]).stdout
}

/// Runs the recipe with `faults` injected; returns (stderr, log).
fn run_with(sb: &Sandbox, faults: &str) -> (String, String) {
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("ZFLOW_FAULTS", faults)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "faults {faults}:\n{stderr}\n{}",
        log(sb)
    );
    (stderr, log(sb))
}

/// A fixed-seed generator, so the "random" fault matrix is the same on every run.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (self.0 >> 33) % (hi - lo + 1)
    }
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn fault_matrix_on_the_torch_engine_ends_bit_identical_to_the_uninterrupted_run() {
    // On 2 ranks only: each of the matrix's runs starts ~10 Python processes, ~4 s each of
    // importing torch and transformers; the 1-rank runs of the other tests here (the spike, the
    // token-id check, the reshape to 1) cover one rank.
    let injected = fault_matrix(&mut Dice(2026), "torch", &[2]);
    eprintln!("torch engine: {injected} faults injected, every run bit-identical to its reference");
    assert!(injected >= 10, "{injected}");
}

/// On each of `world_sizes`: an uninterrupted run, then two runs of drawn faults (one per
/// attempt) that must end with its final weights, bit for bit. Returns the number of faults
/// injected.
fn fault_matrix(dice: &mut Dice, engine: &str, world_sizes: &[usize]) -> usize {
    let mut injected = 0;
    for &ranks in world_sizes {
        let reference = Sandbox::new();
        reference.write("r.yaml", &recipe_on(engine, ranks, 6));
        reference.ok(&["run", "r.yaml"]);
        let want = final_weights(&reference);

        // One run per line: each attempt gets one fault (a fault fires in its attempt only), so a
        // run survives several in a row. Steps and ranks are drawn; checkpoints are every 5 steps.
        let rank = |dice: &mut Dice| dice.roll(0, ranks as u64 - 1);
        let a = dice.roll(2, 9);
        let b = dice.roll(a + 1, a + 8);
        let c = 5 * dice.roll((b + 5) / 5 + 1, (b + 5) / 5 + 2);
        let d = dice.roll(c + 1, c + 4);
        let e = dice.roll(d + 1, d + 6);
        let scenarios = [
            // crash, hang, a death halfway through a checkpoint write, then a corrupted checkpoint
            // followed by a crash (the corrupted one must be quarantined, the one before used).
            format!(
                "crash@{a}:rank={};hang@{b}:rank={}:attempt=2;kill-in-checkpoint@{}:rank={}:attempt=3;corrupt-checkpoint@{c}:attempt=4;crash@{d}:rank={}:attempt=4;hang@{e}:rank={}:attempt=5",
                rank(dice),
                rank(dice),
                c - 5,
                rank(dice),
                rank(dice),
                rank(dice)
            ),
            // a slow rank (training goes on, slower) plus crashes on every rank in turn.
            format!(
                "slow@1:ms=20:rank={};crash@{}:rank=0:attempt=1;crash@{}:rank={}:attempt=2;kill-in-checkpoint@{}:rank=0:attempt=3",
                rank(dice),
                dice.roll(3, 20),
                dice.roll(21, 35),
                ranks - 1,
                5 * dice.roll(8, 10)
            ),
        ];
        for faults in &scenarios {
            let sb = Sandbox::new();
            sb.write("r.yaml", &recipe_on(engine, ranks, 6));
            let (stderr, log) = run_with(&sb, faults);
            let count = faults.split(';').count();
            injected += count;
            eprintln!("{engine}: {ranks} rank(s), {count} faults: {faults}");
            let relaunches = stderr.matches("relaunching").count();
            let expected = faults
                .split(';')
                .filter(|f| !f.starts_with("slow") && !f.starts_with("corrupt"))
                .count();
            assert_eq!(relaunches, expected, "{faults}: {stderr}");
            assert!(
                final_weights(&sb) == want,
                "{ranks} rank(s), faults {faults}: final weights differ from the uninterrupted run"
            );
            if faults.contains("corrupt-checkpoint") {
                assert!(
                    log.contains("quarantined checkpoint")
                        && log.contains(&format!("resuming at step {}", c - 5)),
                    "{log}"
                );
                assert!(
                    sb.output("train.p1").join("quarantine").exists()
                        || !log.contains(&format!("resuming at step {c}")),
                    "{log}"
                );
            }
            // The run records every interruption with its cause and downtime.
            let events = sb
                .ok(&[
                    "query",
                    "zflow-store",
                    "select kind, step, cause, downtime_s from \"train.p1/events\"",
                ])
                .stdout;
            assert_eq!(events.matches("failure").count(), expected, "{events}");
            assert!(
                events.contains("SIGABRT") && (!faults.contains("hang") || events.contains("hung")),
                "{events}"
            );
        }
    }

    injected
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn two_ranks_of_the_torch_engine_reshaped_to_one_and_four_continue_the_same_run() {
    reshapes("torch");
}

/// A 2-rank run of `engine` stopped at step 10, reshaped for 1 and 4 ranks, continues the
/// uninterrupted 2-rank run's losses and weights to float rounding.
fn reshapes(engine: &str) {
    // Two ranks train to step 10 and stop (out of restarts after a crash at step 12).
    let sb = Sandbox::new();
    sb.write("r.yaml", &exact_across_world_sizes(recipe_on(engine, 2, 0)));
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("ZFLOW_FAULTS", "crash@12")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let partial = std::fs::read_dir(sb.path().join("zflow-store"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.to_string_lossy().contains("train.p1-") && p.to_string_lossy().ends_with(".partial")
        })
        .unwrap();
    let step10 = partial.join("checkpoints/step-00000010");
    let shown = sb.ok(&["ckpt", "inspect", step10.to_str().unwrap()]).stdout;
    assert!(
        shown.contains("2 data-parallel rank(s)") && shown.contains("optim-muon.rank-1.bin"),
        "{shown}"
    );
    ckpt_commands_never_replace_what_exists(&sb, &step10);
    inspect_gives_its_verdict_in_the_exit_code(&sb, &step10);
    a_reshape_to_more_shards_than_descriptors_writes_them_all(&sb, &step10);

    // The uninterrupted 2-rank run, for comparison.
    let reference = Sandbox::new();
    reference.write("r.yaml", &exact_across_world_sizes(recipe_on(engine, 2, 0)));
    reference.ok(&["run", "r.yaml"]);
    let reference_losses = losses(
        &std::fs::read_to_string(reference.output("train.p1").join("metrics.jsonl")).unwrap(),
    );
    let reference_state = trainer_state(&reference.output("train.p1").join("final"));

    let job: serde_json::Value =
        serde_json::from_slice(&std::fs::read(partial.join("job.json")).unwrap()).unwrap();
    for ranks in [1usize, 4] {
        let dir = sb.path().join(format!("dp{ranks}"));
        let reshaped = dir.join("checkpoints/step-00000010");
        let said = sb
            .ok(&[
                "ckpt",
                "reshape",
                step10.to_str().unwrap(),
                reshaped.to_str().unwrap(),
                "--dp",
                &ranks.to_string(),
            ])
            .stdout;
        assert!(
            said.contains(&format!("{ranks} data-parallel rank(s)")),
            "{said}"
        );
        let shown = sb
            .ok(&["ckpt", "inspect", reshaped.to_str().unwrap()])
            .stdout;
        assert!(
            shown.contains("manifest verified")
                && shown.contains(&format!("optim-adamw.rank-{}.bin", ranks - 1)),
            "{shown}"
        );
        // Weights, trainer state and cursor are the input's, byte for byte.
        for f in ["model.safetensors", "trainer.json"] {
            assert_eq!(
                std::fs::read(step10.join(f)).unwrap(),
                std::fs::read(reshaped.join(f)).unwrap(),
                "{f}"
            );
        }

        let job_path = write_job(&job, &dir);
        let stdout = run_workers_of(engine, &job_path, ranks);
        let resumed = losses(&stdout);
        assert_eq!(
            resumed.first().map(|l| l.0),
            Some(11),
            "{ranks} rank(s) resume after step 10: {stdout}"
        );
        // Same data in the same order: the loss continues the 2-rank run's curve (equal up to the
        // float rounding of summing gradients over a different number of ranks).
        for (step, loss) in &resumed {
            let (_, want) = reference_losses.iter().find(|(s, _)| s == step).unwrap();
            assert!(
                (loss - want).abs() < 1e-3 * want.abs(),
                "{ranks} rank(s), step {step}: loss {loss} vs {want} on 2 ranks"
            );
        }
        let state = trainer_state(
            &dir.join("checkpoints").join(
                std::fs::read_dir(dir.join("checkpoints"))
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("step-"))
                    .max()
                    .unwrap(),
            ),
        );
        assert_eq!(
            state["cursor"], reference_state["cursor"],
            "{ranks} rank(s) end at another data position"
        );
        assert_eq!(state["step"], reference_state["step"]);
        // And the weights: equal to the 2-rank run's up to the rounding of gradient sums over
        // another number of ranks. Tolerance: 1e-3 of each tensor's largest magnitude.
        let last = common::entries_starting_with(&dir.join("checkpoints"), "step-")
            .into_iter()
            .max()
            .unwrap();
        let (got, want) = (
            tensors(&last.join("model.safetensors")),
            tensors(&reference.output("train.p1").join("final/model.safetensors")),
        );
        let mut worst = (0.0f64, String::new());
        for (name, w) in &want {
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-12) as f64;
            let diff = got[name]
                .iter()
                .zip(w)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) as f64
                / scale;
            if diff > worst.0 {
                worst = (diff, name.clone());
            }
        }
        eprintln!(
            "{engine}: {ranks} rank(s) from the reshaped step-10 checkpoint vs 2 ranks throughout: worst relative weight difference {:.2e} ({})",
            worst.0, worst.1
        );
        assert!(
            worst.0 < 1e-3,
            "{ranks} rank(s): {} differs by {:.2e}",
            worst.1,
            worst.0
        );
    }

    // Without a reshape the trainer redistributes in memory (and says so).
    let dir = sb.path().join("dp4-direct");
    copy_dir(&step10, &dir.join("checkpoints/step-00000010"));
    let job_path = write_job(&job, &dir);
    let stdout = run_workers_of(engine, &job_path, 4);
    assert_eq!(losses(&stdout).first().map(|l| l.0), Some(11));
}

/// The train job a finished run of `train.p1` wrote.
/// `zflow ckpt reshape` (and export and import) refuse an OUT that exists and is not an empty
/// folder, before reading anything, and never remove a folder of the user's; `--dp` out of
/// range is an error, not an allocation abort.
/// `ckpt reshape --dp 131072`, the largest degree allowed, ran out of file descriptors: it held
/// every shard file open until the last was flushed. Here 2 x 2,048 shards are written under a
/// limit of 256 descriptors.
fn a_reshape_to_more_shards_than_descriptors_writes_them_all(sb: &Sandbox, checkpoint: &Path) {
    use std::os::unix::process::CommandExt;
    let out = sb.path().join("dp2048");
    let mut reshape = sb.cmd(&[
        "ckpt",
        "reshape",
        checkpoint.to_str().unwrap(),
        out.to_str().unwrap(),
        "--dp",
        "2048",
    ]);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        reshape.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let done = reshape.output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let shown = sb.ok(&["ckpt", "inspect", out.to_str().unwrap()]).stdout;
    assert!(
        shown.contains("manifest verified") && shown.contains("optim-adamw.rank-2047.bin"),
        "{shown}"
    );
    std::fs::remove_dir_all(out).unwrap();
}

fn ckpt_commands_never_replace_what_exists(sb: &Sandbox, checkpoint: &Path) {
    let ckpt = checkpoint.to_str().unwrap();
    let mine = sb.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "mine").unwrap();
    let file = sb.write("a-file", "mine too");
    let parent = checkpoint.parent().unwrap();
    for (args, taken) in [
        (vec!["reshape", ckpt, "mine", "--dp", "1"], &mine),
        (vec!["reshape", ckpt, "a-file", "--dp", "1"], &file),
        (
            vec!["reshape", ckpt, parent.to_str().unwrap(), "--dp", "1"],
            &parent.to_path_buf(),
        ),
        (vec!["export", ckpt, "mine"], &mine),
        (vec!["import", "no-such-hf-folder", "mine"], &mine),
    ] {
        let mut all = vec!["ckpt"];
        all.extend(args.iter().copied());
        let out = sb.zflow(&all);
        assert_eq!(out.code, 1, "{all:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("already exists"),
            "{all:?}: {}",
            out.stderr
        );
        assert!(taken.exists(), "{all:?} removed {}", taken.display());
    }
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine too");
    assert!(checkpoint.join("manifest.json").exists());
    // A folder of the user's named like the temporary beside OUT is left alone; an empty OUT
    // is filled.
    let theirs = sb.path().join(".tmp-fresh");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("keep"), "theirs").unwrap();
    std::fs::create_dir(sb.path().join("fresh")).unwrap();
    sb.ok(&["ckpt", "reshape", ckpt, "fresh", "--dp", "1"]);
    assert_eq!(
        std::fs::read_to_string(theirs.join("keep")).unwrap(),
        "theirs"
    );
    sb.ok(&["ckpt", "inspect", "fresh"]);
    // `--dp` far beyond any cluster: a range error (as --dp 0 is), not an abort.
    for dp in ["100000000", "0"] {
        let out = sb.zflow(&["ckpt", "reshape", ckpt, "huge", "--dp", dp]);
        assert_eq!(out.code, 1, "--dp {dp}: {}", out.stderr);
        assert!(out.stderr.contains("between 1 and"), "{}", out.stderr);
    }
}

/// `zflow ckpt inspect` exits 1 on anything that does not verify, says DOES NOT VERIFY, and
/// still shows what it could read.
fn inspect_gives_its_verdict_in_the_exit_code(sb: &Sandbox, checkpoint: &Path) {
    std::fs::create_dir(sb.path().join("empty")).unwrap();
    sb.write("garbage/manifest.json", "{not json");
    for path in ["no-such-folder", "/etc/passwd", "empty", "garbage"] {
        let out = sb.zflow(&["ckpt", "inspect", path]);
        assert_eq!(out.code, 1, "{path}: {}", out.stdout);
        assert!(
            out.stdout.contains("DOES NOT VERIFY"),
            "{path}: {}",
            out.stdout
        );
    }
    let truncated = sb.path().join("truncated");
    copy_dir(checkpoint, &truncated);
    let weights = truncated.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = sb.zflow(&["ckpt", "inspect", truncated.to_str().unwrap()]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    for want in [
        "DOES NOT VERIFY",
        "step 10/",
        "data-parallel rank(s)",
        "model.safetensors: cannot be read",
    ] {
        assert!(out.stdout.contains(want), "`{want}` in:\n{}", out.stdout);
    }
}

/// The rank that left first is blamed, not the one that noticed in its next collective
/// ("Connection closed by peer"), whether it exited 0 early or was killed; and a worker
/// program that does not exist is named, with the variable that names it.
#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_rank_that_left_first_is_blamed_and_a_missing_worker_program_is_named() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe_on("torch", 2, 0));
    // Each run is the stage's next attempt (they are counted in its folder).
    for (fault, says) in [
        (
            "exit@3:rank=1:attempt=1",
            "exited with status 0 without reporting `done`",
        ),
        ("crash@3:rank=1:attempt=2", "killed by signal 6 (SIGABRT)"),
    ] {
        let out = sb
            .cmd(&["run", "r.yaml"])
            .env("ZFLOW_FAULTS", fault)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fault}: {stderr}");
        assert!(
            stderr.contains(&format!("rank 1 failed after step 3: {says}")),
            "{fault}: {stderr}\n{}",
            log(&sb)
        );
        assert!(!stderr.contains("rank 0 failed"), "{fault}: {stderr}");
    }
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("ZFLOW_TORCH_PYTHON", "/no/such/python3")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("ZFLOW_TORCH_PYTHON=/no/such/python3: no such program"),
        "{stderr}"
    );
}

fn read_job(sb: &Sandbox) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(sb.output("train.p1").join("job.json")).unwrap()).unwrap()
}

/// `job` with its checkpoints in `dir/checkpoints`, written as `dir/job.json`; returns that path.
fn write_job(job: &serde_json::Value, dir: &Path) -> PathBuf {
    let mut job = job.clone();
    job["checkpoints"] = serde_json::json!(dir.join("checkpoints"));
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("job.json");
    std::fs::write(&path, serde_json::to_vec(&job).unwrap()).unwrap();
    path
}

/// Runs `ranks` worker processes of `engine` on `job` (as the train stage would) and returns
/// rank 0's stdout.
fn run_workers_of(engine: &str, job: &Path, ranks: usize) -> String {
    run_workers_with_engine(engine, job, ranks, |_| {}).0
}

/// The `ranks` workers of training engine `engine` on `job`, calling `meddle(rendezvous)` once
/// rank 0 has started and before the other ranks start. Returns rank 0's stdout and stderr.
fn run_workers_with_engine(
    engine: &str,
    job: &Path,
    ranks: usize,
    meddle: impl FnOnce(&str),
) -> (String, String) {
    let rendezvous = format!("127.0.0.1:{}", free_port());
    let secret = "0123456789abcdef".repeat(4);
    let spawn = |rank: usize| {
        let mut c = common::worker(engine, job);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        // Each rank's share of the cores, as the train stage gives it: the float sums (and so
        // the losses) depend on the thread count.
        c.env(
            zflow_pipeline::stage::THREADS,
            zflow_stages::launch::threads_per_rank(None, cores(), ranks).to_string(),
        );
        if ranks > 1 {
            c.env("ZFLOW_RANK", rank.to_string())
                .env("ZFLOW_WORLD", ranks.to_string())
                .env("ZFLOW_RENDEZVOUS", &rendezvous)
                .env("ZFLOW_GROUP_SECRET", &secret);
        }
        c.spawn().unwrap()
    };
    let mut children = vec![spawn(0)];
    meddle(&rendezvous);
    children.extend((1..ranks).map(spawn));
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (rank, o) in outputs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (text(&outputs[0].stdout), text(&outputs[0].stderr))
}

/// This machine's cores (a stage's threads on it).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The `metrics.jsonl` of train.p1's unfinished output, once there is one.
fn partial_metrics(store: &Path) -> Option<PathBuf> {
    std::fs::read_dir(store)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("train.p1-") && n.ends_with(".partial")
        })
        .map(|p| p.join("metrics.jsonl"))
}

/// (step, loss) of the step lines of worker output or `metrics.jsonl`.
fn losses(lines: &str) -> Vec<(u64, f64)> {
    lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["type"] == "step")
        .map(|m| (m["step"].as_u64().unwrap(), m["loss"].as_f64().unwrap()))
        .collect()
}

/// The f32 tensors of a safetensors file, by name (read by hand: header length, JSON, data).
fn tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let (a, b) = (
                v["data_offsets"][0].as_u64().unwrap() as usize,
                v["data_offsets"][1].as_u64().unwrap() as usize,
            );
            (
                k.clone(),
                data[a..b]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        })
        .collect()
}

fn trainer_state(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("trainer.json")).unwrap()).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[allow(dead_code)]
fn store_stage(sb: &Sandbox, stage: &str) -> PathBuf {
    stage_dir(&sb.path().join("zflow-store"), stage)
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn a_loss_spike_on_the_torch_engine_rolls_back_and_skips_the_bad_batch() {
    loss_spike("torch");
}

fn loss_spike(engine: &str) {
    // The batch of step 30 is noise (as a corrupt shard would be): the loss jumps, both ranks
    // go back to the step-25 checkpoint together and skip that batch. The training text is this
    // repository's, which every commit changes, and a noise batch lifts this tiny model's loss
    // by only ~0.8 nats at step 30; so the guard is set to 3 standard deviations (its default,
    // 6, is what the clean run below checks never fires on a falling curve).
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        &recipe_on(engine, 2, 2)
            .replace("  eval_every: 0\n", "  eval_every: 0\n  spike: {z: 3.0}\n"),
    );
    let (stderr, _) = run_with(&sb, "spike@30");
    assert!(
        stderr.contains("loss spike at step 30") && stderr.contains("rolled back to step 25"),
        "{stderr}"
    );
    // The rollback happens inside the launch: no rank is restarted.
    assert!(!stderr.contains("relaunching"), "{stderr}");
    let state = trainer_state(&sb.output("train.p1").join("final"));
    assert_eq!(
        state["skipped_batches"],
        serde_json::json!([29 * 8]),
        "{state}"
    );
    assert_eq!(state["rollbacks"], 1);
    // Metrics hold each step once: the spiked step was dropped and recomputed on the next batch.
    let steps: Vec<u64> =
        losses(&std::fs::read_to_string(sb.output("train.p1").join("metrics.jsonl")).unwrap())
            .iter()
            .map(|l| l.0)
            .collect();
    assert_eq!(steps, (1..=steps.len() as u64).collect::<Vec<_>>());
    let events = sb
        .ok(&[
            "query",
            "zflow-store",
            "select kind, step from \"train.p1/events\"",
        ])
        .stdout;
    assert!(
        events.contains("loss_spike") && events.contains("30"),
        "{events}"
    );
    let status = sb.ok(&["status", "r.yaml"]).stdout;
    assert!(
        status.contains("rollback (attempt 1): loss spike at step 30"),
        "{status}"
    );
    // A clean run never rolls back (the guard does not mistake a falling curve for spikes).
    let clean = Sandbox::new();
    clean.write("r.yaml", &recipe_on(engine, 2, 0));
    clean.ok(&["run", "r.yaml"]);
    assert_eq!(
        trainer_state(&clean.output("train.p1").join("final"))["rollbacks"],
        0
    );
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn preflight_leaves_out_a_slow_rank() {
    // Rank 1's device is slow from the start (its probe takes 300 ms per timing): with
    // `exclude`, the phase runs on the one healthy rank, exactly as a 1-rank run would.
    let with_exclude = |r: String| {
        r.replace(
            "hang_timeout_s: 3}",
            "hang_timeout_s: 3, preflight: {exclude: true}}",
        )
    };
    let sb = Sandbox::new();
    sb.write("r.yaml", &with_exclude(recipe(2, 0)));
    let (stderr, log) = run_with(&sb, "slow@0:ms=300:rank=1");
    assert!(
        stderr.contains("preflight: rank 1") && stderr.contains("relaunching on 1 rank(s)"),
        "{stderr}"
    );
    assert!(log.contains("preflight rank 0: GEMM"), "{log}");
    let reference = Sandbox::new();
    reference.write("r.yaml", &recipe(1, 0));
    reference.ok(&["run", "r.yaml"]);
    assert!(
        final_weights(&sb) == final_weights(&reference),
        "the run without the slow rank differs from a 1-rank run"
    );
    let status = sb.ok(&["status", "r.yaml"]).stdout;
    assert!(
        status.contains("preflight (attempt 1): rank 1: GEMM"),
        "{status}"
    );
    // On the CPU the phase runs in f32 throughout (`train.muon.ns_dtype` follows the backend),
    // so however slow this machine's bf16 is, nothing warns of it.
    assert!(
        log.contains("matmul f32") && !log.contains("bf16 matmuls run"),
        "{log}"
    );
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn preflight_warns_of_bf16_work_where_bf16_is_slow() {
    // oneDNN held to AVX2 multiplies bf16 as a CPU without AMX or AVX512-BF16 units does, at
    // ~1/50 of f32's speed. A phase that asks for bf16 Newton-Schulz there is warned before its
    // first step, with both figures and the setting to change: in the log, in `zflow status`
    // and in the run record that the page shows.
    let recipe = with_train_setting(
        &recipe(1, 0).replace("tokens: 30000", "tokens: 1024"),
        "muon: {ns_dtype: bf16}",
    );
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe);
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("ONEDNN_MAX_CPU_ISA", "AVX2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warning = "bf16 matmuls run at under 50% of f32's on 1 of 1 rank(s) (rank 0 on ";
    let log = log(&sb);
    let warned = log.find(warning).expect(&log);
    let first_step = log.find("step 1 loss").expect(&log);
    assert!(warned < first_step, "{log}");
    let line = log[warned..].lines().next().unwrap();
    assert!(
        line.contains(": bf16 ")
            && line.contains("GFLOP/s, f32 ")
            && line.contains("train.muon.ns_dtype is bf16: set train.muon.ns_dtype: f32"),
        "{line}"
    );
    let status = sb.ok(&["status", "r.yaml"]).stdout;
    assert!(
        status.contains(&format!("preflight (attempt 1): {warning}")),
        "{status}"
    );
    let events = std::fs::read_to_string(sb.output("train.p1").join("events.jsonl")).unwrap();
    assert!(events.contains(warning), "{events}");
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn preflight_names_the_rank_and_host_of_a_slow_network_link() {
    // Three ranks on a ring, two steps; rank 1's network card is slow (each exchange of the
    // link probe waits 300 ms). Its neighbours each have one slow exchange (with rank 1) and one
    // fast one (with each other), so only rank 1 is named, with where it runs.
    let recipe = recipe(3, 0)
        .replace("global_batch: 8", "global_batch: 6")
        .replace("tokens: 30000", "tokens: 768")
        .replace("hang_timeout_s: 3}", "hang_timeout_s: 3, preflight: {}}");
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe);
    let (stderr, _) = run_with(&sb, "slow-link@0:ms=300:rank=1");
    let named: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("preflight: rank") && l.contains("network"))
        .collect();
    assert_eq!(named.len(), 1, "{stderr}");
    assert!(
        named[0].contains("preflight: rank 1: network")
            && named[0].contains("with rank 0")
            && named[0].contains("with rank 2")
            && named[0].contains(&format!("on {}", hostname())),
        "{stderr}"
    );
    let status = sb.ok(&["status", "r.yaml"]).stdout;
    assert!(status.contains("rank 1: network"), "{status}");
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn activation_checkpointing_on_two_ranks_changes_no_bit() {
    // Three steps on 2 ranks under DistributedDataParallel, each mode against keeping every
    // activation: the same weights, bit for bit.
    let short = recipe(2, 3).replace("tokens: 30000", "tokens: 1536");
    let final_of = |mode: &str| {
        let sb = Sandbox::new();
        sb.write(
            "r.yaml",
            &with_train_setting(&short, &format!("activation_checkpointing: {mode}")),
        );
        sb.ok(&["run", "r.yaml"]);
        final_weights(&sb)
    };
    let kept = final_of("none");
    for mode in ["full", "selective"] {
        assert!(
            final_of(mode) == kept,
            "{mode} differs from none on 2 ranks"
        );
    }
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn bf16_gradient_reduction_on_two_ranks_trains_near_f32() {
    // Three steps on 2 ranks with the gradients sent in bf16 and summed in f32
    // (`workers/torch/zflow_torch/reduce.py`; `workers/torch/tests/test_reduce.py` checks its
    // sums bit for bit), then with f32's all-reduce in the same store (only the train stage
    // runs again: the setting is part of its identity): other weights, losses near f32's.
    let short = recipe(2, 3).replace("tokens: 30000", "tokens: 1536");
    let sb = Sandbox::new();
    let run = |dtype: &str| {
        sb.write(
            "r.yaml",
            &with_train_setting(&short, &format!("grad_reduce_dtype: {dtype}")),
        );
        sb.ok(&["run", "r.yaml"]);
        // Two train outputs end in the store: this recipe's is the one `zflow path` names.
        let out = std::path::PathBuf::from(sb.ok(&["path", "r.yaml", "train.p1"]).stdout.trim());
        let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        (
            std::fs::read(out.join("final/model.safetensors")).unwrap(),
            losses(&metrics),
        )
    };
    let (bf16, bf16_losses) = run("bf16");
    let (f32, f32_losses) = run("f32");
    assert!(bf16 != f32, "bf16 reduction changed no bit: is it on?");
    assert_eq!(bf16_losses.len(), f32_losses.len());
    for ((step, a), (_, b)) in bf16_losses.iter().zip(&f32_losses) {
        assert!((a - b).abs() <= 1e-2 * b.abs(), "step {step}: {a} vs {b}");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// The phase's step count, from a finished run's log ("phase done at step N").
fn total_steps(sb: &Sandbox) -> u64 {
    let log = log(sb);
    let at = log.find("phase done at step ").expect("a finished phase") + 19;
    log[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn a_rank_lost_after_the_last_checkpoint_and_a_paused_supervisor_still_end_identical() {
    let reference = Sandbox::new();
    reference.write("r.yaml", &recipe(2, 2));
    reference.ok(&["run", "r.yaml"]);
    let want = final_weights(&reference);
    let total = total_steps(&reference);

    // Rank 1 dies right after the last step's checkpoint is committed, before `done`: the
    // relaunched ranks have no step left to run and finish at that checkpoint.
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe(2, 2));
    let (stderr, text) = run_with(&sb, &format!("crash@{total}:rank=1"));
    assert_eq!(stderr.matches("relaunching").count(), 1, "{stderr}");
    assert!(
        text.contains(&format!("resuming at step {total}")),
        "{text}"
    );
    assert!(final_weights(&sb) == want, "final weights differ");

    // `zflow run` itself stopped (SIGSTOP) for longer than hang_timeout_s (3 s), then
    // continued: its own pause is not the ranks' hang.
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe(2, 0));
    let child = sb
        .cmd(&["run", "r.yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let store = sb.path().join("zflow-store");
    let started = Instant::now();
    while partial_metrics(&store)
        .and_then(|m| std::fs::read_to_string(m).ok())
        .is_none_or(|m| m.matches("\"type\":\"step\"").count() < 10)
    {
        assert!(started.elapsed() < Duration::from_secs(300), "no step 10");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(6));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("hung"), "{stderr}");
    assert!(
        log(&sb).contains("the supervisor did not run for"),
        "{}",
        log(&sb)
    );
    assert!(
        final_weights(&sb) == want,
        "final weights differ after the pause"
    );
}

/// Connects to `address` once something listens there (within 60 s).
fn connect_when_up(address: &str) -> std::net::TcpStream {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match std::net::TcpStream::connect(address) {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < deadline, "{address} never listened: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn torch_ranks_prove_the_launch_secret_and_a_stranger_at_the_store_changes_nothing() {
    use std::io::Write;
    let reference = Sandbox::new();
    reference.write("r.yaml", &recipe_on("torch", 2, 0));
    reference.ok(&["run", "r.yaml"]);
    let want = losses(
        &std::fs::read_to_string(reference.output("train.p1").join("metrics.jsonl")).unwrap(),
    );
    let job = read_job(&reference);

    // Bytes that are not the store's protocol, at rank 0's store before rank 1 arrives: the
    // launch trains as it would have.
    let job_path = write_job(&job, &reference.path().join("attacked"));
    let mut stranger = None;
    let (stdout, _) = run_workers_with_engine("torch", &job_path, 2, |rendezvous| {
        let mut s = connect_when_up(rendezvous);
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: zflow\r\n\r\n");
        stranger = Some(s);
    });
    drop(stranger);
    assert_eq!(
        losses(&stdout),
        want,
        "a stranger at the store changed training"
    );

    // A rank with another secret never joins: rank 0 refuses it, as a fatal failure.
    let job_path = write_job(&job, &reference.path().join("impostor"));
    let rendezvous = format!("127.0.0.1:{}", free_port());
    let spawn = |rank: usize, secret: &str| {
        let mut c = common::worker("torch", &job_path);
        c.env("ZFLOW_RANK", rank.to_string())
            .env("ZFLOW_WORLD", "2")
            .env("ZFLOW_RENDEZVOUS", &rendezvous)
            .env("ZFLOW_GROUP_SECRET", secret)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let rank0 = spawn(0, &"0123456789abcdef".repeat(4));
    let impostor = spawn(1, &"fedcba9876543210".repeat(4));
    let out = rank0.wait_with_output().unwrap();
    let mut impostor = impostor;
    let _ = impostor.kill();
    let _ = impostor.wait();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("rank 1 did not prove the launch secret")
            && said.contains("\"class\":\"fatal\""),
        "{said}"
    );
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn token_ids_beyond_the_vocabulary_fail_at_once_naming_both_sizes() {
    // A tokenizer the recipe trains larger than the model: refused when the recipe loads,
    // naming both sizes (a fetched tokenizer's size is checked by the train stage before any
    // rank starts).
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        &recipe(2, 3).replace("train: {vocab_size: 512,", "train: {vocab_size: 1024,"),
    );
    let out = sb.zflow(&["run", "r.yaml"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "the model's vocabulary (512) is smaller than the tokenizer's (`tokenizer.train.vocab_size`: 1024)"
        ),
        "{}",
        out.stderr
    );

    // A worker handed ids beyond its vocabulary (here: a job whose model is smaller than its
    // data) fails with an error no relaunch can fix, and says so in its exit code.
    let reference = Sandbox::new();
    reference.write("r.yaml", &recipe(1, 0));
    reference.ok(&["run", "r.yaml"]);
    let mut job = read_job(&reference);
    job["model"]["vocab_size"] = serde_json::json!(100);
    let job_path = write_job(&job, &reference.path().join("small"));
    let out = common::worker("torch", &job_path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(zflow_runtime::contract::exit::EXIT_FATAL),
        "{stdout}"
    );
    let error = stdout
        .lines()
        .find(|l| l.contains("\"type\":\"error\""))
        .unwrap_or_else(|| panic!("no error message in {stdout}"));
    assert!(
        error.contains("beyond model.vocab_size 100") && error.contains("\"class\":\"fatal\""),
        "{error}"
    );
}

/// Every file of every complete stage output in the store, by path, with what depends on
/// when and how often it ran left out (manifest times; a train stage's throughput and
/// restarts, but not its losses).
fn store_outputs(sb: &Sandbox) -> std::collections::BTreeMap<String, Vec<u8>> {
    let store = sb.path().join("zflow-store");
    let mut out = std::collections::BTreeMap::new();
    for stage in std::fs::read_dir(&store).unwrap().flatten() {
        let name = stage.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.contains(".partial") || name.contains(".tmp-") {
            continue;
        }
        let mut stack = vec![stage.path()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = e.path();
                let rel = path.strip_prefix(&store).unwrap().display().to_string();
                if path.is_dir() {
                    stack.push(path);
                } else if rel.ends_with("metrics.jsonl") {
                    // Throughput differs from run to run; the losses may not.
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.insert(rel, format!("{:?}", losses(&text)).into_bytes());
                } else if name.starts_with("train.")
                    && (rel.ends_with(".zflow-manifest.json") || rel.contains("/metrics.parquet"))
                    || rel.contains("/events.")
                {
                    // The training record: times, throughput, restarts.
                } else if rel.ends_with(".zflow-manifest.json") {
                    // The manifest holds times; its content hash covers every file.
                    let m: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                    out.insert(rel, m["content_hash"].to_string().into_bytes());
                } else if rel.ends_with(".json") {
                    // Paths into the store (job.json) differ between sandboxes.
                    let text = std::fs::read_to_string(&path).unwrap();
                    let text = text.replace(&*store.to_string_lossy(), "<store>");
                    out.insert(rel, text.into_bytes());
                } else {
                    out.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
    }
    out
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn sigkill_of_zflow_run_at_drawn_moments_ends_with_the_uninterrupted_outputs() {
    let seed = std::env::var("ZFLOW_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16u64);
    let reference = Sandbox::new();
    reference.write("r.yaml", &recipe(2, 2));
    let started = Instant::now();
    reference.ok(&["run", "r.yaml"]);
    let full_ms = started.elapsed().as_millis() as u64;
    let want = store_outputs(&reference);

    let mut dice = Dice(seed);
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe(2, 2));
    // The torch fork server's socket folder goes here (`stages/src/forkserver.rs`).
    let tmp = sb.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut moments = Vec::new();
    for _ in 0..6 {
        // Anywhere in a whole run's time: data stages, commits, training, checkpoint writes.
        let at = full_ms * dice.roll(30, 1000) / 1000;
        moments.push(at);
        let mut child = sb
            .cmd(&["run", "r.yaml"])
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(at));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
    }
    eprintln!("seed {seed} (ZFLOW_KILL_SEED): SIGKILLs at {moments:?} ms of a {full_ms} ms run");
    // Each killed run's fork server saw its stdin close, killed the ranks it forked and removed
    // its folder.
    let servers = || -> Vec<_> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("zflow-fork-"))
            .map(|e| e.path())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !servers().is_empty() {
        assert!(
            Instant::now() < deadline,
            "a fork server outlived its zflow: {:?}",
            servers()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sb.ok(&["run", "r.yaml"]);
    let got = store_outputs(&sb);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "seed {seed}: the killed runs' store holds other outputs"
    );
    for (file, bytes) in &want {
        assert!(
            got[file] == *bytes,
            "seed {seed}: {file} differs from the uninterrupted run's"
        );
    }
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn a_context_parallel_phase_resumes_on_one_rank_with_the_same_data() {
    // Each sequence split over 2 ranks (one data-parallel group) until a crash after the
    // step-5 checkpoint; the same phase then resumes on 1 rank (`launch` is not part of the
    // stage's identity). Every step's loss and routing must be the uninterrupted 1-rank run's:
    // the data cursor and the checkpoint do not depend on the split.
    // Checkpoints written inline: the step-5 one is committed before step 6 starts, where a
    // background write could still be under way at the crash (a loaded machine lost it so).
    let short = with_train_setting(
        &exact_across_world_sizes(recipe(1, 0)).replace("tokens: 30000", "tokens: 8000"),
        "async_checkpoints: false",
    );
    let split = short.replace(
        "data_parallel: 1,",
        "data_parallel: 1, context_parallel: 2,",
    );
    assert_ne!(split, short);
    let sb = Sandbox::new();
    sb.write("r.yaml", &split);
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("ZFLOW_FAULTS", "crash@7")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the crash at step 7 ends the run");
    sb.write("r.yaml", &short);
    sb.ok(&["run", "r.yaml"]);
    assert!(
        log(&sb).contains("resuming phase p1 at step 5"),
        "{}",
        log(&sb)
    );

    let reference = Sandbox::new();
    reference.write("r.yaml", &short);
    reference.ok(&["run", "r.yaml"]);
    let steps = |sb: &Sandbox| -> Vec<serde_json::Value> {
        std::fs::read_to_string(sb.output("train.p1").join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["type"] == "step")
            .collect()
    };
    let (resumed, uninterrupted) = (steps(&sb), steps(&reference));
    assert_eq!(resumed.len(), uninterrupted.len());
    for (a, b) in resumed.iter().zip(&uninterrupted) {
        assert_eq!(
            (&a["step"], &a["tokens"], &a["expert_load"]),
            (&b["step"], &b["tokens"], &b["expert_load"])
        );
        let (x, y) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "step {}: {x} vs {y}",
            a["step"]
        );
    }
    let state =
        |sb: &Sandbox| trainer_state(&sb.output("train.p1").join("final"))["cursor"].clone();
    assert_eq!(state(&sb), state(&reference));
}

/// Bytes a tmpfs needs to hold the files under `dir`: each file in whole pages, and a page for
/// each folder.
fn tmpfs_bytes(dir: &Path) -> u64 {
    let mut total = 4096;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        total += if meta.is_dir() {
            tmpfs_bytes(&e.path())
        } else {
            meta.len().div_ceil(4096) * 4096
        };
    }
    total
}

/// A phase that fills its store's disk: the run's summary and `zflow status` name the cause
/// (the worker's OSError: No space left on device, sent to the supervisor even though the log
/// it would print its trace to is full), not a bare exit status, and the attempt's run record
/// is written into the space held for it. The store is a 1.1 MB tmpfs larger than the data,
/// mounted in a mount namespace of `unshare` (gone with it).
#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn a_full_disk_is_named_in_the_summary_and_in_status() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe_on("torch", 1, 3));
    sb.ok(&["run", "r.yaml", "--until", "mix.p1"]);
    // The data, a reserve for the run record (256 KiB), the phase's job and logs; not its first
    // checkpoint (~2 MB).
    let size = tmpfs_bytes(&sb.path().join("zflow-store")) + (800 << 10);
    std::fs::create_dir(sb.path().join("small")).unwrap();
    let zflow = env!("CARGO_BIN_EXE_zflow");
    let script = format!(
        "set -e; mount -t tmpfs -o size={size} tmpfs small; cp -a zflow-store r.yaml small/; \
         cd small; {zflow} run r.yaml > ../run.out 2>&1 || true; {zflow} status r.yaml > ../status.out 2>&1"
    );
    let out = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .current_dir(sb.path())
        .env_remove("ZFLOW_STORE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        sb.read("run.out")
    );
    let (run, status) = (sb.read("run.out"), sb.read("status.out"));
    let summary = run
        .lines()
        .find(|l| l.starts_with("stage `train.p1` failed"))
        .unwrap_or_else(|| panic!("no failure summary:\n{run}"));
    assert!(
        summary.contains("OSError: [Errno 28] No space left on device"),
        "{summary}"
    );
    assert!(!run.contains("exit status 1"), "{run}");
    assert!(!run.contains("could not be written"), "{run}");
    let line = status
        .lines()
        .find(|l| l.contains("train.p1"))
        .unwrap_or_else(|| panic!("no train.p1 in:\n{status}"));
    assert!(
        line.trim_start().starts_with("failed") && line.contains("No space left on device"),
        "{status}"
    );
}
