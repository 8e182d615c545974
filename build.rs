//! Marks the integration tests that need what `scripts/test.sh` sets up:
//! - `zflow_slurm`: the local Slurm daemons (`tests/slurm.rs`), when `SLURM_CONF` is set;
//! - `zflow_eval_fixtures`: the real benchmark data (`tests/eval.rs`), when `ZFLOW_EVAL_DATA` is set;
//! - `zflow_torch`: the torch engine's Python environment (torch, transformers), when
//!   `ZFLOW_TORCH_PYTHON` names it (`scripts/test.sh` sets it to what `scripts/setup.sh` made);
//! - `zflow_browser`: Chromium and its ChromeDriver (`tests/ui.rs`), when `ZFLOW_CHROMEDRIVER`
//!   names the driver (`scripts/test.sh` sets it from `scripts/browser.sh`).
//!
//! Under CI (`CI` set) all are always on, so a missing service or fixture fails its tests;
//! anywhere else the test runner lists those tests as ignored, never as passed.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let set =
        |var: &str| std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    println!("cargo::rerun-if-env-changed=CI");
    let ci = set("CI");
    for (cfg, var) in [
        ("zflow_slurm", "SLURM_CONF"),
        ("zflow_eval_fixtures", "ZFLOW_EVAL_DATA"),
        ("zflow_torch", "ZFLOW_TORCH_PYTHON"),
        ("zflow_browser", "ZFLOW_CHROMEDRIVER"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        // Under CI the cfg does not depend on the variable, so a variable the test command
        // sets only once its set-up is done (the browser's) does not rebuild what it built
        // while the set-up ran.
        if !ci {
            println!("cargo::rerun-if-env-changed={var}");
        }
        if ci || set(var) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
