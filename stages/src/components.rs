//! Connected components of a graph too large for memory: which vertices are not the least of
//! their component (the near duplicates a cluster drops, keeping its first document).
//!
//! The algorithm is Kiveris et al.'s alternation of *large-star* and *small-star* ("Connected
//! Components in MapReduce and Beyond", SoCC 2014). Each step is one external sort of the edges
//! ([`crate::external_sort`]) and one pass over them grouped by vertex:
//! - large-star: each vertex `u` links every neighbour above it to the least of `u` and its
//!   neighbours;
//! - small-star: each vertex `u` links itself and every neighbour below it to the least of
//!   them.
//!
//! Both keep components as they are. The edges stop changing exactly when every component is a
//! star around its least vertex; then the vertices with a smaller neighbour are the answer.
//! O(log² n) rounds at worst, a handful on near-duplicate clusters. Memory is the sort's
//! budget, whatever the number of edges.
//!
//! An edge is `[a, b, bytes of a, bytes of b]`: the vertices' sizes travel with them, so that
//! the answer carries each vertex's bytes.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::Result;

use crate::external_sort::{Sorted, Sorter};
use crate::sorted_runs::Record;

/// An edge's record: `[u, v, bytes of u, bytes of v]`.
pub type Edge = [u64; 4];

/// Calls `emit` with each vertex of the graph of `edges` that is not the least vertex of its
/// component, in ascending order, with its bytes: `[vertex, bytes]`. Sorts in `scratch`
/// (created and removed) within `memory` bytes; `check` is called between rounds.
pub fn for_each_non_least_vertex(
    edges: impl IntoIterator<Item = Result<Edge>>,
    scratch: &Path,
    memory: usize,
    check: &dyn Fn() -> Result<()>,
    mut emit: impl FnMut([u64; 2]) -> Result<()>,
) -> Result<()> {
    std::fs::create_dir_all(scratch)?;
    // Two sorts are open at a time: the one read and the one written.
    let memory = memory / 2;
    let sorter = |round: usize, name: &str| {
        Sorter::<Edge>::new(scratch.join(format!("{round}-{name}")), memory)
    };
    // Both directions of every edge, for large-star's groups.
    let mut both = sorter(0, "large")?;
    for e in edges {
        let [u, v, bu, bv] = e?;
        if u != v {
            both.push([u, v, bu, bv])?;
            both.push([v, u, bv, bu])?;
        }
    }
    let leaves_path = scratch.join("leaves.bin");
    let mut previous: Option<blake3::Hash> = None;
    for round in 1.. {
        check()?;
        let mut sorted = both.finish()?;
        // Large-star, and the edge set's fingerprint (each edge once, in order): a round that
        // leaves it unchanged has reached the stars. The vertices with a smaller neighbour
        // come in ascending order: the answer, if it has.
        let mut fingerprint = blake3::Hasher::new();
        let mut small = sorter(round, "small")?;
        let mut leaves = BufWriter::new(File::create(&leaves_path)?);
        for_each_group(&mut sorted, |visit| {
            match visit {
                Visit::Edge(u, [m, bm], v, bv) if v > u => {
                    fingerprint.update(&u.to_le_bytes());
                    fingerprint.update(&v.to_le_bytes());
                    // Small-star groups each edge under its larger vertex.
                    small.push([v, m, bv, bm])?;
                }
                Visit::Done(u, bu, [m, _]) if m < u => {
                    leaves.write_all(&u.to_le_bytes())?;
                    leaves.write_all(&bu.to_le_bytes())?;
                }
                _ => {}
            }
            Ok(())
        })?;
        drop(sorted);
        leaves.flush()?;
        drop(leaves);
        let fingerprint = fingerprint.finalize();
        if previous == Some(fingerprint) {
            drop(small);
            let mut read = BufReader::new(File::open(&leaves_path)?);
            let mut b = [0u8; 16];
            loop {
                match read.read_exact(&mut b) {
                    Ok(()) => emit(<[u64; 2]>::decode(&b))?,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e.into()),
                }
            }
            drop(read);
            std::fs::remove_dir_all(scratch)?;
            return Ok(());
        }
        previous = Some(fingerprint);
        // Small-star: `u` with its neighbours below it, all linked to their least.
        let mut sorted = small.finish()?;
        both = sorter(round, "large")?;
        // Every neighbour is below `u` here, so the least is the first.
        for_each_group(&mut sorted, |visit| {
            let (Visit::Edge(_, [m, bm], v, bv) | Visit::Done(v, bv, [m, bm])) = visit;
            if v != m {
                both.push([v, m, bv, bm])?;
                both.push([m, v, bm, bv])?;
            }
            Ok(())
        })?;
    }
    unreachable!("the rounds end when the edges stop changing")
}

