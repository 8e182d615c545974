//! Packing a batch of request groups into one sequence of rows with prefix sharing (a
//! [`Packed`] batch, the GGUF forward pass's input).
//!
//! A group's requests share a prefix (the question): it is laid out once, followed by each
//! request's own remainder (a branch). Every row attends to the prefix rows at or before its
//! position and to the earlier rows of its own branch; branches restart their positions where
//! the prefix ends. So one forward pass computes the prefix's keys and values once and every
//! continuation reuses them, which is what a KV cache per question would give, with all of the
//! batch's rows going through each weight matrix in one matrix product.

use crate::engine::shared_prefix_len;
use crate::model::TokenRequest;
pub use zflow_gguf::batch::{Packed, Segment};

/// Packs groups (see the module docs).
pub fn pack(groups: &[Vec<TokenRequest>]) -> Packed {
    let mut p = Packed {
        tokens: vec![],
        positions: vec![],
        segments: vec![],
        targets: vec![],
    };
    for group in groups {
        let start = p.tokens.len();
        let shared = shared_prefix_len(group);
        let mut seg = Segment {
            start,
            branch: vec![],
            pos: vec![],
        };
        let full = |r: &TokenRequest| -> Vec<u32> {
            r.context.iter().chain(&r.continuation).copied().collect()
        };
        if let Some(first) = group.first() {
            for (i, &t) in full(first)[..shared].iter().enumerate() {
                p.tokens.push(t);
                p.positions.push(i as u32);
                seg.branch.push(0);
                seg.pos.push(i as u32);
            }
        }
        let mut targets = Vec::with_capacity(group.len());
        for (b, r) in group.iter().enumerate() {
            let seq = full(r);
            let inputs = r.input_len();
            let branch_start = p.tokens.len();
            for (i, &t) in seq[shared..inputs].iter().enumerate() {
                p.tokens.push(t);
                p.positions.push((shared + i) as u32);
                seg.branch.push(b as u32 + 1);
                seg.pos.push((shared + i) as u32);
            }
            let row_of = |q: usize| {
                if q < shared {
                    start + q
                } else {
                    branch_start + (q - shared)
                }
            };
            let first_scored = r.context.len() - 1;
            targets.push(
                (first_scored..inputs)
                    .map(|q| (row_of(q), seq[q + 1]))
                    .collect(),
            );
        }
        p.targets.push(targets);
        p.segments.push(seg);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(c: &[u32], k: &[u32]) -> TokenRequest {
        TokenRequest {
            context: c.to_vec(),
            continuation: k.to_vec(),
        }
    }

    #[test]
    fn choices_share_their_question() {
        // Context [1,2,3]; choices [4,5] and [6,7,8].
        let p = pack(&[vec![tr(&[1, 2, 3], &[4, 5]), tr(&[1, 2, 3], &[6, 7, 8])]]);
        assert_eq!(p.tokens, vec![1, 2, 3, 4, 6, 7]);
        assert_eq!(p.positions, vec![0, 1, 2, 3, 3, 4]);
        assert_eq!(p.segments[0].branch, vec![0, 0, 0, 1, 2, 2]);
        // Choice 1: row 2 predicts 4, row 3 predicts 5. Choice 2: row 2 -> 6, 4 -> 7, 5 -> 8.
        assert_eq!(
            p.targets[0],
            vec![vec![(2, 4), (3, 5)], vec![(2, 6), (4, 7), (5, 8)]]
        );
        let m = p.segments[0].mask(None);
        let allowed = |a: usize, b: usize| m[a * 6 + b] == 0.0;
        assert!(allowed(4, 2) && allowed(5, 4) && allowed(5, 0));
        assert!(!allowed(4, 3), "branches do not see each other");
        assert!(!allowed(2, 3), "causal");
    }

    #[test]
    fn several_groups_and_sliding_window() {
        let p = pack(&[vec![tr(&[9], &[1])], vec![tr(&[5, 6], &[7])]]);
        assert_eq!(p.tokens, vec![9, 5, 6]);
        assert_eq!(p.segments[1].start, 1);
        assert_eq!(p.targets, vec![vec![vec![(0, 1)]], vec![vec![(2, 7)]]]);
        let seg = Segment {
            start: 0,
            branch: vec![0; 4],
            pos: vec![0, 1, 2, 3],
        };
        let m = seg.mask(Some(2));
        assert_eq!(
            &m[12..16],
            &[f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0]
        );
    }

    #[test]
    fn a_windowed_mask_over_branches_of_different_lengths() {
        // Branch 1 runs to position 6 before branch 2 starts again at position 2: a row of
        // branch 2 comes after rows of branch 1 that are at later positions (this subtracted
        // past zero, which a debug build panics on and a release build wrapped).
        let p = pack(&[vec![tr(&[1, 2], &[3, 4, 5, 6, 7]), tr(&[1, 2], &[8, 9])]]);
        let seg = &p.segments[0];
        assert_eq!(seg.pos, vec![0, 1, 2, 3, 4, 5, 2]);
        let n = seg.len();
        let m = seg.mask(Some(2));
        let allowed = |a: usize, b: usize| m[a * n + b] == 0.0;
        // The last row (branch 2, position 2) sees itself and the prefix row at position 1.
        assert!(allowed(6, 6) && allowed(6, 1) && !allowed(6, 0));
        assert!(
            (2..6).all(|b| !allowed(6, b)),
            "branch 1 is not visible from branch 2"
        );
    }
}
