//! ZeRO-1: the optimizer state sharded over the data-parallel ranks, and reshaping it.
//!
//! Every rank holds the whole model and the whole (all-reduced) gradient, but only its own
//! shard of the optimizer state: it updates the parameters it owns, then the ranks all-gather
//! the updated parameters. The shard unit is one parameter tensor, not a flat range of
//! elements, because Muon orthogonalises whole matrices (a matrix split over two ranks would
//! need its gradient gathered again). Ownership is a pure function of the parameter list and
//! the number of ranks ([`Layout::new`]): largest tensors first, each to the least-loaded rank.
//!
//! A checkpoint stores the layout in `layout.json` and one file per optimizer per rank,
//! `optim-muon.rank-R.bin` / `optim-adamw.rank-R.bin`, each a sequence of
//! `(parameter id u64 LE, length u64 LE, record bytes)` entries sorted by id, each record one
//! parameter's state ([`checkpoint::optimizer`]). Reshaping
//! ([`reshape`]) moves the entries to the files of their new owners; nothing else changes, so
//! the resumed run reads the same data in the same order.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::checkpoint;

/// The optimizers whose state is sharded.
pub const OPTIMIZERS: [&str; 2] = ["muon", "adamw"];

/// File name of optimizer `optimizer`'s shard on rank `rank`.
pub fn shard_file(optimizer: &str, rank: usize) -> String {
    format!("optim-{optimizer}.rank-{rank}.bin")
}

/// One parameter tensor and the rank that owns its optimizer state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// Module path (`blocks.0.moe.local_experts.3.linear_fc1.weight`).
    pub name: String,
    /// Parameter id (the worker derives it from the path; the key of the shard entries).
    pub id: u64,
    /// Elements.
    pub numel: usize,
    /// Owning data-parallel rank.
    pub owner: usize,
}

/// How a checkpoint's state is laid out over ranks (`layout.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// Data-parallel degree: optimizer shards. (Every rank holds every expert: ZAYA1 trained
    /// with data parallelism and ZeRO-1 only; layouts written with an `ep` field read the
    /// same.)
    pub dp: usize,
    /// Every parameter, in the model's visiting order.
    pub params: Vec<Slot>,
}

impl Layout {
    /// The layout of `params` (name, id, elements) over `dp` ranks.
    pub fn new(params: &[(String, u64, usize)], dp: usize) -> Result<Layout> {
        ensure!(dp >= 1, "the data-parallel degree must be at least 1");
        let mut order: Vec<usize> = (0..params.len()).collect();
        // Largest first; ties keep model order, so the result is a pure function of the input.
        order.sort_by(|&a, &b| params[b].2.cmp(&params[a].2).then(a.cmp(&b)));
        let mut load = vec![0usize; dp];
        let mut owner = vec![0usize; params.len()];
        for i in order {
            let rank = (0..dp).min_by_key(|&r| (load[r], r)).expect("dp >= 1");
            load[rank] += params[i].2;
            owner[i] = rank;
        }
        let slots = params
            .iter()
            .zip(owner)
            .map(|((name, id, numel), owner)| Slot {
                name: name.clone(),
                id: *id,
                numel: *numel,
                owner,
            })
            .collect();
        Ok(Layout { dp, params: slots })
    }

    /// The same parameters laid out for another degree.
    pub fn reshaped(&self, dp: usize) -> Result<Layout> {
        let params: Vec<(String, u64, usize)> = self
            .params
            .iter()
            .map(|s| (s.name.clone(), s.id, s.numel))
            .collect();
        Layout::new(&params, dp)
    }

    /// Parameter ids owned by `rank`.
    pub fn owned_by(&self, rank: usize) -> Vec<u64> {
        self.params
            .iter()
            .filter(|s| s.owner == rank)
            .map(|s| s.id)
            .collect()
    }

    /// Elements of optimizer-owned parameters per rank (how even the shards are).
    pub fn load(&self) -> Vec<usize> {
        let mut load = vec![0; self.dp];
        for s in &self.params {
            load[s.owner] += s.numel;
        }
        load
    }
}

/// Splits a shard file into its `(id, record bytes)` entries.
pub fn entries(bytes: &[u8]) -> Result<Vec<(u64, &[u8])>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        ensure!(
            at + 16 <= bytes.len(),
            "truncated optimizer state at byte {at}"
        );
        let id = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8 bytes")) as usize;
        at += 16;
        ensure!(
            at + len <= bytes.len(),
            "truncated optimizer state: entry {id} wants {len} bytes at byte {at}"
        );
        out.push((id, &bytes[at..at + len]));
        at += len;
    }
    Ok(out)
}

