use super::apportion::epoch_order;
use super::index::HEADER_LEN;
use super::permutation::WindowOrder;
use super::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use crate::data::TokenSource;
use crate::rng::SplitMix64;

/// An in-memory source; token = source tag * 10^8 + document * 1000 + offset, so a window
/// shows exactly where its tokens came from.
struct MemSource {
    docs: Vec<Vec<u32>>,
}

impl TokenSource for MemSource {
    fn num_docs(&self) -> usize {
        self.docs.len()
    }
    fn doc_len(&self, doc: usize) -> usize {
        self.docs[doc].len()
    }
    fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        out.copy_from_slice(&self.docs[doc][offset..offset + out.len()]);
        Ok(())
    }
}

/// `n_docs` documents of varied lengths in `0..max_len` (some empty).
fn mem_source(tag: u32, n_docs: usize, max_len: u64) -> Arc<MemSource> {
    let mut rng = SplitMix64(1000 + tag as u64);
    let docs = (0..n_docs as u32)
        .map(|d| {
            let len = rng.below(max_len) as u32;
            (0..len).map(|o| tag * 100_000_000 + d * 1000 + o).collect()
        })
        .collect();
    Arc::new(MemSource { docs })
}

fn spec(seq_len: usize, block_size: usize, samples: u64, stages: &[(f64, &[f64])]) -> MixSpec {
    let sources = stages[0].1.len();
    MixSpec {
        seq_len,
        seed: 42,
        block_size,
        budget_tokens: samples * seq_len as u64,
        sources: (0..sources).map(|s| format!("src{s}")).collect(),
        schedule: stages
            .iter()
            .map(|(start, w)| MixStage {
                start: *start,
                weights: w.to_vec(),
            })
            .collect(),
        max_epochs: vec![],
    }
}

fn default_sources() -> Vec<Arc<MemSource>> {
    vec![
        mem_source(1, 300, 120),
        mem_source(2, 150, 300),
        mem_source(3, 40, 60),
    ]
}

fn refs(sources: &[Arc<MemSource>]) -> Vec<&dyn TokenSource> {
    sources
        .iter()
        .map(|s| s.as_ref() as &dyn TokenSource)
        .collect()
}

fn dyns(sources: &[Arc<MemSource>]) -> Vec<Arc<dyn TokenSource>> {
    sources
        .iter()
        .map(|s| s.clone() as Arc<dyn TokenSource>)
        .collect()
}

/// Plans and writes `spec` into `dir/name`, and opens a reader on it.
fn build(
    spec: &MixSpec,
    sources: &[Arc<MemSource>],
    dir: &Path,
    name: &str,
) -> (MixReport, MixtureReader, PathBuf) {
    let path = dir.join(name);
    let report = plan(spec, &refs(sources))
        .unwrap()
        .write(&path, &refs(sources))
        .unwrap();
    let reader = MixtureReader::open(&path, dyns(sources)).unwrap();
    (report, reader, path)
}

fn plan_err(spec: &MixSpec, sources: &[Arc<MemSource>]) -> String {
    match plan(spec, &refs(sources)) {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn same_spec_gives_identical_bytes_and_another_seed_another_order() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    let s = spec(16, 64, 1000, &[(0.0, &[0.6, 0.3, 0.1])]);
    let (r1, _, p1) = build(&s, &sources, dir.path(), "a.idx");
    let (r2, _, p2) = build(&s, &sources, dir.path(), "b.idx");
    assert_eq!(std::fs::read(&p1).unwrap(), std::fs::read(&p2).unwrap());
    assert_eq!(r1, r2);

    let other = MixSpec {
        seed: 43,
        ..s.clone()
    };
    let (r3, _, p3) = build(&other, &sources, dir.path(), "c.idx");
    let (b1, b3) = (std::fs::read(&p1).unwrap(), std::fs::read(&p3).unwrap());
    assert_ne!(b1[HEADER_LEN..], b3[HEADER_LEN..]);
    assert_ne!(r1.fingerprint, r3.fingerprint);
    // The seed changes the order, not the counts.
    let counts = |r: &MixReport| r.sources.iter().map(|s| s.samples).collect::<Vec<_>>();
    assert_eq!(counts(&r1), counts(&r3));
}

#[test]
fn realised_share_within_one_point_of_requested() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    for (n, block) in [(100, 512), (333, 64), (777, 512), (3000, 512), (5000, 7)] {
        let s = spec(16, block, n, &[(0.0, &[0.6, 0.3, 0.1])]);
        let (report, _, _) = build(&s, &sources, dir.path(), "m.idx");
        assert_eq!(report.samples, n);
        assert_eq!(report.sources.iter().map(|s| s.samples).sum::<u64>(), n);
        for (src, want) in report.sources.iter().zip([0.6, 0.3, 0.1]) {
            assert!((src.requested_share - want).abs() < 1e-12);
            assert!(
                (src.realised_share - want).abs() <= 0.01,
                "N={n} B={block}: {} realised {} requested {want}",
                src.name,
                src.realised_share
            );
            assert_eq!(src.tokens, src.samples * 16);
        }
    }
}

