//! Every recipe error names file:line:col and says what was expected; bad recipes never
//! touch the store.

mod common;

use common::Sandbox;

/// Runs `zflow plan` on `recipe` and returns the error output, asserting exit code 2.
fn plan_error(sb: &Sandbox, file: &str, extra: &[&str]) -> String {
    let mut args = vec!["plan", file];
    args.extend_from_slice(extra);
    let out = sb.zflow(&args);
    assert_eq!(
        out.code, 2,
        "expected a recipe error from {args:?}, got:\n{}\n{}",
        out.stdout, out.stderr
    );
    out.stderr
}

fn check(yaml: &str, expect_loc: &str, expect_msg: &str) {
    let sb = Sandbox::new();
    sb.write("r.yaml", yaml);
    let err = plan_error(&sb, "r.yaml", &[]);
    assert!(
        err.contains(expect_loc),
        "expected location `{expect_loc}` in:\n{err}"
    );
    assert!(
        err.contains(expect_msg),
        "expected `{expect_msg}` in:\n{err}"
    );
    assert!(
        !sb.path().join("zflow-store").exists(),
        "a bad recipe must not create the store"
    );
}

#[test]
fn unknown_stage_field_points_at_the_key() {
    check(
        "stages:\n  - name: a\n    kind: shell\n    rn: echo hi\n",
        "r.yaml:4:5",
        "unknown field `rn`, expected `run` or `env`",
    );
}

#[test]
fn a_bad_shard_count_is_named() {
    check(
        "sources:\n  a:\n    url: x.txt\n    shards: 0\n",
        "r.yaml:4:13",
        "`shards` must be a whole number of shards from 1 to 100000, or `{target: SIZE}`, got 0",
    );
    check(
        "sources:\n  a:\n    url: x.txt\n    shards: {target: lots}\n",
        "r.yaml:4",
        "expected a size per shard such as `256MB`, `1GiB` or a number of bytes, got \"lots\"",
    );
    check(
        "sources:\n  a:\n    url: x.txt\n    near_dedup: {bands: 0}\n",
        "r.yaml:4",
        "must be from 1 to 1024, got 0",
    );
    check(
        "sources:\n  a:\n    url: x.txt\n    dedup_tasks: {count: 0}\n",
        "r.yaml:4:26",
        "expected a whole number from 1 to 100000, got 0",
    );
    check(
        "sources:\n  a:\n    url: x.txt\n    dedup_tasks: {memory_gb: -1}\n",
        "r.yaml:4",
        "expected a positive number of GiB, got -1",
    );
}

#[test]
fn a_slurm_value_that_would_add_a_line_to_the_batch_script_is_refused() {
    check(
        "executor:\n  kind: slurm\n  partition: \"gpu\\nrm -rf ~\"\n",
        "r.yaml:3:14",
        "`partition` must be one line without control characters (each executor value becomes a line of the batch script), got \"gpu\\nrm -rf ~\"",
    );
    check(
        "executor:\n  kind: slurm\n  sbatch_args: [\"--exclusive\", \"--x\\n\"]\n",
        "r.yaml:3",
        "`sbatch_args[1]` must be one line",
    );
}

#[test]
fn unknown_kind_lists_the_kinds() {
    check(
        "stages:\n  - name: a\n    kind: shel\n    run: x\n",
        "r.yaml:3:11",
        "unknown stage kind `shel`, expected one of: contamination, dedup, dedup_keys, eval, export, fetch, ingest, megatron, mix, preflight, report, shell, tokenize, tokenizer, train",
    );
}

#[test]
fn wrong_type_points_at_the_value() {
    check(
        "stages:\n  - name: a\n    kind: shell\n    run: x\n    needs: 3\n",
        "r.yaml:5:12",
        "invalid type",
    );
    check(
        "stages:\n  - name: a\n    kind: shell\n    run: [1]\n",
        "r.yaml:4:10",
        "invalid type",
    );
}

