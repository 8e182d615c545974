//! The PyTorch worker's data plane (`workers/torch/zflow_torch`, numpy memory maps over the
//! read plan) reads every rank's batch token for token as the Rust reader does: the same
//! mixture index and read plan over the same Megatron datasets, for world sizes 1, 2 and 4, over many steps that cross epochs and a
//! curriculum switch, with sources of three dtypes and empty documents, one of them sharded
//! (three datasets read as one, one of them empty).

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zflow_runtime::data::TokenSource;
use zflow_runtime::data::concat::Concat;
use zflow_runtime::data::megatron::{DType, IndexedDataset, IndexedDatasetWriter};
use zflow_runtime::data::mixture::{MixSpec, MixStage, MixtureReader, plan};
use zflow_runtime::rng::SplitMix64;

/// A source of `docs` documents of seeded lengths (some empty) and ids below `vocab`.
fn write_source(prefix: &Path, dtype: DType, docs: usize, vocab: u32, seed: u64) {
    let mut rng = SplitMix64(seed);
    let mut w = IndexedDatasetWriter::create(prefix, dtype).unwrap();
    for d in 0..docs {
        let len = if d % 7 == 3 {
            0
        } else {
            1 + rng.below(90) as usize
        };
        let doc: Vec<u32> = (0..len).map(|_| rng.below(vocab as u64) as u32).collect();
        w.add_document(&doc).unwrap();
    }
    w.finish().unwrap();
}

/// Every rank's batch for `steps` global batches from the start: tokens, then source ids,
/// rank after rank, step after step (the layout `zflow_torch.mixture`'s dump writes).
fn rust_batches(reader: &MixtureReader, world: usize, micro: usize, steps: usize) -> Vec<u32> {
    let mut cursor = reader.start("dump");
    let mut out = Vec::new();
    for _ in 0..steps {
        for rank in 0..world {
            let b = reader.batch(&cursor, rank, world, micro).unwrap();
            out.extend(&b.tokens);
            out.extend(b.sources.iter().map(|&s| s as u32));
        }
        cursor = cursor.advance(world, micro);
    }
    out
}

fn python_batches(
    index: &Path,
    prefixes: &[Vec<PathBuf>],
    world: usize,
    micro: usize,
    steps: usize,
) -> Vec<u32> {
    let out = index.with_extension(format!("w{world}.bin"));
    let mut args: Vec<OsString> = vec![index.into(), out.clone().into()];
    args.extend([world, micro, steps].map(|n| n.to_string().into()));
    // A source's datasets, comma-separated.
    args.extend(prefixes.iter().map(|parts| {
        let parts: Vec<String> = parts.iter().map(|p| p.display().to_string()).collect();
        OsString::from(parts.join(","))
    }));
    common::torch_module_stdout("zflow_torch.mixture", args);
    std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_python_reader_gives_every_rank_the_rust_readers_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = [
        (DType::U16, 40, 50_000),
        (DType::I32, 25, 300_000),
        (DType::U8, 60, 200),
    ];
    // Source b is sharded: its documents in three datasets, the second one empty.
    let prefixes: Vec<Vec<PathBuf>> = kinds
        .iter()
        .enumerate()
        .map(|(i, &(dtype, docs, vocab))| {
            let shards = if i == 1 {
                vec![docs / 3, 0, docs - docs / 3]
            } else {
                vec![docs]
            };
            shards
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let prefix = dir.path().join(format!("source{i}-shard{k}"));
                    write_source(&prefix, dtype, n, vocab, 7 + 10 * i as u64 + k as u64);
                    prefix
                })
                .collect()
        })
        .collect();
    let sources: Vec<Arc<dyn TokenSource>> = prefixes
        .iter()
        .map(|parts| {
            let parts = parts
                .iter()
                .map(|p| IndexedDataset::open(p).unwrap())
                .collect();
            Arc::new(Concat::new(parts)) as Arc<dyn TokenSource>
        })
        .collect();
    // Small sources and a budget several times their size: every source wraps into later
    // epochs (each with its own document order), and the curriculum switches halfway.
    let spec = MixSpec {
        seq_len: 32,
        seed: 2026,
        block_size: 16,
        budget_tokens: 32 * 960,
        sources: vec!["a".into(), "b".into(), "c".into()],
        schedule: vec![
            MixStage {
                start: 0.0,
                weights: vec![0.5, 0.3, 0.2],
            },
            MixStage {
                start: 0.5,
                weights: vec![0.1, 0.6, 0.3],
            },
        ],
        max_epochs: vec![None, None, None],
    };
    let refs: Vec<&dyn TokenSource> = sources.iter().map(|s| s.as_ref()).collect();
    let index = dir.path().join("samples.idx");
    plan(&spec, &refs).unwrap().write(&index, &refs).unwrap();
    let reader = MixtureReader::open(&index, sources).unwrap();
    let micro = 3;
    for world in [1, 2, 4] {
        let steps = 960 / (world * micro);
        let rust = rust_batches(&reader, world, micro, steps);
        let python = python_batches(&index, &prefixes, world, micro, steps);
        assert_eq!(rust.len(), python.len(), "world {world}");
        assert!(rust == python, "world {world}: the readers disagree");
    }
}