#[test]
fn curriculum_shares_follow_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    // 10 blocks of 100; the second stage governs blocks 5..10.
    let s = spec(
        8,
        100,
        1000,
        &[(0.0, &[0.8, 0.2, 0.0]), (0.5, &[0.2, 0.3, 0.5])],
    );
    let (report, reader, _) = build(&s, &sources, dir.path(), "c.idx");
    for (src, want) in report.sources.iter().zip([0.5, 0.25, 0.25]) {
        assert!((src.requested_share - want).abs() < 1e-12, "{src:?}");
        assert!((src.realised_share - want).abs() <= 0.01, "{src:?}");
    }
    // The third source is absent from the first stage and ~half of the second.
    let third =
        |range: std::ops::Range<u64>| range.filter(|&i| reader.lookup(i).unwrap().0 == 2).count();
    assert_eq!(third(0..500), 0);
    assert!((third(500..1000) as i64 - 250).abs() <= 1);

    // A small phase whose stage boundary falls inside a block: requested share is weighted
    // by the blocks each stage governs, and realised follows it.
    let s = spec(
        8,
        64,
        150,
        &[(0.0, &[0.8, 0.2, 0.0]), (0.3, &[0.2, 0.3, 0.5])],
    );
    let (report, _, _) = build(&s, &sources, dir.path(), "d.idx");
    for src in &report.sources {
        assert!(
            (src.realised_share - src.requested_share).abs() <= 0.01,
            "{src:?}"
        );
    }
    // Blocks start at 0, 64/150 = 0.43, 128/150: only the first uses stage 0.
    let want0 = (64.0 * 0.8 + 86.0 * 0.2) / 150.0;
    assert!((report.sources[0].requested_share - want0).abs() < 1e-12);
}

/// Recomputes the whole index the slow way: samples handed out one at a time to the
/// largest deficit, then each sample's k counted from scratch.
fn brute_force_index(spec: &MixSpec) -> Vec<(u16, u64)> {
    let weights = validate(spec).unwrap();
    let n = spec.num_samples();
    let b = spec.block_size as u64;
    let mut deficit = vec![0.0f64; spec.sources.len()];
    let mut sources_in_order: Vec<u16> = Vec::new();
    for block in 0..n.div_ceil(b) {
        let size = b.min(n - block * b);
        let pos = (block * b) as f64 / n as f64;
        let stage = spec
            .schedule
            .iter()
            .rposition(|st| st.start <= pos)
            .unwrap();
        for s in 0..deficit.len() {
            deficit[s] += size as f64 * weights[stage][s];
        }
        let mut slots = Vec::new();
        let mut counts = vec![0usize; deficit.len()];
        for _ in 0..size {
            let best =
                (0..deficit.len()).fold(
                    0,
                    |best, s| if deficit[s] > deficit[best] { s } else { best },
                );
            counts[best] += 1;
            deficit[best] -= 1.0;
        }
        for (s, &c) in counts.iter().enumerate() {
            slots.extend(std::iter::repeat_n(s as u16, c));
        }
        shuffle(&mut slots, &mut rng_for(&[spec.seed, TAG_BLOCK, block]));
        sources_in_order.extend(slots);
    }
    (0..sources_in_order.len())
        .map(|i| {
            let s = sources_in_order[i];
            (
                s,
                sources_in_order[..i].iter().filter(|&&x| x == s).count() as u64,
            )
        })
        .collect()
}

