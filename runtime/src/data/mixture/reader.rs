//! Reading a mixture back: the [`DataCursor`] a checkpoint keeps and the [`MixtureReader`]
//! that turns cursor positions into token windows.

use super::super::TokenSource;
use super::index::MixIndex;
use super::read_plan::U64Array;
use super::{MixManifest, MixReport, MixSpec, manifest_path};
use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a trainer is in a phase's data; saved in checkpoints. The fingerprint ties it to one
/// mixture, so a resumed run can never silently read different data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DataCursor {
    /// The phase's name (used in error messages).
    pub phase: String,
    /// The next global sample to read.
    pub sample: u64,
    /// The [`MixReport::fingerprint`] of the mixture the cursor belongs to.
    pub fingerprint: String,
}

impl DataCursor {
    /// The cursor after one global batch of `world * micro_batch` samples.
    pub fn advance(&self, world: usize, micro_batch: usize) -> DataCursor {
        DataCursor {
            sample: self.sample + (world * micro_batch) as u64,
            ..self.clone()
        }
    }
}

/// The cursor after one global batch of `world * micro_batch` samples (same as
/// [`DataCursor::advance`]).
pub fn advance(cursor: &DataCursor, world: usize, micro_batch: usize) -> DataCursor {
    cursor.advance(world, micro_batch)
}

/// One rank's part of a global batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// `micro_batch` rows of `seq_len + 1` tokens, row-major (inputs = row[..seq_len],
    /// targets = row[1..]).
    pub tokens: Vec<u32>,
    /// The source id of each row.
    pub sources: Vec<u16>,
    /// Global sample number of the first row.
    pub first_sample: u64,
}

/// One epoch of a source, from the read plan: the document at each place of its stream and
/// where each place starts.
pub(super) struct EpochLayout {
    pub(super) order: U64Array,
    pub(super) starts: U64Array,
}

/// Epoch layouts kept mapped per source. A batch touches at most two epochs of a source
/// (sources are read front to back), so two per source is enough.
pub(super) const EPOCHS_CACHED: usize = 2;

/// One source's mapped epochs: (epoch, layout), most recently used last.
pub(super) type RecentEpochs = Vec<(u64, Arc<EpochLayout>)>;

/// Reads a phase's samples: the index and the read plan (memory-mapped) plus the sources'
/// tokens.
///
/// Opened from the index path alone plus the sources; seq_len and seed come from the index
/// header, and the fingerprint, source names and read plan from the sidecar
/// (`<index>.json`). Opening costs the same whatever the sources' sizes. Safe to share
/// between threads.
pub struct MixtureReader {
    pub(super) index: MixIndex,
    pub(super) sources: Vec<Arc<dyn TokenSource>>,
    pub(super) manifest: MixManifest,
    /// The folder the plan's file names are relative to.
    pub(super) base: PathBuf,
    pub(super) positions: U64Array,
    /// Per source: recently used epochs, most recent last.
    pub(super) epochs: Mutex<Vec<RecentEpochs>>,
}