/// What [`for_each_group`] sees of a group of edges out of vertex `u`, whose `least` is
/// `[vertex, bytes]` of the least of `u` and its neighbours.
enum Visit {
    /// `(u, least, v, bytes of v)`: a distinct neighbour `v` of `u`.
    Edge(u64, [u64; 2], u64, u64),
    /// `(u, bytes of u, least)`: after the group's last neighbour.
    Done(u64, u64, [u64; 2]),
}

/// Streams sorted directed edges `[u, v, bu, bv]` grouped by vertex `u`, holding one edge at
/// a time (a group may be a whole cluster): a [`Visit::Edge`] for each distinct neighbour, then
/// a [`Visit::Done`]. The least of a group is known at its first edge: neighbours come
/// ascending.
fn for_each_group(
    sorted: &mut Sorted<Edge>,
    mut visit: impl FnMut(Visit) -> Result<()>,
) -> Result<()> {
    // The current group: its vertex and bytes, its least, and its last neighbour.
    let mut group: Option<(u64, u64, [u64; 2], u64)> = None;
    while let Some([u, v, bu, bv]) = sorted.next_record()? {
        match &mut group {
            Some((g, _, least, last)) if *g == u => {
                if *last != v {
                    *last = v;
                    visit(Visit::Edge(u, *least, v, bv))?;
                }
            }
            _ => {
                if let Some((g, bg, least, _)) = group {
                    visit(Visit::Done(g, bg, least))?;
                }
                let least = if v < u { [v, bv] } else { [u, bu] };
                group = Some((u, bu, least, v));
                visit(Visit::Edge(u, least, v, bv))?;
            }
        }
    }
    if let Some((g, bg, least, _)) = group {
        visit(Visit::Done(g, bg, least))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vertices of the graph of `edges` that are not the least vertex of their component, in
    /// ascending order, each with its bytes: `[vertex, bytes]`. Sorts in `scratch` (created and
    /// removed) within `memory` bytes; `check` is called between passes.
    fn non_least_vertices(
        edges: impl IntoIterator<Item = Result<Edge>>,
        scratch: &Path,
        memory: usize,
        check: &dyn Fn() -> Result<()>,
    ) -> Result<Vec<[u64; 2]>> {
        let mut out = Vec::new();
        for_each_non_least_vertex(edges, scratch, memory, check, |v| {
            out.push(v);
            Ok(())
        })?;
        Ok(out)
    }

    /// Union-find's answer: the vertices that are not the least of their component.
    fn naive(edges: &[(u64, u64)]) -> Vec<u64> {
        let mut parent = std::collections::BTreeMap::new();
        fn root(p: &mut std::collections::BTreeMap<u64, u64>, x: u64) -> u64 {
            let mut r = x;
            while let Some(&q) = p.get(&r)
                && q != r
            {
                r = q;
            }
            r
        }
        for &(a, b) in edges {
            parent.entry(a).or_insert(a);
            parent.entry(b).or_insert(b);
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            parent.insert(ra.max(rb), ra.min(rb));
        }
        let vertices: Vec<u64> = parent.keys().copied().collect();
        vertices
            .into_iter()
            .filter(|&v| root(&mut parent, v) != v)
            .collect()
    }

    #[test]
    fn non_least_vertices_match_union_find_on_random_graphs_in_a_tiny_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = zflow_runtime::rng::SplitMix64(11);
        for trial in 0..30 {
            let n = 2 + rng.below(300);
            let m = rng.below(2 * n);
            let mut edges: Vec<(u64, u64)> = (0..m).map(|_| (rng.below(n), rng.below(n))).collect();
            // Long chains (the worst case for label propagation), in shuffled order.
            let chain: Vec<u64> = (0..n / 3).map(|i| 1000 + i * 7 % (n / 3 + 1)).collect();
            edges.extend(chain.windows(2).map(|w| (w[1], w[0])));
            let want = naive(&edges);
            let memory = if trial % 2 == 0 { 256 } else { 1 << 20 };
            let got = non_least_vertices(
                edges.iter().map(|&(a, b)| Ok([a, b, a * 10, b * 10])),
                &tmp.path().join("scratch"),
                memory,
                &|| Ok(()),
            )
            .unwrap();
            assert_eq!(
                got.iter().map(|v| v[0]).collect::<Vec<_>>(),
                want,
                "trial {trial}"
            );
            assert!(got.iter().all(|v| v[1] == v[0] * 10), "bytes travel");
            assert!(!tmp.path().join("scratch").exists());
        }
    }
}