#[test]
fn lookup_matches_brute_force() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    for s in [
        spec(16, 64, 700, &[(0.0, &[0.6, 0.3, 0.1])]),
        spec(
            16,
            50,
            613,
            &[
                (0.0, &[1.0, 0.0, 3.0]),
                (0.25, &[0.0, 1.0, 0.0]),
                (0.6, &[0.2, 0.2, 0.6]),
            ],
        ),
    ] {
        let (report, reader, _) = build(&s, &sources, dir.path(), "l.idx");
        let want = brute_force_index(&s);
        assert_eq!(want.len() as u64, reader.num_samples());
        for (i, w) in want.iter().enumerate() {
            assert_eq!(reader.lookup(i as u64).unwrap(), *w, "sample {i}");
        }
        for (src, rep) in report.sources.iter().enumerate() {
            assert_eq!(
                rep.samples,
                want.iter().filter(|w| w.0 as usize == src).count() as u64
            );
        }
        assert!(reader.lookup(want.len() as u64).is_err());
    }
}

#[test]
fn windows_match_a_naive_concatenation() {
    let dir = tempfile::tempdir().unwrap();
    // The third source is tiny, so it is read for several epochs.
    let sources = vec![
        mem_source(1, 200, 90),
        mem_source(2, 60, 400),
        mem_source(3, 12, 30),
    ];
    let s = spec(24, 32, 900, &[(0.0, &[0.5, 0.3, 0.2])]);
    let (report, reader, _) = build(&s, &sources, dir.path(), "w.idx");
    assert!(report.sources[2].epochs > 3.0, "{:?}", report.sources[2]);

    let l = s.seq_len;
    let mut streams: std::collections::HashMap<(usize, u64), Vec<u32>> = Default::default();
    let mut row = vec![0u32; l + 1];
    let mut windows_read = std::collections::HashSet::new();
    for i in 0..reader.num_samples() {
        let (src, k) = reader.lookup(i).unwrap();
        let src = src as usize;
        let docs = &sources[src].docs;
        let total: usize = docs.iter().map(Vec::len).sum();
        let per_epoch = ((total - 1) / l) as u64;
        let (epoch, kk) = (k / per_epoch, (k % per_epoch) as usize);
        let stream = streams.entry((src, epoch)).or_insert_with(|| {
            let order = epoch_order(s.seed, src, epoch, docs.len());
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(
                sorted,
                (0..docs.len() as u64).collect::<Vec<_>>(),
                "not a permutation"
            );
            order
                .iter()
                .flat_map(|&d| docs[d as usize].iter().copied())
                .collect()
        });
        let w = WindowOrder::new(s.seed, src, epoch, per_epoch).get(kk as u64) as usize;
        assert!(
            windows_read.insert((src, epoch, w)),
            "window {w} of epoch {epoch} of source {src} read twice"
        );
        assert_eq!(reader.read_sample(i, &mut row).unwrap() as usize, src);
        assert_eq!(
            row,
            stream[w * l..w * l + l + 1],
            "sample {i} (source {src}, k {k})"
        );
    }
    // Different epochs use different document orders.
    assert_ne!(streams[&(2, 0)], streams[&(2, 1)]);
}

