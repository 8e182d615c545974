//! The training runtime (the ZAYA1 model, optimizers, trainer, workers, checkpoints).
//!
//! Not built yet: this crate reserves its place in the workspace layout. It will depend on
//! burn and not on DataFusion, so the trainer builds without the query engine.
