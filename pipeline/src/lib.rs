//! zflow's engine: recipes, the stage graph, identities, the content-addressed store, the
//! scheduler and run records. It knows nothing of machine learning: stage kinds come from the
//! `zflow-stages` crate through a [`Registry`].
//!
//! The life of a `zflow run`: [`recipe::load`] the YAML (extends, --set, vars, typed
//! configs) -> [`Engine::open`] builds the [`graph::StageGraph`] and opens the [`store::Store`]
//! -> [`run::run`] walks the graph, computing each stage's [`identity`] from its config and its
//! inputs' content, reusing complete outputs and running the rest under a [`lease`].

#![warn(missing_docs)]

pub mod gc;
pub mod graph;
pub mod identity;
pub mod launch_plan;
pub mod lease;
pub mod logging;
pub mod plan;
pub mod progress;
pub mod recipe;
pub mod records;
pub mod registry;
pub mod run;
pub mod seal;
pub mod slurm;
pub mod stage;
pub mod status;
pub mod store;
pub mod supervise;

pub use plan::{Engine, Reason, StageState};
pub use recipe::{LoadOptions, Recipe, RecipeError};
pub use registry::{NodeSpec, Registry, Sections};
pub use stage::{CancelToken, ConfigError, FileFilter, Resources, Stage, StageContext};