/// A source of long documents, mixed with two of short ones, as a phase with books or code
/// repositories in it: read in stream order, one long document would fill most of a global
/// batch; in the window order no document fills more than a quarter of any.
///
/// The window order is a pseudo-random permutation, so the bound is a tail event: a batch
/// draws about 6 of its 16 samples from the 32 long documents, and five of them landing on one
/// document has probability about 2e-5 a batch (0.5% over the 256 batches here). With 16
/// documents it is 4.6%, and this seed does put 5 of 16 on one document in one batch.
#[test]
fn long_documents_are_spread_over_the_epoch_not_over_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let long = Arc::new(MemSource {
        docs: (0..32u32)
            .map(|d| (0..4_000).map(|o| 400_000_000 + d * 100_000 + o).collect())
            .collect(),
    });
    let sources = vec![long, mem_source(1, 3000, 200), mem_source(2, 2000, 300)];
    let s = spec(64, 256, 4096, &[(0.0, &[0.4, 0.3, 0.3])]);
    let (report, reader, _) = build(&s, &sources, dir.path(), "long.idx");
    for (got, want) in report.sources.iter().zip([0.4, 0.3, 0.3]) {
        assert!(
            (got.realised_share - want).abs() < 0.01,
            "{}: {} realised, {want} requested",
            got.name,
            got.realised_share
        );
    }
    let batches = batches::measure(&reader, 16).unwrap();
    assert_eq!((batches.batches, batches.measured_batches), (256, 256));
    assert!(
        batches.max_doc_share <= 0.25,
        "one document fills {} of a global batch",
        batches.max_doc_share
    );
    assert!(batches.mean_distinct_docs > 9.0, "{batches:?}");

    // Read front to back instead (w = k', what version 1 did), the long source's consecutive
    // windows are one document's, and that document takes more than a quarter of a batch.
    let per_epoch = (32 * 4_000 - 1) / 64;
    let mut worst = 0;
    for batch in 0..256u64 {
        let mut docs = std::collections::HashMap::<u64, u32>::new();
        for i in batch * 16..batch * 16 + 16 {
            let (src, k) = reader.lookup(i).unwrap();
            if src == 0 {
                let order = epoch_order(s.seed, 0, k / per_epoch, 32);
                let doc = order[((k % per_epoch) * 64 / 4_000) as usize];
                *docs.entry(doc).or_default() += 1;
            }
        }
        worst = worst.max(docs.values().copied().max().unwrap_or(0));
    }
    assert!(
        worst > 4,
        "front to back, one document filled only {worst} of 16"
    );
}

#[test]
fn epoch_cap_errors_when_the_budget_is_larger_than_the_data() {
    let sources = default_sources();
    let total: usize = sources[2].docs.iter().map(Vec::len).sum();
    let per_epoch = (total as u64 - 1) / 16;
    // Source 2 gets ~10% of the samples: ask for about 3 epochs of it.
    let mut s = spec(16, 64, per_epoch * 30, &[(0.0, &[0.6, 0.3, 0.1])]);
    s.max_epochs = vec![None, None, Some(2.0)];
    let err = plan_err(&s, &sources);
    assert!(err.contains("budget larger than the data"), "{err}");
    assert!(
        err.contains("'src2'") && err.contains("epochs") && err.contains("allows 2"),
        "{err}"
    );
    s.max_epochs = vec![None, None, Some(4.0)];
    assert!(plan(&s, &refs(&sources)).is_ok());
    s.max_epochs = vec![None, None, None];
    assert!(plan(&s, &refs(&sources)).is_ok());
}

