use super::*;

// ---- loading ----

const GOOD: &str = "\
model: Test-1B
params: {total_b: 1.0, active_b: 0.5}
source: https://example.org/card
scores:
  - {task: hellaswag, metric: acc_norm, num_fewshot: 10, value: 72.99}
  - task: mmlu
    metric: acc
    num_fewshot: 5
    value: 40.0
    source: https://example.org/paper#table-2
    note: own source
";

fn err(text: &str) -> String {
    format!("{:#}", parse_baseline(text, "bad.yaml").unwrap_err())
}

#[test]
fn report_parses_a_baseline() {
    let b = parse_baseline(GOOD, "good.yaml").unwrap();
    assert_eq!(b.model, "Test-1B");
    assert_eq!(b.params.active_b, 0.5);
    let s = b.scores();
    assert_eq!(s.len(), 2);
    assert_eq!(
        s[0].value, 0.7299,
        "percent -> fraction without rounding noise"
    );
    assert_eq!(s[0].source.as_deref(), Some("https://example.org/card"));
    assert_eq!(
        s[1].source.as_deref(),
        Some("https://example.org/paper#table-2")
    );
    assert_eq!(s[1].note.as_deref(), Some("own source"));
    assert_eq!(
        b.sources(),
        vec![
            "https://example.org/card",
            "https://example.org/paper#table-2"
        ]
    );
}

#[test]
fn report_unknown_top_level_field_names_file_line_and_field() {
    let e = err(
        "model: X\nparams: {total_b: 1.0, active_b: 1.0}\nsorce: https://example.org\nscores: []\n",
    );
    assert!(
        e.starts_with("bad.yaml:3:1: `sorce`: unknown field `sorce`"),
        "{e}"
    );
    assert!(!e.contains("at line"), "{e}");
}

#[test]
fn report_unknown_nested_field_names_path_and_field() {
    let text = GOOD.replace("    note: own source", "    nte: own source");
    let e = err(&text);
    assert_eq!(
        e,
        "bad.yaml:11:5: `scores[1].nte`: unknown field `nte`, expected one of task, metric, \
         num_fewshot, value, source, note"
    );
}

#[test]
fn report_wrong_type_names_the_field() {
    let text = GOOD.replace("num_fewshot: 5", "num_fewshot: five");
    let e = err(&text);
    assert!(e.starts_with("bad.yaml:8:"), "{e}");
    assert!(e.contains("scores[1].num_fewshot"), "{e}");
}

#[test]
fn report_checks_sources_tasks_values() {
    let no_source = GOOD.replace("source: https://example.org/card\n", "");
    assert!(
        err(&no_source).contains("`scores[0]`: no `source`"),
        "{}",
        err(&no_source)
    );

    let http = GOOD.replace("https://example.org/card", "http://example.org/card");
    let e = err(&http);
    assert!(
        e.contains("`source`") && e.contains("not an https URL"),
        "{e}"
    );

    let task = GOOD.replace("task: mmlu", "task: mmlu_pro");
    assert!(
        err(&task).contains("`scores[1].task`: unknown task `mmlu_pro`"),
        "{}",
        err(&task)
    );

    let value = GOOD.replace("value: 40.0", "value: 0.4e3");
    assert!(err(&value).contains("not a percentage"), "{}", err(&value));

    let dup = GOOD.replace("task: mmlu", "task: hellaswag");
    assert!(
        err(&dup).contains("a second score for `hellaswag`"),
        "{}",
        err(&dup)
    );

    let params = GOOD.replace("active_b: 0.5", "active_b: 2.0");
    assert!(
        err(&params).contains("`params.active_b`"),
        "{}",
        err(&params)
    );
}