/// Joins entries into a shard file, sorted by id so equal state gives equal bytes.
pub fn join_entries(mut entries: Vec<(u64, &[u8])>) -> Vec<u8> {
    entries.sort_by_key(|(id, _)| *id);
    let mut out = Vec::new();
    for (id, bytes) in entries {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// The most data-parallel ranks a checkpoint is reshaped for: a shard file per rank and
/// optimizer, so a larger count is a typo, not a cluster (the largest runs have ~10^5 GPUs).
pub const MAX_RESHAPE_DP: usize = 1 << 17;

/// Rewrites checkpoint `input` as a new checkpoint folder `output` for `dp` data-parallel
/// ranks: the optimizer entries move to their new owners' shard files, `layout.json` is
/// replaced, every other file is copied unchanged. `output` must not exist (or be an empty
/// folder); it is written atomically (a fresh temporary folder, manifest last, rename), and
/// nothing that exists is removed.
pub fn reshape(input: &Path, output: &Path, dp: usize) -> Result<Layout> {
    ensure!(
        (1..=MAX_RESHAPE_DP).contains(&dp),
        "--dp {dp}: the data-parallel degree must be between 1 and {MAX_RESHAPE_DP}"
    );
    zflow_files::atomic::ensure_free(output)?;
    let step = checkpoint::manifest(input).map(|m| m.step).unwrap_or(0);
    let files = checkpoint::read_verified(input)
        .with_context(|| format!("{} does not verify; it cannot be reshaped", input.display()))?;
    let layout: Layout = serde_json::from_slice(files.get("layout.json").with_context(|| {
        format!(
            "{}: no layout.json (not a zflow training checkpoint?)",
            input.display()
        )
    })?)
    .with_context(|| format!("{}/layout.json", input.display()))?;
    let new = layout.reshaped(dp)?;
    let owner: BTreeMap<u64, usize> = new.params.iter().map(|s| (s.id, s.owner)).collect();

    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for optimizer in OPTIMIZERS {
        let mut per_rank: Vec<Vec<(u64, &[u8])>> = vec![Vec::new(); dp];
        for rank in 0..layout.dp {
            let name = shard_file(optimizer, rank);
            let bytes = files.get(&name).with_context(|| {
                format!(
                    "{}: the layout has {} ranks but {name} is missing",
                    input.display(),
                    layout.dp
                )
            })?;
            for (id, record) in
                entries(bytes).with_context(|| format!("{}/{name}", input.display()))?
            {
                let Some(&rank) = owner.get(&id) else {
                    bail!(
                        "{}/{name}: state for parameter id {id}, which the layout does not list",
                        input.display()
                    )
                };
                per_rank[rank].push((id, record));
            }
        }
        for (rank, e) in per_rank.into_iter().enumerate() {
            out.push((shard_file(optimizer, rank), join_entries(e)));
        }
    }
    for (name, bytes) in &files {
        if !name.starts_with("optim-") && name != "layout.json" {
            out.push((name.clone(), bytes.clone()));
        }
    }
    out.push(("layout.json".into(), serde_json::to_vec_pretty(&new)?));
    checkpoint::publish(output, step, out)?;
    Ok(new)
}

/// Rank `rank`'s shard of `optimizer` under layout `new`, from a checkpoint's `files` written
/// under layout `saved`: the rank's own file when the layouts agree, else the entries it now
/// owns, picked out of every old shard (a reshape in memory; every rank then reads all shards,
/// which `zflow ckpt reshape` avoids for big runs).
pub fn shard_for(
    dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    saved: &Layout,
    new: &Layout,
    rank: usize,
    optimizer: &str,
) -> Result<Vec<u8>> {
    let get = |name: &str| {
        files
            .get(name)
            .with_context(|| format!("{}: no {name} in the checkpoint", dir.display()))
    };
    if saved.dp == new.dp {
        return Ok(get(&shard_file(optimizer, rank))?.clone());
    }
    let mine: std::collections::BTreeSet<u64> = new.owned_by(rank).into_iter().collect();
    let mut picked = Vec::new();
    for r in 0..saved.dp {
        let name = shard_file(optimizer, r);
        for (id, record) in
            entries(get(&name)?).with_context(|| format!("{}/{name}", dir.display()))?
        {
            if mine.contains(&id) {
                picked.push((id, record));
            }
        }
    }
    Ok(join_entries(picked))
}

/// `dir`'s layout, or an error naming it.
pub fn read_layout(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<Layout> {
    let bytes = files
        .get("layout.json")
        .with_context(|| format!("{}: no layout.json", dir.display()))?;
    serde_json::from_slice(bytes).with_context(|| format!("{}/layout.json", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Vec<(String, u64, usize)> {
        let mut p = vec![("embed_tokens".to_string(), 1, 1000)];
        for e in 0..4 {
            p.push((
                format!("blocks.0.moe.local_experts.{e}.linear_fc1.weight"),
                10 + e,
                300,
            ));
        }
        p.push(("final_norm.weight".into(), 99, 10));
        p
    }

    #[test]
    fn ownership_is_balanced_and_a_pure_function() {
        let l = Layout::new(&params(), 2).unwrap();
        assert_eq!(l, Layout::new(&params(), 2).unwrap());
        // 1000 on rank 0; the four 300s go to rank 1 while it has less; the 10 to rank 0.
        assert_eq!(l.load(), vec![1010, 1200]);
        assert_eq!(Layout::new(&params(), 1).unwrap().load(), vec![2210]);
        // A layout written when it also recorded expert placement reads the same.
        let old = r#"{"dp": 1, "ep": 1, "params": [{"name": "a", "id": 1, "numel": 3, "owner": 0, "ep_rank": 0}]}"#;
        assert_eq!(serde_json::from_str::<Layout>(old).unwrap().dp, 1);
    }

    #[test]
    fn entries_round_trip_sorted() {
        let a = [1u8, 2, 3];
        let b = [9u8];
        let joined = join_entries(vec![(7, &a[..]), (3, &b[..])]);
        assert_eq!(entries(&joined).unwrap(), vec![(3, &b[..]), (7, &a[..])]);
        assert!(
            entries(&joined[..joined.len() - 1])
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
    }
}