#[test]
fn missing_field_names_the_entry() {
    check(
        "stages:\n  - name: a\n    kind: shell\n",
        "r.yaml:2:5",
        "missing field `run`",
    );
}

#[test]
fn yaml_syntax_error() {
    check(
        "stages:\n  - name: a\n    kind: [shell\n",
        "r.yaml:",
        "invalid YAML",
    );
}

#[test]
fn unknown_top_level_field() {
    check(
        "name: x\nstagez: []\n",
        "r.yaml:2:1",
        "unknown top-level field `stagez`",
    );
}

#[test]
fn needs_an_unknown_stage_suggests_a_name() {
    check(
        "stages:\n  - name: words\n    kind: shell\n    run: x\n  - name: b\n    kind: shell\n    run: y\n    needs: [word]\n",
        "r.yaml:8:13",
        "needs `word`, which is not a stage of this recipe (did you mean `words`?)",
    );
}

#[test]
fn duplicate_stage_names() {
    check(
        "stages:\n  - {name: a, kind: shell, run: x}\n  - {name: a, kind: shell, run: y}\n",
        "r.yaml:3:5",
        "stage name `a` is used twice (also at r.yaml:2:5)",
    );
}

#[test]
fn cycles_are_named() {
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        "stages:\n  - {name: a, kind: shell, run: x, needs: [c]}\n  - {name: b, kind: shell, run: y, needs: [a]}\n  - {name: c, kind: shell, run: z, needs: [b]}\n",
    );
    let out = sb.zflow(&["plan", "r.yaml"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("cycle: a -> b -> c -> a"),
        "{}",
        out.stderr
    );
}

#[test]
fn unknown_var_and_escape_hint() {
    check(
        "stages:\n  - name: a\n    kind: shell\n    run: echo ${HOME}\n",
        "r.yaml:4:10",
        "unknown var `${HOME}`",
    );
}

#[test]
fn bad_config_values_name_the_field() {
    check(
        "stages:\n  - {name: a, kind: fetch, url: 'x', sha256: abc}\n",
        "r.yaml:2:46",
        "`abc` is not a sha256",
    );
    check(
        "stages:\n  - {name: a, kind: fetch, url: 'pip://six/x'}\n",
        "r.yaml:2:33",
        "pinned version",
    );
    check(
        "stages:\n  - {name: 'a b', kind: shell, run: x}\n",
        "r.yaml:2:12",
        "not a valid stage name",
    );
}

#[test]
fn extends_errors_point_at_the_extends_line() {
    check(
        "extends: missing.yaml\nstages: []\n",
        "r.yaml:1:10",
        "cannot read recipe",
    );
    let sb = Sandbox::new();
    sb.write("a.yaml", "extends: b.yaml\n");
    sb.write("b.yaml", "extends: a.yaml\n");
    let err = plan_error(&sb, "a.yaml", &[]);
    assert!(err.contains("cycle"), "{err}");
}

#[test]
fn errors_in_a_parent_recipe_point_into_the_parent() {
    let sb = Sandbox::new();
    sb.write(
        "base.yaml",
        "stages:\n  - name: a\n    kind: shell\n    run: x\n    cpus: 2\n",
    );
    sb.write(
        "child.yaml",
        "extends: base.yaml\nstages:\n  - name: a\n    run: y\n",
    );
    let err = plan_error(&sb, "child.yaml", &[]);
    assert!(err.contains("base.yaml:5:5"), "{err}");
}

#[test]
fn set_errors_name_the_override() {
    let sb = Sandbox::new();
    sb.write("r.yaml", "stages:\n  - {name: a, kind: shell, run: x}\n");
    let err = plan_error(&sb, "r.yaml", &["--set", "stages.b.run=1"]);
    assert!(
        err.contains("--set stages.b.run=1") && err.contains("no entry named `b`"),
        "{err}"
    );
    let err = plan_error(&sb, "r.yaml", &["--set", "noequals"]);
    assert!(err.contains("expected `path.to.key=value`"), "{err}");
    let err = plan_error(&sb, "r.yaml", &["--set", "stages.a.run=[1]"]);
    assert!(
        err.contains("--set stages.a.run=[1]") && err.contains("invalid type"),
        "{err}"
    );
}

