//! zflow's stage kinds and recipe sections, and [`registry`], which registers them all.
//!
//! Adding a kind: write `src/<kind>.rs` with a type implementing
//! [`zflow_pipeline::Stage`], then add one `.register(...)` line below.

pub mod fetch;
pub mod shell;
mod util;

use zflow_pipeline::Registry;

/// Every stage kind and section this build of zflow knows.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(fetch::Fetch).register(shell::Shell);
    r
}