#[test]
fn bad_specs_are_named() {
    let sources = default_sources();
    let good = spec(16, 64, 500, &[(0.0, &[0.6, 0.3, 0.1])]);
    let check = |s: MixSpec, needles: &[&str]| {
        let err = plan_err(&s, &sources);
        for n in needles {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
    };
    check(
        spec(16, 64, 500, &[(0.0, &[0.0, 0.0, 0.0])]),
        &["schedule[0].weights", "all zero"],
    );
    let short = MixSpec {
        schedule: vec![MixStage {
            start: 0.0,
            weights: vec![0.5, 0.5],
        }],
        ..good.clone()
    };
    check(short, &["schedule[0].weights", "2 entries", "3 sources"]);
    check(
        spec(16, 64, 500, &[(0.0, &[0.5, -0.1, 0.5])]),
        &["schedule[0].weights[1]", "src1", "-0.1"],
    );
    check(
        spec(16, 64, 500, &[(0.1, &[1.0, 1.0, 1.0])]),
        &["schedule[0].start", "0.1"],
    );
    check(
        spec(
            16,
            64,
            500,
            &[
                (0.0, &[1.0, 1.0, 1.0]),
                (0.5, &[1.0, 0.0, 0.0]),
                (0.5, &[0.0, 1.0, 0.0]),
            ],
        ),
        &["schedule[2].start", "increase"],
    );
    check(
        spec(
            16,
            64,
            500,
            &[(0.0, &[1.0, 1.0, 1.0]), (1.0, &[1.0, 0.0, 0.0])],
        ),
        &["schedule[1].start", "[0, 1)"],
    );
    check(
        MixSpec {
            seq_len: 0,
            ..good.clone()
        },
        &["seq_len", "0"],
    );
    check(
        MixSpec {
            block_size: 0,
            ..good.clone()
        },
        &["block_size"],
    );
    check(
        MixSpec {
            max_epochs: vec![None],
            ..good.clone()
        },
        &["max_epochs", "1 entries"],
    );
    check(
        MixSpec {
            max_epochs: vec![None, Some(-1.0), None],
            ..good.clone()
        },
        &["max_epochs[1]", "src1", "-1"],
    );

    // An empty source may be listed, but not weighted.
    let mut with_empty = default_sources();
    with_empty[1] = Arc::new(MemSource {
        docs: vec![vec![], vec![1, 2, 3]],
    });
    let err = plan_err(&good, &with_empty);
    assert!(
        err.contains("'src1'") && err.contains("weight 0.3") && err.contains("3 tokens"),
        "{err}"
    );
    let unweighted = spec(16, 64, 500, &[(0.0, &[0.6, 0.0, 0.1])]);
    let report = plan(&unweighted, &refs(&with_empty))
        .unwrap()
        .report(String::new());
    assert_eq!(report.sources[1].samples, 0);
}

#[test]
fn global_batches_do_not_depend_on_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    let s = spec(
        16,
        64,
        1000,
        &[(0.0, &[0.6, 0.3, 0.1]), (0.5, &[0.1, 0.1, 0.8])],
    );
    let (_, reader, _) = build(&s, &sources, dir.path(), "g.idx");
    let global_batch = 4;
    let steps = 1000 / global_batch;
    let mut runs = Vec::new();
    for (world, micro) in [(1, 4), (2, 2), (4, 1)] {
        let mut cursor = reader.start("pretrain");
        let mut tokens = Vec::new();
        let mut srcs = Vec::new();
        for _ in 0..steps {
            for rank in 0..world {
                let b = reader.batch(&cursor, rank, world, micro).unwrap();
                assert_eq!(b.first_sample, cursor.sample + (rank * micro) as u64);
                assert_eq!(b.tokens.len(), micro * 17);
                tokens.extend(b.tokens);
                srcs.extend(b.sources);
            }
            cursor = advance(&cursor, world, micro);
        }
        assert_eq!(cursor.sample, 1000);
        let err = format!("{:#}", reader.batch(&cursor, 0, world, micro).unwrap_err());
        assert!(
            err.contains("'pretrain'") && err.contains("N = 1000"),
            "{err}"
        );
        runs.push((tokens, srcs));
    }
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    // A global batch that only partly fits is refused on every rank.
    let cursor = DataCursor {
        sample: 998,
        ..reader.start("pretrain")
    };
    assert!(reader.batch(&cursor, 0, 2, 2).is_err());
}

#[test]
fn cursor_of_another_mixture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    let s = spec(16, 64, 500, &[(0.0, &[0.6, 0.3, 0.1])]);
    let (_, reader, _) = build(&s, &sources, dir.path(), "a.idx");
    let (_, other, _) = build(&MixSpec { seed: 7, ..s }, &sources, dir.path(), "b.idx");
    let cursor = other.start("anneal");
    let err = format!("{:#}", reader.batch(&cursor, 0, 1, 1).unwrap_err());
    assert!(
        err.contains("fingerprint") && err.contains("'anneal'"),
        "{err}"
    );
    assert!(reader.batch(&reader.start("anneal"), 0, 1, 1).is_ok());
}

