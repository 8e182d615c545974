//! The evaluation harness (tasks, prompt formatting, scoring, metrics, tables).
//!
//! Not built yet: this crate reserves its place in the workspace layout.
