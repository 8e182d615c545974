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

/// The high-level sections of a recipe (`sources:`, `phases:`, ...): the part of a recipe's
/// schema the engine does not own. One implementation parses all of its sections at once
/// into a typed document, checks them against each other, and expands them into stage nodes,
/// so a value read by several sections is parsed in one place.
pub trait Sections: Send + Sync {
    /// The top-level keys it owns.
    fn keys(&self) -> &'static [&'static str];
    /// Parses the owned sections of `recipe` (the whole composed recipe, as JSON) and expands
    /// them into nodes, in the order they should be listed. Errors carry a recipe path.
    fn expand(&self, recipe: &serde_json::Value) -> Result<Vec<NodeSpec>, ConfigError>;
}

/// Stage kinds and sections known to this build of zflow.
#[derive(Default, Clone)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Arc<dyn ErasedKind>>,
    sections: Option<Arc<dyn Sections>>,
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

    /// Sets the recipe sections (one set per build: a second call replaces the first).
    pub fn set_sections(&mut self, sections: impl Sections + 'static) -> &mut Self {
        self.sections = Some(Arc::new(sections));
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

    /// The recipe sections, if any were set.
    pub fn sections(&self) -> Option<&Arc<dyn Sections>> {
        self.sections.as_ref()
    }
}
