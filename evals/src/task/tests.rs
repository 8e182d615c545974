use super::*;
use crate::dataset::DatasetFormat;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const PIQA: &str = "task: piqa\nversion: 1\ndataset: {format: arrow_stream, path: 'p/{split}/x.arrow'}\n\
    split: validation\noutput_type: multiple_choice\ndoc_to_text: \"Question: {{goal}}\\nAnswer:\"\n\
    doc_to_target: label\ndoc_to_choice: \"{{[sol1, sol2]}}\"\nmetrics: [acc, acc_norm]\n";

#[test]
fn builtin_tasks_load() {
    let reg = TaskRegistry::load_dir(&builtin_tasks_dir()).unwrap();
    for t in [
        "hellaswag",
        "arc_easy",
        "arc_challenge",
        "piqa",
        "winogrande",
        "boolq",
    ] {
        assert!(reg.tasks.contains_key(t), "{t}");
    }
    for t in [
        "openbookqa",
        "sciq",
        "gsm8k_cot",
        "humaneval",
        "mbpp",
        "lambada",
    ] {
        assert!(reg.tasks.contains_key(t), "{t}");
    }
    let mmlu = reg.tasks_of("mmlu").unwrap();
    assert_eq!(mmlu.len(), 57);
    assert!(reg.groups.contains_key("mmlu_stem"));
    let anatomy = &reg.tasks["mmlu_anatomy"].spec;
    assert_eq!(anatomy.num_fewshot, 5);
    assert!(
        anatomy.dataset.path.contains("anatomy"),
        "{}",
        anatomy.dataset.path
    );
}

#[test]
fn unknown_field_names_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t.yaml",
        &format!("{PIQA}generation: {{untill: [x]}}\n"),
    );
    let err = TaskRegistry::default()
        .add_file(&f)
        .unwrap_err()
        .to_string();
    assert!(err.contains("t.yaml"), "{err}");
    assert!(err.contains("generation"), "{err}");
    assert!(err.contains("untill"), "{err}");
    let f = write(dir.path(), "u.yaml", &format!("{PIQA}num_fewshots: 3\n"));
    let err = TaskRegistry::default()
        .add_file(&f)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("u.yaml") && err.contains("num_fewshots"),
        "{err}"
    );
}

#[test]
fn bad_combinations_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t.yaml",
        &PIQA.replace("[acc, acc_norm]", "[exact_match]"),
    );
    let err = format!("{:#}", TaskRegistry::default().add_file(&f).unwrap_err());
    assert!(
        err.contains("t.yaml") && err.contains("exact_match"),
        "{err}"
    );
    let f = write(dir.path(), "v.yaml", &format!("{PIQA}num_fewshot: 5\n"));
    let err = format!("{:#}", TaskRegistry::default().add_file(&f).unwrap_err());
    assert!(err.contains("fewshot_split"), "{err}");
}

/// A generation task in the shape of minerva_math's.
const MATH: &str = "task: m\nversion: 1\ndataset: {format: jsonl, path: 'm.jsonl'}\nsplit: test\n\
    output_type: generate_until\ndoc_to_text: \"{{problem}}\"\ndoc_to_target: answer\n\
    generation: {until: [\"Problem:\"]}\n";

#[test]
fn math_verify_needs_its_gold_and_the_gold_its_metric() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write(
        dir.path(),
        "ok.yaml",
        &format!(
            "{MATH}metrics: [exact_match, math_verify]\nmath_verify: {{gold: \"{{{{solution}}}}\"}}\n"
        ),
    );
    let mut reg = TaskRegistry::default();
    reg.add_file(&ok).unwrap();
    let gold = reg.tasks["m"]
        .spec
        .math_verify
        .as_ref()
        .map(|m| m.gold.as_str());
    assert_eq!(gold, Some("{{solution}}"));
    for (name, text) in [
        ("no_gold.yaml", format!("{MATH}metrics: [math_verify]\n")),
        (
            "no_metric.yaml",
            format!("{MATH}metrics: [exact_match]\nmath_verify: {{gold: x}}\n"),
        ),
    ] {
        let f = write(dir.path(), name, &text);
        let err = format!("{:#}", TaskRegistry::default().add_file(&f).unwrap_err());
        assert!(
            err.contains(name) && err.contains("`metrics`/`math_verify`"),
            "{err}"
        );
    }
}

#[test]
fn includes_merge_deeply_and_config_hash_ignores_formatting() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "_base.yaml",
        "version: 1\ndataset: {format: arrow_stream, path: 'x/{split}/d.arrow'}\nsplit: test\n\
         output_type: multiple_choice\ndoc_to_text: q\ndoc_to_target: answer\n\
         doc_to_choice: [A, B]\nmetrics: [acc]\n",
    );
    let a = write(
        dir.path(),
        "a.yaml",
        "include: _base.yaml\ntask: a\ndataset: {path: 'y/{split}/d.arrow'}\n",
    );
    let mut reg = TaskRegistry::default();
    reg.add_file(&a).unwrap();
    let spec = &reg.tasks["a"].spec;
    assert_eq!(spec.dataset.path, "y/{split}/d.arrow");
    assert_eq!(spec.dataset.format, DatasetFormat::ArrowStream);
    let h1 = reg.tasks["a"].config_hash.clone();
    let b = write(
        dir.path(),
        "b.yaml",
        "include: _base.yaml\n# a comment\ntask:   a\ndataset:\n  path: \"y/{split}/d.arrow\"\n",
    );
    let mut reg2 = TaskRegistry::default();
    reg2.add_file(&b).unwrap();
    assert_eq!(reg2.tasks["a"].config_hash, h1);
}

#[test]
fn groups_expand_and_cycles_fail() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.yaml", PIQA);
    write(
        dir.path(),
        "g.yaml",
        "group: g\ntasks: [h]\naggregate: {metrics: [acc]}\n",
    );
    write(
        dir.path(),
        "h.yaml",
        "group: h\ntasks: [piqa, g]\naggregate: {metrics: [acc]}\n",
    );
    let err = format!("{:#}", TaskRegistry::load_dir(dir.path()).unwrap_err());
    assert!(err.contains("contains itself"), "{err}");
    write(
        dir.path(),
        "h.yaml",
        "group: h\ntasks: [piqa]\naggregate: {metrics: [acc]}\n",
    );
    let reg = TaskRegistry::load_dir(dir.path()).unwrap();
    assert_eq!(reg.tasks_of("g").unwrap(), vec!["piqa".to_string()]);
    let err = reg.tasks_of("nope").unwrap_err().to_string();
    assert!(err.contains("unknown task or group `nope`"), "{err}");
}