#[test]
fn extends_merges_key_by_key() {
    let sb = Sandbox::new();
    sb.write("base.yaml", "vars: {word: base}\nstages:\n  - {name: a, kind: shell, run: 'echo ${word} > $ZFLOW_OUT/a'}\n  - {name: b, kind: shell, run: 'echo b > $ZFLOW_OUT/b'}\n");
    sb.write("child.yaml", "extends: base.yaml\nvars: {word: child}\nstages:\n  - {name: c, kind: shell, run: 'echo c > $ZFLOW_OUT/c', needs: [a]}\n");
    let plan = sb.ok(&["plan", "child.yaml"]);
    assert!(plan.stdout.contains("3 stages"), "{}", plan.stdout);
    sb.ok(&["run", "child.yaml"]);
    let out = sb.ok(&[
        "query",
        "zflow-store",
        "SELECT stage FROM stages ORDER BY stage",
    ]);
    assert!(
        out.stdout.contains("| a ") && out.stdout.contains("| c "),
        "{}",
        out.stdout
    );
    let a_dir = std::fs::read_dir(sb.path().join("zflow-store"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("a-"))
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(a_dir.path().join("a"))
            .unwrap()
            .trim(),
        "child"
    );
}

#[test]
fn export_section_errors_point_at_the_key() {
    check(
        "export:\n  format: onnx\n",
        "r.yaml:2:11",
        "`onnx` is not an export format",
    );
    check(
        "model: {}\nexport: {format: hf}\n",
        "r.yaml:2:",
        "no `phases:`",
    );
}

/// Every shipped recipe loads, validates and plans (stage configs included), so a recipe and
/// the stage kinds it uses cannot drift apart unnoticed.
#[test]
fn shipped_recipes_plan() {
    let sb = Sandbox::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/recipes");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let out = sb.zflow(&["plan", path.to_str().unwrap(), "--store", "store"]);
            // zaya1.yaml's corpora are local paths on the cluster: those may be missing here.
            let errors = out
                .stdout
                .lines()
                .filter(|l| l.trim_start().starts_with("error") && !l.contains("matches no files"));
            assert!(
                out.code == 0 && errors.count() == 0,
                "{}:\n{}{}",
                path.display(),
                out.stdout,
                out.stderr
            );
            n += 1;
        }
    }
    assert!(n >= 4, "{n} recipes");
}

#[test]
fn stages_whose_input_variables_collide_are_named_together() {
    // `a-b` and `a.b` would both be `$ZFLOW_IN_A_B` in a stage that needs them.
    check(
        "stages:\n  - {name: a-b, kind: shell, run: x}\n  - {name: a.b, kind: shell, run: x}\n  - {name: c, kind: shell, needs: [a-b, a.b], run: x}\n",
        "r.yaml:3:5",
        "stages `a.b` and `a-b` (at r.yaml:2:5) both reach their dependents as `$ZFLOW_IN_A_B`; rename one",
    );
}

#[test]
fn a_stage_name_too_long_for_a_file_name_is_refused_at_load() {
    let name = "s".repeat(300);
    check(
        &format!("stages:\n  - {{name: {name}, kind: shell, run: x}}\n"),
        "r.yaml:2:",
        "at most 200 characters",
    );
}