#[test]
fn report_load_baseline_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, GOOD.replace("metric: acc\n", "metrc: acc\n")).unwrap();
    let e = format!("{:#}", load_baseline(&path).unwrap_err());
    assert!(e.starts_with(&format!("{}:", path.display())), "{e}");
    assert!(e.contains("metrc"), "{e}");

    let e = format!("{:#}", load_baselines(dir.path()).unwrap_err());
    assert!(e.contains("broken.yaml") && e.contains("metrc"), "{e}");

    std::fs::write(&path, GOOD).unwrap();
    std::fs::write(dir.path().join("again.yaml"), GOOD).unwrap();
    let e = format!("{:#}", load_baselines(dir.path()).unwrap_err());
    assert!(e.contains("model `Test-1B` is already defined in"), "{e}");
}

#[test]
fn report_every_shipped_baseline_loads_with_https_sources() {
    let all = load_baselines(&shipped_baselines_dir()).unwrap();
    let names: Vec<&str> = all.iter().map(|b| b.model.as_str()).collect();
    assert_eq!(
        names,
        [
            "Gemma-3-12B-PT",
            "Gemma-3-270M-PT",
            "Llama-3-8B",
            "OLMoE-1B-7B-0924",
            "Qwen3-4B-Base",
            "ZAYA1-base"
        ]
    );
    for b in &all {
        assert!(!b.sources().is_empty(), "{}: no source", b.model);
        for s in b.sources() {
            assert!(s.starts_with("https://"), "{}: {s}", b.model);
        }
        for (i, s) in b.scores().iter().enumerate() {
            let src = s
                .source
                .as_deref()
                .unwrap_or_else(|| panic!("{} score {i}: no source", b.model));
            assert!(src.starts_with("https://"), "{}: {src}", b.model);
            assert!(KNOWN_TASKS.contains(&s.task.as_str()));
            assert!((0.0..=1.0).contains(&s.value));
        }
    }
    // The whole set renders.
    let scores: Vec<TaskScore> = all.iter().flat_map(|b| b.scores()).collect();
    let t = Table::from_scores(&scores, &TableSpec::tasks(KNOWN_TASKS)).unwrap();
    assert_eq!(
        t.rows.len(),
        5,
        "ZAYA1-base has no verified numbers, so no row"
    );
    assert!(t.rows.iter().all(|r| r.published));
}

// ---- the table ----

fn small() -> Vec<TaskScore> {
    vec![
        TaskScore::new("Gemma_3 & Co", "hellaswag", "acc", 10, 0.409)
            .with_source("https://example.org/card_3#pt"),
        TaskScore::new("nano/phase10", "hellaswag", "acc_norm", 0, 0.35).with_stderr(0.005),
        TaskScore::new("nano/phase2", "hellaswag", "acc_norm", 0, 0.301)
            .with_stderr(0.0046)
            .with_version("1.0")
            .with_config_hash("abc"),
        TaskScore::new("nano/phase2", "arc_easy", "acc", 0, 0.55).with_stderr(0.0102),
        TaskScore::new("Gemma_3 & Co", "arc_easy", "acc", 0, 0.577)
            .with_source("https://example.org/card_3#pt"),
    ]
}

fn small_table() -> Table {
    Table::from_scores(
        &small(),
        &TableSpec::tasks(&["arc_easy", "hellaswag", "mmlu"]),
    )
    .unwrap()
}

#[test]
fn report_table_model() {
    let t = small_table();
    let cols: Vec<(&str, &str, u32)> = t
        .columns
        .iter()
        .map(|c| (c.task.as_str(), c.metric.as_str(), c.num_fewshot))
        .collect();
    assert_eq!(cols, [("arc_easy", "acc", 0), ("hellaswag", "acc_norm", 0)]);
    let rows: Vec<(&str, bool)> = t
        .rows
        .iter()
        .map(|r| (r.model.as_str(), r.published))
        .collect();
    assert_eq!(
        rows,
        [
            ("nano/phase2", false),
            ("nano/phase10", false),
            ("Gemma_3 & Co", true)
        ]
    );
    assert!(t.rows[1].cells[0].is_none());
    assert!(
        t.rows[2].cells[1]
            .as_ref()
            .unwrap()
            .differs_from(&t.columns[1])
    );
    // Input order does not matter.
    let mut rev = small();
    rev.reverse();
    assert_eq!(
        Table::from_scores(&rev, &TableSpec::tasks(&["arc_easy", "hellaswag"])).unwrap(),
        t
    );
}

