//! Property tests: the recipe loader never panics, whatever the YAML or the `--set`s, and
//! every error it returns has a location.

use std::path::Path;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use zflow_pipeline::{LoadOptions, Registry, Stage, StageContext, recipe};

struct Echo;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoConfig {
    run: String,
    #[serde(default)]
    times: Option<u32>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

impl Stage for Echo {
    type Config = EchoConfig;
    const KIND: &'static str = "echo";
    const VERSION: u32 = 1;
    fn run(&self, _config: &EchoConfig, _ctx: &StageContext) -> anyhow::Result<()> {
        Ok(())
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Echo);
    r
}

fn load(dir: &Path, text: &str, sets: Vec<String>) {
    let path = dir.join("r.yaml");
    std::fs::write(&path, text).unwrap();
    match recipe::load(&path, &LoadOptions { sets, store: None }, &registry()) {
        Ok(r) => assert!(r.nodes.iter().all(|n| !n.name.is_empty())),
        Err(e) => assert!(!e.message.is_empty()),
    }
}

/// YAML-ish fragments that exercise the loader's paths.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("name: x\n".to_string()),
        Just("vars: {a: 1, b: '${a}x'}\n".to_string()),
        Just("vars: {a: '${b}', b: '${a}'}\n".to_string()),
        Just("stages:\n  - {name: s, kind: echo, run: hi}\n".to_string()),
        Just("stages:\n  - {name: t, kind: echo, run: '${a}', needs: [s]}\n".to_string()),
        Just("stages:\n  - name: u\n    kind: echo\n    run: x\n    needs: [u]\n".to_string()),
        Just("extends: r.yaml\n".to_string()),
        Just("store: 3\n".to_string()),
        Just("executor: {kind: local}\n".to_string()),
        Just("executor: {kind: slurm}\n".to_string()),
        Just("stages: 7\n".to_string()),
        Just("stages: [1, [2], {a: b}]\n".to_string()),
        Just("? [a]\n: b\n".to_string()),
        Just("a: &x [1]\nb: *x\n".to_string()),
        Just("- a\n- b\n".to_string()),
        "[ -~\n]{0,40}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let dir = tempfile::tempdir().unwrap();
        load(dir.path(), &text, vec![]);
    }

    #[test]
    fn recipe_like_documents_never_panic(
        parts in prop::collection::vec(fragment(), 0..6),
        sets in prop::collection::vec("[a-z.0-9]{0,12}(=[ -~]{0,12})?", 0..3),
    ) {
        let dir = tempfile::tempdir().unwrap();
        load(dir.path(), &parts.concat(), sets);
    }
}