impl MixtureReader {
    /// Opens the index at `index_path`, its sidecar and its read plan, with the sources' data
    /// in source order. Fails if the sources are not shaped as the data the mixture was made
    /// from (count, documents, tokens or files differ); that they hold the same documents is
    /// the store's to guarantee (a mix stage's identity includes its inputs' hashes), as
    /// checking it here would read every document length.
    pub fn open(index_path: &Path, sources: Vec<Arc<dyn TokenSource>>) -> Result<MixtureReader> {
        let index = MixIndex::open(index_path)?;
        let mpath = manifest_path(index_path);
        let text = std::fs::read(&mpath)
            .with_context(|| format!("reading mixture sidecar {}", mpath.display()))?;
        let manifest: MixManifest = serde_json::from_slice(&text)
            .with_context(|| format!("parsing mixture sidecar {}", mpath.display()))?;
        let spec = &manifest.spec;
        let h = &index.header;
        ensure!(
            h.num_samples == spec.num_samples()
                && h.seq_len == spec.seq_len as u64
                && h.seed == spec.seed
                && h.num_sources as usize == spec.sources.len(),
            "{}: the index header does not match its sidecar {} (from different runs?)",
            index_path.display(),
            mpath.display()
        );
        ensure!(
            sources.len() == spec.sources.len(),
            "mixture {}: {} token sources given for {} sources ({})",
            index_path.display(),
            sources.len(),
            spec.sources.len(),
            spec.sources.join(", ")
        );
        let plan = &manifest.read_plan;
        ensure!(
            plan.sources.len() == sources.len(),
            "{}: the read plan lists {} sources for {}",
            mpath.display(),
            plan.sources.len(),
            sources.len()
        );
        for (s, (src, sp)) in sources.iter().zip(&plan.sources).enumerate() {
            let name = &spec.sources[s];
            let (docs, tokens) = (src.num_docs() as u64, src.num_tokens());
            ensure!(
                docs == sp.documents && tokens == sp.tokens,
                "mixture {}: source {s} ('{name}') was {} documents / {} tokens when the mixture \
                 was made, but the data given has {docs} documents / {tokens} tokens",
                index_path.display(),
                sp.documents,
                sp.tokens,
            );
            ensure!(
                src.part_tokens() == sp.part_tokens,
                "mixture {}: source {s} ('{name}') was stored in {} files when the mixture was \
                 made, but the data given is split differently ({} files)",
                index_path.display(),
                sp.part_tokens.len(),
                src.part_tokens().len()
            );
        }
        let base = index_path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let positions = U64Array::open(&base, &plan.positions, h.num_samples)?;
        let epochs = Mutex::new(vec![Vec::new(); sources.len()]);
        Ok(MixtureReader {
            index,
            sources,
            manifest,
            base,
            positions,
            epochs,
        })
    }

    /// The mixture's fingerprint.
    pub fn fingerprint(&self) -> &str {
        &self.manifest.report.fingerprint
    }

    /// The mixture's report, as written next to the index.
    pub fn report(&self) -> &MixReport {
        &self.manifest.report
    }

    /// The spec the mixture was made from.
    pub fn spec(&self) -> &MixSpec {
        &self.manifest.spec
    }

    /// N, the number of samples.
    pub fn num_samples(&self) -> u64 {
        self.index.len()
    }

    /// Tokens per sample (a row holds `seq_len + 1`).
    pub fn seq_len(&self) -> usize {
        self.index.seq_len()
    }

    /// A cursor at the start of this mixture, for phase `phase`.
    pub fn start(&self, phase: &str) -> DataCursor {
        DataCursor {
            phase: phase.to_string(),
            sample: 0,
            fingerprint: self.fingerprint().to_string(),
        }
    }

    /// Sample `i` as (source id, source-local sample number).
    pub fn lookup(&self, i: u64) -> Result<(u16, u64)> {
        self.index.get(i).with_context(|| {
            format!(
                "sample {i} is past the end of the mixture (N = {})",
                self.num_samples()
            )
        })
    }

    /// Reads sample `i`'s `seq_len + 1` tokens into `out`; returns its source id.
    pub fn read_sample(&self, i: u64, out: &mut [u32]) -> Result<u16> {
        ensure!(
            out.len() == self.seq_len() + 1,
            "read_sample: buffer of {} tokens, a sample is seq_len + 1 = {}",
            out.len(),
            self.seq_len() + 1
        );
        let src = self.sources[self.lookup(i)?.0 as usize].clone();
        let mut filled = 0;
        self.walk(i, |doc, offset, take| {
            src.read(
                doc as usize,
                offset as usize,
                &mut out[filled..filled + take],
            )?;
            filled += take;
            Ok(())
        })
    }

    /// The document that gives sample `i` most of its tokens (the first of those tied), as
    /// (source id, document number in the source).
    pub fn main_document(&self, i: u64) -> Result<(u16, u64)> {
        let mut best = (0u64, 0usize);
        let source = self.walk(i, |doc, _, take| {
            if take > best.1 {
                best = (doc, take);
            }
            Ok(())
        })?;
        Ok((source, best.0))
    }

