//! A packed batch: request groups laid out as one sequence of rows with prefix sharing.
//!
//! A group's requests share a prefix (the question): it is laid out once, followed by each
//! request's own remainder (a branch). Every row attends to the prefix rows at or before its
//! position and to the earlier rows of its own branch; branches restart their positions where
//! the prefix ends. So one forward pass computes the prefix's keys and values once and every
//! continuation reuses them, which is what a KV cache per question would give, with all of the
//! batch's rows going through each weight matrix in one matrix product. The evaluator packs
//! its requests (`zflow_evals::gguf::pack`); [`crate::model::Model`] runs them.

/// The rows of one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// First row in the packed batch.
    pub start: usize,
    /// Per row: 0 for the shared prefix, b + 1 for request b's branch.
    pub branch: Vec<u32>,
    /// Per row: the position (for rotary embeddings and the sliding window).
    pub pos: Vec<u32>,
}

impl Segment {
    /// Rows in the segment.
    pub fn len(&self) -> usize {
        self.branch.len()
    }

    /// Whether the segment has no rows.
    pub fn is_empty(&self) -> bool {
        self.branch.is_empty()
    }

    /// The additive attention mask (`len x len`, row-major): 0 where row `a` may attend row
    /// `b`, -inf elsewhere; `window` limits how far back a row sees (Gemma's local layers).
    pub fn mask(&self, window: Option<usize>) -> Vec<f32> {
        let n = self.len();
        let mut m = vec![f32::NEG_INFINITY; n * n];
        for a in 0..n {
            for b in 0..=a {
                // Rows of other branches may sit at later positions: only a row of the same
                // line (the prefix or this branch, never after `a`'s position) is measured
                // against the window.
                let same_line = self.branch[b] == 0 || self.branch[b] == self.branch[a];
                if same_line && window.is_none_or(|w| self.pos[a] - self.pos[b] < w as u32) {
                    m[a * n + b] = 0.0;
                }
            }
        }
        m
    }
}

/// A packed batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// Token per row.
    pub tokens: Vec<u32>,
    /// Position per row.
    pub positions: Vec<u32>,
    /// One per group.
    pub segments: Vec<Segment>,
    /// Per group, per request: the (row, token) pairs to score: the row whose logits predict
    /// the token.
    pub targets: Vec<Vec<Vec<(usize, u32)>>>,
}