#[test]
fn report_markdown() {
    let expected = "\
| Model | arc_easy (acc, 0-shot) | hellaswag (acc_norm, 0-shot) |
| --- | ---: | ---: |
| nano/phase2 | 55.0 ± 1.0 | 30.1 ± 0.5 |
| nano/phase10 | — | 35.0 ± 0.5 |
| Gemma_3 & Co [1] | 57.7 | 40.9 (acc, 10-shot) |

A value followed by (metric, n-shot) was measured with that setting, not the column's.

Sources:

- [1] Gemma_3 & Co: https://example.org/card_3#pt
";
    assert_eq!(small_table().to_markdown(), expected);
}

#[test]
fn report_csv() {
    let expected = "\
model,\"arc_easy (acc, 0-shot)\",arc_easy stderr,\"hellaswag (acc_norm, 0-shot)\",hellaswag stderr,hellaswag setting,sources\r
nano/phase2,55.0,1.0,30.1,0.5,,\r
nano/phase10,,,35.0,0.5,,\r
Gemma_3 & Co,57.7,,40.9,,\"acc, 10-shot\",https://example.org/card_3#pt\r
";
    assert_eq!(small_table().to_csv(), expected);
}

#[test]
fn report_latex() {
    let expected = r"\begin{tabular}{lrr}
\toprule
Model & arc\_easy & hellaswag \\
 & acc, 0-shot & acc\_norm, 0-shot \\
\midrule
nano/phase2 & 55.0 $\pm$ 1.0 & 30.1 $\pm$ 0.5 \\
nano/phase10 & --- & 35.0 $\pm$ 0.5 \\
\midrule
Gemma\_3 \& Co\textsuperscript{1} & 57.7 & 40.9 (acc, 10-shot) \\
\bottomrule
\end{tabular}

\par\smallskip
{\footnotesize
A value followed by (metric, n-shot) was measured with that setting, not the column's.\\
\textsuperscript{1}Gemma\_3 \& Co: \texttt{https://example.org/card\_3\#pt}\par}
";
    assert_eq!(small_table().to_latex(), expected);
}

#[test]
fn report_json() {
    let expected = r#"{
  "columns": [
    {
      "task": "arc_easy",
      "metric": "acc",
      "n-shot": 0
    },
    {
      "task": "hellaswag",
      "metric": "acc_norm",
      "n-shot": 0
    }
  ],
  "models": {
    "nano/phase2": {
      "published": false,
      "results": {
        "arc_easy": {
          "acc,none": 0.55,
          "acc_stderr,none": 0.0102
        },
        "hellaswag": {
          "acc_norm,none": 0.301,
          "acc_norm_stderr,none": 0.0046
        }
      },
      "versions": {
        "hellaswag": "1.0"
      },
      "n-shot": {
        "arc_easy": 0,
        "hellaswag": 0
      },
      "config_hashes": {
        "hellaswag": "abc"
      }
    },
    "nano/phase10": {
      "published": false,
      "results": {
        "hellaswag": {
          "acc_norm,none": 0.35,
          "acc_norm_stderr,none": 0.005
        }
      },
      "versions": {},
      "n-shot": {
        "hellaswag": 0
      }
    },
    "Gemma_3 & Co": {
      "published": true,
      "results": {
        "arc_easy": {
          "acc,none": 0.577
        },
        "hellaswag": {
          "acc,none": 0.409
        }
      },
      "versions": {},
      "n-shot": {
        "arc_easy": 0,
        "hellaswag": 10
      },
      "sources": {
        "arc_easy": "https://example.org/card_3#pt",
        "hellaswag": "https://example.org/card_3#pt"
      }
    }
  }
}
"#;
    assert_eq!(small_table().to_json(), expected);
}

#[test]
fn report_no_notes_without_published_rows() {
    let scores = vec![TaskScore::new("a", "piqa", "acc", 0, 0.5)];
    let t = Table::from_scores(&scores, &TableSpec::default()).unwrap();
    assert_eq!(
        t.to_markdown(),
        "| Model | piqa (acc, 0-shot) |\n| --- | ---: |\n| a | 50.0 |\n"
    );
    assert!(!t.to_latex().contains("footnotesize"));
}

#[test]
fn report_column_choice() {
    let scores = vec![
        TaskScore::new("m", "hellaswag", "acc", 0, 0.40),
        TaskScore::new("m", "hellaswag", "acc_norm", 0, 0.45),
        TaskScore::new("m", "winogrande", "acc", 5, 0.6),
        TaskScore::new("m", "winogrande", "acc", 0, 0.55),
        TaskScore::new("m", "boolq", "acc", 0, 0.7),
    ];
    // Unlisted tasks follow the listed ones, by name; acc_norm beats acc; fewest shots first.
    let t = Table::from_scores(&scores, &TableSpec::tasks(&["winogrande"])).unwrap();
    let cols: Vec<(&str, &str, u32)> = t
        .columns
        .iter()
        .map(|c| (c.task.as_str(), c.metric.as_str(), c.num_fewshot))
        .collect();
    assert_eq!(
        cols,
        [
            ("winogrande", "acc", 0),
            ("boolq", "acc", 0),
            ("hellaswag", "acc_norm", 0)
        ]
    );
    // A spec metric / n-shot wins.
    let spec = TableSpec {
        columns: vec![
            ColumnSpec::new("hellaswag").metric("acc"),
            ColumnSpec::new("winogrande").fewshot(5),
        ],
    };
    let t = Table::from_scores(&scores, &spec).unwrap();
    assert_eq!(t.rows[0].cells[0].as_ref().unwrap().value, 0.40);
    assert_eq!(t.rows[0].cells[1].as_ref().unwrap().value, 0.6);
    assert!(!t.has_differing_cells());
}

#[test]
fn report_rejects_duplicates_and_non_finite() {
    let dup = vec![
        TaskScore::new("m", "piqa", "acc", 0, 0.5),
        TaskScore::new("m", "piqa", "acc", 0, 0.6),
    ];
    let e = Table::from_scores(&dup, &TableSpec::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("two scores of `m` on `piqa`"), "{e}");
    let nan = vec![TaskScore::new("m", "piqa", "acc", 0, f64::NAN)];
    assert!(Table::from_scores(&nan, &TableSpec::default()).is_err());
}

#[test]
fn report_latex_escaping() {
    assert_eq!(
        latex_escape(r"a_b & 50% $x$ #1 {y} ~z ^w \cmd <>|"),
        r"a\_b \& 50\% \$x\$ \#1 \{y\} \textasciitilde{}z \textasciicircum{}w \textbackslash{}cmd \textless{}\textgreater{}\textbar{}"
    );
    let t = Table::from_scores(
        &[TaskScore::new("run_1 (50%)", "piqa", "acc", 0, 0.5)],
        &TableSpec::default(),
    )
    .unwrap();
    assert!(
        t.to_latex().contains(r"run\_1 (50\%) & 50.0 \\"),
        "{}",
        t.to_latex()
    );
}

#[test]
fn report_markdown_and_csv_escaping() {
    let t = Table::from_scores(
        &[TaskScore::new("a|b \"c\", d", "piqa", "acc", 0, 0.5)],
        &TableSpec::default(),
    )
    .unwrap();
    assert!(t.to_markdown().contains(r"| a\|b "), "{}", t.to_markdown());
    assert!(
        t.to_csv().contains("\"a|b \"\"c\"\", d\",50.0"),
        "{}",
        t.to_csv()
    );
}

#[test]
fn report_natural_order() {
    use std::cmp::Ordering::*;
    assert_eq!(natural_cmp("nano/phase2", "nano/phase10"), Less);
    assert_eq!(natural_cmp("phase10", "phase9"), Greater);
    assert_eq!(natural_cmp("a", "a1"), Less);
    assert_eq!(natural_cmp("a01", "a1"), Less);
    assert_eq!(natural_cmp("b", "a9"), Greater);
    assert_eq!(natural_cmp("x", "x"), Equal);
}