    /// Calls `piece(document, offset, tokens)` for each document piece of sample `i`'s
    /// window, in order (empty documents skipped); returns the sample's source id.
    ///
    /// Source-local sample `k` reads the tokens `[p, p + seq_len + 1)` of epoch
    /// `k / samples_per_epoch` of its source, `p` the sample's position in the read plan.
    fn walk(&self, i: u64, mut piece: impl FnMut(u64, u64, usize) -> Result<()>) -> Result<u16> {
        let (s, k) = self.lookup(i)?;
        let per_epoch = self.manifest.read_plan.sources[s as usize].samples_per_epoch;
        let layout = self.layout(s as usize, k / per_epoch)?;
        let want = self.seq_len() as u64 + 1;
        let mut pos = self.positions.get(i);
        // The document holding `pos`: the last place starting at or before it (empty
        // documents start where the next one does, so this skips them).
        let mut j = layout.starts.partition_point(|start| start <= pos) - 1;
        let mut filled = 0u64;
        while filled < want {
            let (start, end) = (layout.starts.get(j), layout.starts.get(j + 1));
            let take = (end - pos).min(want - filled);
            if take > 0 {
                piece(layout.order.get(j), pos - start, take as usize)?;
            }
            filled += take;
            pos += take;
            j += 1;
        }
        Ok(s)
    }

    /// Rank `rank`'s part of the global batch at `cursor`: samples
    /// `cursor.sample + rank * micro_batch ..` (`micro_batch` of them). The global batch is
    /// `world * micro_batch` consecutive samples, so the global order never depends on the
    /// world size. Fails if the cursor belongs to another mixture, or if the *global* batch
    /// would read past N (so all ranks fail on the same step).
    pub fn batch(
        &self,
        cursor: &DataCursor,
        rank: usize,
        world: usize,
        micro_batch: usize,
    ) -> Result<Batch> {
        ensure!(
            cursor.fingerprint == self.fingerprint(),
            "phase '{}': the data cursor's mixture fingerprint {} does not match this mixture's \
             {}; the data, the mixture spec or its seed changed since the cursor was saved",
            cursor.phase,
            cursor.fingerprint,
            self.fingerprint()
        );
        ensure!(
            world > 0 && micro_batch > 0,
            "batch: world ({world}) and micro_batch ({micro_batch}) must be > 0"
        );
        ensure!(
            rank < world,
            "batch: rank {rank} is not below world {world}"
        );
        let n = self.num_samples();
        let global = (world * micro_batch) as u64;
        let end = cursor.sample.saturating_add(global);
        ensure!(
            end <= n,
            "phase '{}': the mixture has N = {n} samples, but the batch at sample {} needs samples \
             up to {end} (world {world} x micro_batch {micro_batch})",
            cursor.phase,
            cursor.sample
        );
        let row = self.seq_len() + 1;
        let first = cursor.sample + (rank * micro_batch) as u64;
        let mut tokens = vec![0u32; micro_batch * row];
        let mut sources = Vec::with_capacity(micro_batch);
        for (r, out) in tokens.chunks_exact_mut(row).enumerate() {
            sources.push(self.read_sample(first + r as u64, out)?);
        }
        Ok(Batch {
            tokens,
            sources,
            first_sample: first,
        })
    }

    /// The layout of epoch `epoch` of `source`, from the cache or mapped from the read plan.
    pub(super) fn layout(&self, source: usize, epoch: u64) -> Result<Arc<EpochLayout>> {
        let mut cache = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let entries = &mut cache[source];
        if let Some(at) = entries.iter().position(|(e, _)| *e == epoch) {
            let hit = entries.remove(at);
            let layout = hit.1.clone();
            entries.push(hit);
            return Ok(layout);
        }
        let plan = &self.manifest.read_plan.sources[source];
        let files = plan.epochs.get(epoch as usize).with_context(|| {
            format!(
                "the read plan of source '{}' holds {} epochs; epoch {epoch} was asked for",
                self.spec().sources[source],
                plan.epochs.len()
            )
        })?;
        let layout = Arc::new(EpochLayout {
            order: U64Array::open(&self.base, &files.order, plan.documents)?,
            starts: U64Array::open(&self.base, &files.starts, plan.documents + 1)?,
        });
        if entries.len() == EPOCHS_CACHED {
            entries.remove(0);
        }
        entries.push((epoch, layout.clone()));
        Ok(layout)
    }
}