#[test]
fn reader_refuses_other_data_and_damaged_files() {
    let dir = tempfile::tempdir().unwrap();
    let sources = default_sources();
    let s = spec(16, 64, 500, &[(0.0, &[0.6, 0.3, 0.1])]);
    let (_, _, path) = build(&s, &sources, dir.path(), "a.idx");

    let mut swapped = sources.clone();
    swapped.swap(0, 1);
    let err = format!(
        "{:#}",
        MixtureReader::open(&path, dyns(&swapped)).err().unwrap()
    );
    assert!(
        err.contains("source 0") && err.contains("documents"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        MixtureReader::open(&path, dyns(&sources[..2]))
            .err()
            .unwrap()
    );
    assert!(err.contains("2 token sources given for 3"), "{err}");

    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 8]).unwrap();
    let err = format!("{:#}", MixIndex::open(&path).err().unwrap());
    assert!(err.contains("truncated"), "{err}");

    let index = {
        std::fs::write(&path, &bytes).unwrap();
        MixIndex::open(&path).unwrap()
    };
    assert_eq!(
        (
            index.len(),
            index.seq_len(),
            index.seed(),
            index.num_sources(),
            index.block_size()
        ),
        (500, 16, 42, 3, 64)
    );
    let manifest: MixManifest =
        serde_json::from_slice(&std::fs::read(manifest_path(&path)).unwrap()).unwrap();
    assert_eq!(manifest.spec, s);

    // A read plan file cut short is named when the reader opens or first maps it.
    let starts = dir
        .path()
        .join(&manifest.read_plan.sources[0].epochs[0].starts);
    let plan_bytes = std::fs::read(&starts).unwrap();
    std::fs::write(&starts, &plan_bytes[..plan_bytes.len() - 8]).unwrap();
    let reader = MixtureReader::open(&path, dyns(&sources)).unwrap();
    let first = (0..reader.num_samples())
        .find(|&i| reader.lookup(i).unwrap().0 == 0)
        .unwrap();
    let err = format!(
        "{:#}",
        reader.read_sample(first, &mut [0; 17]).err().unwrap()
    );
    assert!(
        err.contains("s0.e0.starts.u64") && err.contains("truncated or damaged"),
        "{err}"
    );
}

#[test]
fn spec_roundtrips_through_json() {
    let mut s = spec(
        16,
        64,
        500,
        &[(0.0, &[0.6, 0.3, 0.1]), (0.5, &[0.1, 0.1, 0.8])],
    );
    s.max_epochs = vec![None, Some(2.5), None];
    let back: MixSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    let minimal: MixSpec = serde_json::from_str(
        r#"{"seq_len": 8, "seed": 1, "block_size": 4, "budget_tokens": 80,
            "sources": ["a"], "schedule": [{"start": 0, "weights": [1]}]}"#,
    )
    .unwrap();
    assert!(minimal.max_epochs.is_empty());
    assert_eq!(minimal.num_samples(), 10);
}

/// 2^32 empty documents, then [`PAST`] documents of [`PAST_LEN`] tokens: a source whose
/// documents past 2^32 hold all its tokens, described without holding anything per document.
struct PastU32;

const FIRST_READ: u64 = 1 << 32;
const PAST: u64 = 8;
const PAST_LEN: usize = 10;

impl TokenSource for PastU32 {
    fn num_docs(&self) -> usize {
        (FIRST_READ + PAST) as usize
    }
    fn doc_len(&self, doc: usize) -> usize {
        if doc as u64 >= FIRST_READ {
            PAST_LEN
        } else {
            0
        }
    }
    fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        let past = (doc as u64 - FIRST_READ) as u32;
        for (i, t) in out.iter_mut().enumerate() {
            *t = past * 100 + (offset + i) as u32;
        }
        Ok(())
    }
    fn num_tokens(&self) -> u64 {
        PAST * PAST_LEN as u64
    }
}

