//! The registry of stage kinds and recipe sections.
//!
//! The engine knows no kind by name: the `stages` crate registers them (`fetch`, `shell`, ...)
//! and the high-level recipe sections (`sources`, `phases`, ...) that expand into stage nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::stage::{ConfigError, ErasedKind, KindAdapter, Stage};

/// A stage node produced by a recipe section: the same shape as a `stages:` entry.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Stage name, unique in the recipe (`fetch.web`).
    pub name: String,
    /// Stage kind (`fetch`).
    pub kind: String,
    /// The kind's config.
    pub config: serde_json::Value,
    /// Input stages.
    pub needs: Vec<String>,
    /// Resources overriding the kind's defaults.
    pub resources: Option<crate::Resources>,
    /// Recipe path the node comes from (`sources.web`), for error locations.
    pub path: String,
}

/// A top-level recipe section (e.g. `sources:`) that expands into stage nodes.
pub trait Section: Send + Sync {
    /// The top-level key.
    fn key(&self) -> &'static str;
    /// Expands the section's value into nodes. `recipe` is the whole recipe (as JSON) for
    /// sections that read others (`phases` reads `sources`). Errors carry a recipe path.
    fn expand(
        &self,
        value: &serde_json::Value,
        recipe: &serde_json::Value,
    ) -> Result<Vec<NodeSpec>, ConfigError>;
}

/// Stage kinds and sections known to this build of zflow.
#[derive(Default, Clone)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Arc<dyn ErasedKind>>,
    sections: Vec<Arc<dyn Section>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a stage kind. Panics if the kind name is taken (a programming error).
    pub fn register<S: Stage>(&mut self, stage: S) -> &mut Self {
        let prev = self
            .kinds
            .insert(S::KIND, Arc::new(KindAdapter(Arc::new(stage))));
        assert!(prev.is_none(), "stage kind `{}` registered twice", S::KIND);
        self
    }

    /// Registers a top-level recipe section.
    pub fn register_section(&mut self, section: impl Section + 'static) -> &mut Self {
        self.sections.push(Arc::new(section));
        self
    }

    /// The kind named `name`.
    pub fn kind(&self, name: &str) -> Option<&Arc<dyn ErasedKind>> {
        self.kinds.get(name)
    }

    /// All kind names, sorted.
    pub fn kind_names(&self) -> Vec<&'static str> {
        self.kinds.keys().copied().collect()
    }

    /// Registered sections in registration order (the order they expand in).
    pub fn sections(&self) -> &[Arc<dyn Section>] {
        &self.sections
    }
}
