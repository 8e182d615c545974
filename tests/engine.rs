//! The engine end to end through the real binary: caching, re-runs, early cutoff, failures,
//! crashes, signals, leases, store moves, selection, gc, query, graph.

mod common;

use std::time::{Duration, Instant};

use common::Sandbox;

const SIX: &str = r#"
name: six
vars:
  mode: fast
stages:
  - name: corpus
    kind: fetch
    url: data/*.txt
  - name: notes
    kind: fetch
    url: notes.md
  - name: words
    kind: shell
    needs: [corpus]
    run: cat "$ZFLOW_IN_CORPUS"/*.txt | wc -w > "$ZFLOW_OUT/words.txt"
  - name: lines
    kind: shell
    needs: [corpus]
    run: cat "$ZFLOW_IN_CORPUS"/*.txt | wc -l > "$ZFLOW_OUT/lines.txt"
  - name: upper
    kind: shell
    needs: [notes]
    env: {MODE: "${mode}"}
    run: tr a-z A-Z < "$ZFLOW_IN_NOTES/notes.md" > "$ZFLOW_OUT/notes.txt"
  - name: report
    kind: shell
    needs: [words, lines, upper]
    run: cat "$ZFLOW_IN_WORDS/words.txt" "$ZFLOW_IN_LINES/lines.txt" "$ZFLOW_IN_UPPER/notes.txt" > "$ZFLOW_OUT/report.txt"
"#;

fn six() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("data/a.txt", "the quick brown fox\njumps over\n");
    sb.write("data/b.txt", "the lazy dog\n");
    sb.write("notes.md", "some notes\n");
    sb.write("six.yaml", SIX);
    sb
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn six_stages_run_once_then_everything_is_cached() {
    let sb = six();
    let first = sb.ok(&["run", "six.yaml"]);
    assert_eq!(first.counts(), (6, 0, 0, 0), "{}", first.stderr);
    let report = std::fs::read_to_string(sb.output("report").join("report.txt")).unwrap();
    assert_eq!(
        report.split_whitespace().collect::<Vec<_>>(),
        ["9", "3", "SOME", "NOTES"]
    );
    let second = sb.ok(&["run", "six.yaml"]);
    assert_eq!(second.counts(), (0, 6, 0, 0), "{}", second.stderr);
    let plan = sb.ok(&["plan", "six.yaml"]);
    assert!(
        plan.stdout.contains("6 stages: 6 cached, 0 to run"),
        "{}",
        plan.stdout
    );
}

#[test]
fn changing_one_field_reruns_that_stage_and_its_dependents_and_why_says_so() {
    let sb = six();
    sb.ok(&["run", "six.yaml"]);
    // Change `lines` through --set: it and `report` re-run; nothing else.
    let set =
        "--set=stages.lines.run=cat \"$ZFLOW_IN_CORPUS\"/*.txt | wc -c > \"$ZFLOW_OUT/lines.txt\"";
    let why = sb.ok(&["why", "six.yaml", "lines", set]);
    assert!(
        why.stdout.contains("field `run` changed from"),
        "{}",
        why.stdout
    );
    assert!(
        why.stdout.contains("wc -l") && why.stdout.contains("wc -c"),
        "{}",
        why.stdout
    );
    let why_report = sb.ok(&["why", "six.yaml", "report", set]);
    assert!(
        why_report
            .stdout
            .contains("will run after its inputs lines"),
        "{}",
        why_report.stdout
    );
    let plan = sb.ok(&["plan", "six.yaml", set]);
    assert!(
        plan.stdout.contains("4 cached, 2 to run"),
        "{}",
        plan.stdout
    );
    let run = sb.ok(&["run", "six.yaml", set]);
    assert_eq!(sorted(run.ran()), ["lines", "report"], "{}", run.stderr);

    // A var used in an env value: `upper` and `report` re-run; why names the field.
    let why = sb.ok(&["why", "six.yaml", "upper", "--set", "vars.mode=slow"]);
    assert!(
        why.stdout
            .contains("field `env.MODE` changed from \"fast\" to \"slow\""),
        "{}",
        why.stdout
    );

    // A changed input file re-runs the fetch and its readers; their counts are unchanged, so
    // `report` (whose inputs' contents are the same as in the first run) stays cached.
    sb.write("data/b.txt", "the lazy cat\n");
    let run = sb.ok(&["run", "six.yaml"]);
    assert_eq!(
        sorted(run.ran()),
        ["corpus", "lines", "words"],
        "{}",
        run.stderr
    );
}

#[test]
fn early_cutoff_keeps_dependents_cached_when_output_is_unchanged() {
    let sb = six();
    sb.ok(&["run", "six.yaml"]);
    // Same output, different command.
    let set = "--set=stages.words.run=cat \"$ZFLOW_IN_CORPUS\"/a.txt \"$ZFLOW_IN_CORPUS\"/b.txt | wc -w > \"$ZFLOW_OUT/words.txt\"";
    let run = sb.ok(&["run", "six.yaml", set]);
    assert_eq!(run.ran(), ["words"], "{}", run.stderr);
    assert_eq!(run.counts(), (1, 5, 0, 0));
    // --force re-runs a stage; identical output, so nothing downstream runs.
    let forced = sb.ok(&["run", "six.yaml", "--force", "corpus"]);
    assert_eq!(forced.ran(), ["corpus"], "{}", forced.stderr);
}

#[test]
fn moving_the_store_or_changing_jobs_changes_no_identity() {
    let sb = six();
    sb.ok(&["run", "six.yaml", "-j", "1"]);
    let ids_before = sb
        .ok(&[
            "query",
            "zflow-store",
            "SELECT stage, identity FROM stages ORDER BY stage",
        ])
        .stdout;
    std::fs::rename(sb.path().join("zflow-store"), sb.path().join("moved")).unwrap();
    let run = sb.ok(&["run", "six.yaml", "--store", "moved", "-j", "2"]);
    assert_eq!(run.counts(), (0, 6, 0, 0), "{}", run.stderr);
    let run = sb
        .cmd(&["run", "six.yaml", "-j", "3"])
        .env("ZFLOW_STORE", "moved")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&run.stderr).contains("0 ran, 6 cached"));
    let ids_after = sb
        .ok(&[
            "query",
            "moved",
            "SELECT stage, identity FROM stages ORDER BY stage",
        ])
        .stdout;
    assert_eq!(ids_before, ids_after);
}

#[test]
fn a_failing_stage_stops_only_its_dependents() {
    let sb = six();
    let set = "--set=stages.upper.run=echo about to fail; exit 3";
    let run = sb.zflow(&["run", "six.yaml", set]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        sorted(run.ran()),
        ["corpus", "lines", "notes", "words"],
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("stage `upper` failed"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("exited with status 3"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("about to fail"),
        "the error shows the log tail: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("log: ") && run.stderr.contains("upper-"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("not run: report"), "{}", run.stderr);
    let status = sb.ok(&["status", "six.yaml", set]);
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.contains("failed") && l.contains("upper")),
        "{}",
        status.stdout
    );
    // The independent branches are cached; fixing the stage runs only what is left.
    let run = sb.ok(&["run", "six.yaml"]);
    assert_eq!(sorted(run.ran()), ["report", "upper"], "{}", run.stderr);
    let failed = sb.ok(&[
        "query",
        "zflow-store",
        "SELECT stage, error FROM runs WHERE status = 'failed'",
    ]);
    assert!(
        failed.stdout.contains("upper") && failed.stdout.contains("status 3"),
        "{}",
        failed.stdout
    );
}

/// A recipe whose middle stage blocks until a file appears, so tests can act mid-stage.
const SLOW: &str = r#"
stages:
  - name: first
    kind: shell
    run: echo one > "$ZFLOW_OUT/one"
  - name: side
    kind: shell
    run: echo side > "$ZFLOW_OUT/side"
  - name: slow
    kind: shell
    needs: [first]
    run: |
      echo started >> "$PWD/slow-starts"
      echo $$ > "$PWD/slow.pid"
      while [ ! -e "$PWD/go" ]; do sleep 0.05; done
      echo two > "$ZFLOW_OUT/two"
  - name: last
    kind: shell
    needs: [slow]
    run: cat "$ZFLOW_IN_SLOW/two" > "$ZFLOW_OUT/three"
"#;

/// Waits until `path` holds a whole line: the shell creates the file before `echo` writes to
/// it, so its mere existence is not enough.
fn wait_for(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n')) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 checks existence only.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn sigkill_of_zflow_mid_stage_then_rerun_runs_only_unfinished_stages() {
    let sb = Sandbox::new();
    sb.write("slow.yaml", SLOW);
    let mut child = sb
        .cmd(&["run", "slow.yaml", "-j", "1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sb.path().join("slow.pid"), "the slow stage to start");
    let script_pid: i32 = sb.read("slow.pid").trim().parse().unwrap();
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // The stage's process dies with zflow.
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(script_pid) {
        assert!(
            Instant::now() < deadline,
            "stage process {script_pid} outlived zflow"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // No output of the killed stage counts as complete.
    let status = sb.ok(&["status", "slow.yaml"]);
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.contains("pending") && l.contains("slow")),
        "{}",
        status.stdout
    );
    sb.write("go", "");
    let rerun = sb.ok(&["run", "slow.yaml"]);
    assert_eq!(sorted(rerun.ran()), ["last", "slow"], "{}", rerun.stderr);
    assert_eq!(
        rerun.counts().1,
        2,
        "first and side are cached: {}",
        rerun.stderr
    );
    assert_eq!(sb.read("slow-starts").lines().count(), 2);
}

#[test]
fn sigint_stops_children_leaves_the_store_consistent_and_exits_130() {
    let sb = Sandbox::new();
    sb.write("slow.yaml", SLOW);
    let child = sb
        .cmd(&["run", "slow.yaml", "-j", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&sb.path().join("slow.pid"), "the slow stage to start");
    let script_pid: i32 = sb.read("slow.pid").trim().parse().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("cancelled"), "{stderr}");
    assert!(!alive(script_pid), "the stage's process was stopped");
    let cancelled = sb.ok(&[
        "query",
        "zflow-store",
        "SELECT count(*) AS n FROM runs WHERE stage = 'slow' AND status = 'cancelled'",
    ]);
    assert!(cancelled.stdout.contains("| 1 "), "{}", cancelled.stdout);
    assert_eq!(attempt_folders(&sb), Vec::<String>::new());
    sb.write("go", "");
    let rerun = sb.ok(&["run", "slow.yaml"]);
    assert_eq!(sorted(rerun.ran()), ["last", "slow"], "{}", rerun.stderr);
}

/// The store's attempt folders (`*.tmp-*`).
fn attempt_folders(sb: &Sandbox) -> Vec<String> {
    std::fs::read_dir(sb.path().join("zflow-store"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// A FIFO in a stage's output (hashing it would wait for a writer forever) fails the stage
/// at commit, naming it; the failed attempt's folder is removed, and the run ends by itself.
#[test]
fn a_fifo_in_an_output_fails_the_stage_by_name_and_leaves_no_attempt_folder() {
    let sb = Sandbox::new();
    sb.write(
        "fifo.yaml",
        "stages:\n  - name: piped\n    kind: shell\n    run: mkfifo \"$ZFLOW_OUT/pipe\"\n",
    );
    let mut child = sb
        .cmd(&["run", "fifo.yaml"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("zflow run hangs on a FIFO in the output");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("pipe: a FIFO (named pipe); a stage's output holds only files"),
        "{stderr}"
    );
    assert_eq!(attempt_folders(&sb), Vec::<String>::new());
}

#[test]
fn two_runs_on_one_store_never_run_a_stage_twice() {
    let sb = Sandbox::new();
    sb.write("slow.yaml", SLOW);
    let a = sb
        .cmd(&["run", "slow.yaml"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&sb.path().join("slow.pid"), "the slow stage to start");
    let b = sb
        .cmd(&["run", "slow.yaml"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let status = sb.ok(&["status", "slow.yaml"]);
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.contains("running") && l.contains("slow") && l.contains("pid")),
        "{}",
        status.stdout
    );
    sb.write("go", "");
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    assert_eq!(
        sb.read("slow-starts").lines().count(),
        1,
        "the slow stage ran once"
    );
    let b_err = String::from_utf8_lossy(&b.stderr);
    assert!(b_err.contains("is being run by pid"), "{b_err}");
}

#[test]
fn a_stale_lease_of_a_dead_owner_is_taken_over() {
    let sb = Sandbox::new();
    sb.write("slow.yaml", SLOW);
    let mut child = sb
        .cmd(&["run", "slow.yaml", "-j", "1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sb.path().join("slow.pid"), "the slow stage to start");
    let leases = sb.path().join("zflow-store/.zflow/leases");
    assert_eq!(
        std::fs::read_dir(&leases).unwrap().count(),
        1,
        "the running stage holds a lease"
    );
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert_eq!(
        std::fs::read_dir(&leases).unwrap().count(),
        1,
        "a SIGKILLed run leaves its lease behind"
    );
    sb.write("go", "");
    let rerun = sb.ok(&["run", "slow.yaml"]);
    assert!(
        rerun.stderr.contains("taking over stale lease"),
        "{}",
        rerun.stderr
    );
    assert_eq!(std::fs::read_dir(&leases).unwrap().count(), 0);
}

/// A stage whose shell leaves a grandchild: a background `sleep` that is not the stage's
/// direct child, so zflow's parent-death signal does not reach it.
const TREE: &str = r#"
stages:
  - name: tree
    kind: shell
    run: |
      echo started >> "$PWD/tree-starts"
      sleep 300 &
      echo $! > "$PWD/grandchild.pid"
      while [ ! -e "$PWD/go" ]; do sleep 0.05; done
      echo done > "$ZFLOW_OUT/out"
"#;

/// Waits until process `pid` is gone (or a zombie: dead, not yet reaped by its new parent).
fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if stat.is_empty() || zombie {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) outlived zflow"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_whole_process_tree_of_a_stage_dies_with_zflow_and_with_the_stage() {
    let sb = Sandbox::new();
    sb.write("tree.yaml", TREE);
    let mut child = sb
        .cmd(&["run", "tree.yaml"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        &sb.path().join("grandchild.pid"),
        "the stage to start its grandchild",
    );
    let grandchild: i32 = sb.read("grandchild.pid").trim().parse().unwrap();
    assert!(alive(grandchild));
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    wait_gone(grandchild, "the stage's grandchild");

    // The rerun starts a new attempt only once the old tree is gone, and when the stage ends,
    // what it left in the background ends with it.
    sb.write("go", "");
    let rerun = sb.ok(&["run", "tree.yaml"]);
    assert_eq!(rerun.ran(), ["tree"], "{}", rerun.stderr);
    assert_eq!(sb.read("tree-starts").lines().count(), 2);
    let second: i32 = sb.read("grandchild.pid").trim().parse().unwrap();
    assert_ne!(second, grandchild);
    wait_gone(second, "the finished stage's background process");
}

#[test]
fn gc_keeps_what_a_running_stage_of_another_recipe_reads() {
    let sb = Sandbox::new();
    sb.write("data/a.txt", "some text\n");
    // `reader` reads `corpus` only once `go` exists; meanwhile gc runs for a recipe that does
    // not know `corpus` at all.
    sb.write(
        "a.yaml",
        r#"
stages:
  - name: corpus
    kind: fetch
    url: data/*.txt
  - name: reader
    kind: shell
    needs: [corpus]
    run: |
      echo started > "$PWD/reader.started"
      while [ ! -e "$PWD/go" ]; do sleep 0.05; done
      cat "$ZFLOW_IN_CORPUS"/a.txt > "$ZFLOW_OUT/copy.txt"
"#,
    );
    sb.write(
        "b.yaml",
        "stages:\n  - name: other\n    kind: shell\n    run: echo b > \"$ZFLOW_OUT/b\"\n",
    );
    sb.ok(&["run", "b.yaml"]);
    let a = sb
        .cmd(&["run", "a.yaml"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&sb.path().join("reader.started"), "the reader to start");
    let gc = sb.ok(&["gc", "zflow-store", "b.yaml"]);
    assert!(gc.stdout.contains("removed 0 folders"), "{}", gc.stdout);
    assert!(common::stage_dir(&sb.path().join("zflow-store"), "corpus").exists());
    sb.write("go", "");
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(
        std::fs::read_to_string(sb.output("reader").join("copy.txt")).unwrap(),
        "some text\n"
    );
    // Once nothing runs, what b.yaml does not reference is garbage.
    let gc = sb.ok(&["gc", "zflow-store", "b.yaml"]);
    assert!(gc.stdout.contains("removed 2 folders"), "{}", gc.stdout);
}

#[test]
fn only_from_until_select_stages() {
    let sb = six();
    let until = sb.ok(&["run", "six.yaml", "--until", "words"]);
    assert_eq!(sorted(until.ran()), ["corpus", "words"]);
    let only = sb.zflow(&["run", "six.yaml", "--only", "report"]);
    assert_eq!(only.code, 1);
    assert!(
        only.stderr.contains("needs `lines`, which is not complete"),
        "{}",
        only.stderr
    );
    let only = sb.ok(&["run", "six.yaml", "--only", "lines"]);
    assert_eq!(only.ran(), ["lines"]);
    let from = sb.ok(&["run", "six.yaml", "--from", "notes"]);
    assert_eq!(sorted(from.ran()), ["notes", "report", "upper"]);
    let bad = sb.zflow(&["run", "six.yaml", "--only", "nope"]);
    assert!(
        bad.stderr.contains("no stage named `nope`"),
        "{}",
        bad.stderr
    );
}

#[test]
fn logs_graph_gc_and_query() {
    let sb = six();
    sb.ok(&["run", "six.yaml"]);
    let logs = sb.ok(&["logs", "six.yaml", "upper"]);
    assert!(
        logs.stdout.contains("stage upper (shell v1)"),
        "{}",
        logs.stdout
    );
    let dot = sb.ok(&["graph", "six.yaml"]);
    assert!(
        dot.stdout.starts_with("digraph") && dot.stdout.contains("\"words\" -> \"report\""),
        "{}",
        dot.stdout
    );
    let mermaid = sb.ok(&["graph", "six.yaml", "--format", "mermaid"]);
    assert!(
        mermaid.stdout.starts_with("flowchart LR") && mermaid.stdout.matches("-->").count() == 6,
        "{}",
        mermaid.stdout
    );

    // A second identity of `lines`; gc keeps what the recipe uses now and removes the old one.
    let set = "--set=stages.lines.run=echo 0 > \"$ZFLOW_OUT/lines.txt\"";
    sb.ok(&["run", "six.yaml", set]);
    let dry = sb.ok(&["gc", "zflow-store", "six.yaml", "--dry-run"]);
    assert!(
        dry.stdout.contains("would remove 2 folders"),
        "{}",
        dry.stdout
    );
    let gc = sb.ok(&["gc", "zflow-store", "six.yaml"]);
    assert!(gc.stdout.contains("removed 2 folders"), "{}", gc.stdout);
    let run = sb.ok(&["run", "six.yaml"]);
    assert_eq!(run.counts(), (0, 6, 0, 0), "{}", run.stderr);

    let q = sb.ok(&[
        "query",
        "zflow-store",
        "SELECT stage, count(*) AS attempts FROM runs GROUP BY stage ORDER BY stage",
    ]);
    assert!(q.stdout.contains("| lines  | 2 "), "{}", q.stdout);
    let bad = sb.zflow(&["query", "zflow-store", "SELECT nope FROM runs"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("nope"), "{}", bad.stderr);
}

/// Every path under `dir` (the `.zflow` folder included) with its size and modification time.
fn snapshot(dir: &std::path::Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = e.metadata().unwrap();
            out.push((
                e.path().display().to_string(),
                meta.len(),
                meta.modified().unwrap(),
            ));
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn gc_refuses_what_is_not_a_store_deletes_only_what_the_store_made_and_dry_run_writes_nothing() {
    let sb = six();
    // A folder that is not a store: refused, with or without --dry-run, and left as it was.
    sb.write("home/docs/a.txt", "mine\n");
    sb.write("home/music/b.txt", "mine too\n");
    let before = snapshot(&sb.path().join("home"));
    for args in [
        &["gc", "home", "six.yaml", "--dry-run"][..],
        &["gc", "home", "six.yaml"][..],
    ] {
        let out = sb.zflow(args);
        assert_ne!(out.code, 0, "{args:?}: {}", out.stdout);
        assert!(
            out.stderr.contains("home is not a zflow store"),
            "{}",
            out.stderr
        );
        assert_eq!(
            snapshot(&sb.path().join("home")),
            before,
            "{args:?} changed a folder that is not a store"
        );
    }
    assert!(!sb.path().join("home/.zflow").exists());

    // In a store, a second identity of `lines` is garbage; a folder and a file of someone
    // else's, and a name that only looks like a stage's, are not the store's and stay.
    sb.ok(&["run", "six.yaml"]);
    sb.ok(&[
        "run",
        "six.yaml",
        "--set=stages.lines.run=echo 0 > \"$ZFLOW_OUT/lines.txt\"",
    ]);
    let store = sb.path().join("zflow-store");
    sb.write("zflow-store/notes/keep.txt", "mine\n");
    sb.write("zflow-store/README", "mine\n");
    sb.write("zflow-store/lines-NOTAHASH1234/keep.txt", "mine\n");
    let before = snapshot(&store);
    let dry = sb.ok(&["gc", "zflow-store", "six.yaml", "--dry-run"]);
    assert!(
        dry.stdout.contains("would remove 2 folders"),
        "{}",
        dry.stdout
    );
    assert_eq!(snapshot(&store), before, "--dry-run wrote to the store");
    let gc = sb.ok(&["gc", "zflow-store", "six.yaml"]);
    assert!(gc.stdout.contains("removed 2 folders"), "{}", gc.stdout);
    for kept in ["notes/keep.txt", "README", "lines-NOTAHASH1234/keep.txt"] {
        assert!(store.join(kept).exists(), "gc removed {kept}");
    }
    assert_eq!(sb.ok(&["run", "six.yaml"]).counts(), (0, 6, 0, 0));
}

#[test]
fn queries_are_read_only() {
    let sb = six();
    sb.ok(&["run", "six.yaml"]);
    let out_file = sb.path().join("copied.parquet");
    let writes = [
        format!("COPY (SELECT * FROM runs) TO '{}'", out_file.display()),
        "INSERT INTO runs SELECT * FROM runs".to_string(),
        "CREATE TABLE t AS SELECT 1".to_string(),
        "SET datafusion.execution.batch_size = 1".to_string(),
    ];
    for sql in &writes {
        let out = sb.zflow(&["query", "zflow-store", sql]);
        assert_ne!(out.code, 0, "`{sql}` was run:\n{}", out.stdout);
        assert!(
            out.stderr.contains("queries are read-only"),
            "{}",
            out.stderr
        );
    }
    assert!(!out_file.exists(), "COPY TO wrote a file");
    let q = sb.ok(&["query", "zflow-store", "SELECT count(*) AS n FROM runs"]);
    assert!(q.stdout.contains("| 6 "), "{}", q.stdout);
}

/// A full disk under the run records (a 4 KiB tmpfs, filled, in a mount namespace of the
/// test's own): the stage's output still commits, the run says its record is missing, and no
/// temporary stays behind; a temporary that a killed writer left is swept by the next run.
#[test]
fn a_run_record_that_cannot_be_written_is_reported_and_leaves_no_temporary() {
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        "stages:\n  - name: a\n    kind: shell\n    run: echo hi > \"$ZFLOW_OUT/x\"\n",
    );
    sb.ok(&["status", "r.yaml"]); // creates the store's folders
    let records = sb.path().join("zflow-store/.zflow/records");
    let script = format!(
        "mount -t tmpfs -o size=4k zflow-test-full '{r}' && (head -c 8192 /dev/zero > '{r}/fill' || true) && '{zflow}' run r.yaml; echo \"rc=$?\"; ls -A '{r}'",
        r = records.display(),
        zflow = env!("CARGO_BIN_EXE_zflow")
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .current_dir(sb.path())
        .env_remove("ZFLOW_STORE")
        .output()
        .expect("unshare (util-linux) starts a mount namespace");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("rc=0"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: the run record of `a`'s attempt could not be written")
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    let left: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("rc="))
        .skip(1)
        .collect();
    assert_eq!(left, ["fill"], "the full records folder holds: {left:?}");
    assert!(sb.output("a").join("x").exists(), "the output committed");

    // A temporary of a writer killed long ago goes at the next run's start; a fresh one (a
    // concurrent run's write in flight) stays.
    let stale = records.join(".1-2-a.3.tmp");
    let fresh = records.join(".4-5-a.6.tmp");
    std::fs::write(&stale, b"").unwrap();
    std::fs::write(&fresh, b"").unwrap();
    let touched = std::process::Command::new("touch")
        .args(["-d", "2 hours ago"])
        .arg(&stale)
        .status()
        .unwrap();
    assert!(touched.success());
    sb.ok(&["run", "r.yaml"]);
    assert!(!stale.exists() && fresh.exists());
}

/// A store zflow creates is its owner's alone (logs, configs and run records included); one
/// that exists keeps the permissions its owner gave it.
#[test]
fn a_new_store_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        "stages:\n  - name: a\n    kind: shell\n    run: echo hi > \"$ZFLOW_OUT/x\"\n",
    );
    sb.ok(&["run", "r.yaml"]);
    let mode = |p: &str| {
        std::fs::metadata(sb.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("zflow-store"), 0o700);
    std::fs::create_dir(sb.path().join("shared")).unwrap();
    std::fs::set_permissions(
        sb.path().join("shared"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    sb.ok(&["run", "r.yaml", "--store", "shared"]);
    assert_eq!(mode("shared"), 0o750);
}

/// A stage's output is hashed by the process that ran it as it ends, so committing it reads
/// none of its bytes again (the stage log says what the commit read); `zflow verify` hashes it
/// all again and names a byte changed since.
#[test]
fn committing_reads_no_output_byte_and_verify_finds_a_changed_one() {
    let sb = Sandbox::new();
    let size: u64 = 64 << 20;
    sb.write(
        "r.yaml",
        &format!(
            "stages:\n  - name: big\n    kind: shell\n    run: head -c {size} /dev/urandom > \"$ZFLOW_OUT/big.bin\"\n"
        ),
    );
    sb.ok(&["run", "r.yaml"]);
    let log = sb.ok(&["logs", "r.yaml", "big"]).stdout;
    let read: u64 = log
        .split("committing read ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no commit figure in the log:\n{log}"));
    assert!(read < size / 100, "committing read {read} of {size} bytes");

    let verified = sb.ok(&["verify", "zflow-store", "big"]);
    assert!(
        verified.stdout.contains("1 outputs verified, 0 changed"),
        "{}",
        verified.stdout
    );
    let file = sb.output("big").join("big.bin");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[1000] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let changed = sb.zflow(&["verify", "zflow-store"]);
    assert_eq!(changed.code, 1, "{}", changed.stdout);
    assert!(
        changed.stdout.contains("big.bin: blake3") && changed.stdout.contains("the bytes changed"),
        "{}",
        changed.stdout
    );
}