/// Writes `values` at entry `at` of the u64 file `path`, which is `len` entries long and
/// sparse (zeros) elsewhere.
fn sparse_u64s(path: &Path, len: u64, at: u64, values: &[u64]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = File::create(path).unwrap();
    f.set_len(len * 8).unwrap();
    f.seek(SeekFrom::Start(at * 8)).unwrap();
    for v in values {
        f.write_all(&v.to_le_bytes()).unwrap();
    }
}

/// Document ids past 2^32 are read as themselves, not wrapped: a read plan over a source of
/// 2^32 + 8 documents (sparse files of 32 GiB each, holding only their last entries) gives
/// the windows of its last documents. Mixing such a source whole is not done here: its read
/// plan alone would be 3 x 32 GiB of data.
#[test]
fn document_ids_past_2_pow_32_address_their_own_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let docs = FIRST_READ + PAST;
    let seq_len = 16u64;
    let spec = MixSpec {
        budget_tokens: 2 * seq_len,
        ..spec(seq_len as usize, 2, 2, &[(0.0, &[1.0])])
    };
    let index = dir.path().join("samples.idx");
    let mut bytes = Header {
        num_sources: 1,
        num_samples: 2,
        seq_len,
        seed: spec.seed,
        block_size: 2,
    }
    .to_bytes()
    .to_vec();
    for k in 0..2u64 {
        bytes.extend_from_slice(&apportion::encode(0, k).to_le_bytes());
    }
    std::fs::write(&index, &bytes).unwrap();
    let plan_dir = dir.path().join("samples.plan");
    std::fs::create_dir(&plan_dir).unwrap();
    // Sample 0 reads from the start of the stream, sample 1 from token 16 on.
    sparse_u64s(&plan_dir.join("positions.u64"), 2, 0, &[0, seq_len]);
    let tails: Vec<u64> = (0..=PAST).map(|p| p * PAST_LEN as u64).collect();
    sparse_u64s(
        &plan_dir.join("addresses.u64"),
        docs + 1,
        FIRST_READ,
        &tails,
    );
    sparse_u64s(&plan_dir.join("starts.u64"), docs + 1, FIRST_READ, &tails);
    // The documents in reverse at the places past 2^32.
    let order: Vec<u64> = (0..PAST).rev().map(|p| FIRST_READ + p).collect();
    sparse_u64s(&plan_dir.join("order.u64"), docs, FIRST_READ, &order);
    let plan = ReadPlan {
        positions: "samples.plan/positions.u64".into(),
        sources: vec![read_plan::SourcePlan {
            documents: docs,
            tokens: PastU32.num_tokens(),
            samples_per_epoch: (PastU32.num_tokens() - 1) / seq_len,
            part_tokens: vec![PastU32.num_tokens()],
            addresses: "samples.plan/addresses.u64".into(),
            epochs: vec![read_plan::EpochPlan {
                order: "samples.plan/order.u64".into(),
                starts: "samples.plan/starts.u64".into(),
            }],
        }],
    };
    let manifest = MixManifest {
        spec: spec.clone(),
        data_digest: String::new(),
        report: MixReport {
            sources: vec![],
            samples: 2,
            seq_len: seq_len as usize,
            tokens: 2 * seq_len,
            fingerprint: "f".into(),
        },
        read_plan: plan,
    };
    std::fs::write(
        manifest_path(&index),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();

    let reader = MixtureReader::open(&index, vec![Arc::new(PastU32)]).unwrap();
    let batch = reader.batch(&reader.start("p"), 0, 1, 2).unwrap();
    // Place 2^32 holds document 2^32 + 7 (token 700 on), the next one 2^32 + 6, and so on.
    let expected = |from: u64| -> Vec<u32> {
        (from..from + seq_len + 1)
            .map(|pos| {
                let place = pos / PAST_LEN as u64;
                (PAST - 1 - place) as u32 * 100 + (pos % PAST_LEN as u64) as u32
            })
            .collect()
    };
    assert_eq!(batch.tokens[..17], expected(0)[..]);
    assert_eq!(batch.tokens[17..], expected(seq_len)[..]);
    // Sample 1 (tokens 16..33) takes all ten of place 2: document 2^32 + 5.
    assert_eq!(reader.main_document(1).unwrap(), (0, FIRST_READ + 5));
}