#[test]
fn phase_values_out_of_range_are_named_at_load() {
    let recipe = |phase: &str| {
        format!(
            "sources:\n  a: {{url: data.txt, format: text}}\ntokenizer: {{train: {{vocab_size: 320}}}}\nphases:\n  p1:\n{phase}"
        )
    };
    let ok = "    tokens: 1000\n    seq_len: 64\n    mixture: {a: 1.0}\n";
    for (phase, loc, msg) in [
        (
            "    tokens: 0\n    seq_len: 64\n    mixture: {a: 1.0}\n",
            "r.yaml:6:13",
            "`tokens` must be > 0 (the tokens the phase trains on), got 0",
        ),
        (
            "    tokens: 1000\n    seq_len: 0\n    mixture: {a: 1.0}\n",
            "r.yaml:7:14",
            "`seq_len` must be > 0",
        ),
        (
            "    tokens: 1000\n    seq_len: 64\n    mixture: {a: 0.0}\n",
            "r.yaml:8:14",
            "every weight of the mixture is zero",
        ),
        (
            "    tokens: 1000\n    seq_len: 64\n    mixture: {a: -1.0}\n",
            "r.yaml:8:18",
            "a mixture weight must be a finite number >= 0, got -1",
        ),
        (
            &format!("{ok}    curriculum: [{{at: 1.5, mixture: {{a: 1.0}}}}]\n"),
            "r.yaml:9:23",
            "after 0 and below 1, got 1.5",
        ),
        (
            &format!("{ok}    max_epochs: {{a: 0}}\n"),
            "r.yaml:9:21",
            "`max_epochs` must be a finite number > 0, got 0",
        ),
    ] {
        check(&recipe(phase), loc, msg);
    }
}

#[test]
fn a_recipe_that_is_not_a_regular_file_is_refused() {
    check(
        "extends: /dev/zero\nstages:\n  - {name: a, kind: shell, run: x}\n",
        "r.yaml:1:10",
        "recipe `/dev/zero` is not a regular file",
    );
}

#[test]
fn vars_that_grow_exponentially_are_refused() {
    // Each var repeats the one before ten times: `g` would be 10 MB.
    let mut vars = String::from("vars:\n  a: xxxxxxxxxx\n");
    for (prev, name) in ["a", "b", "c", "d", "e", "f"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g"])
    {
        vars.push_str(&format!(
            "  {name}: \"{}\"\n",
            format!("${{{prev}}}").repeat(10)
        ));
    }
    check(
        &format!("{vars}stages:\n  - {{name: a, kind: shell, run: \"echo ${{g}}\"}}\n"),
        "r.yaml:",
        "grow exponentially",
    );
}

#[test]
fn sizes_and_counts_out_of_range_are_named_at_load() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &common::tiny_train_recipe(1, 0));
    for (set, field, msg) in [
        (
            "model.vocab_size=1",
            "model.vocab_size",
            "`vocab_size` must be at least 2",
        ),
        (
            "model.vocab_size=300",
            "model.vocab_size",
            "smaller than the tokenizer's",
        ),
        (
            "model.num_blocks=100000000",
            "model.num_blocks",
            "`num_blocks` must be at most 4096, got 100000000",
        ),
        (
            "model={hidden_size: 1048576, expert_ffn: 1048576, vocab_size: 512}",
            "model",
            "zflow refuses more than 1e13",
        ),
        ("model={}", "model", "`model` is empty"),
        (
            "train.checkpoint_every=0",
            "train.checkpoint_every",
            "`checkpoint_every` must be at least 1",
        ),
        (
            "train.keep_checkpoints=0",
            "train.keep_checkpoints",
            "`keep_checkpoints` must be at least 1",
        ),
    ] {
        let err = plan_error(&sb, "r.yaml", &["--set", set]);
        // Located at the value: the override's own text when --set gave it.
        assert!(
            err.contains(msg)
                && (err.contains("r.yaml:") || err.contains(&format!("--set {set}:"))),
            "--set {set}: expected a location and `{msg}` in:\n{err}"
        );
        assert!(err.contains(field), "--set {set}: `{field}` in:\n{err}");
    }
    assert!(
        !sb.path().join("zflow-store").exists(),
        "a bad recipe must not create the store"
    );
}
