//! Asynchronous checkpoint saving: the training thread snapshots the state into host memory
//! (serialised bytes), and a background thread writes, fsyncs, hashes and commits it while
//! training goes on. One save is in flight at a time; the next save, a rollback and the end
//! of the phase wait for it, and its error (a full disk, say) fails the run there.
//!
//! With several ranks every rank writes its own files into the shared temporary directory and
//! votes with `part-R.json`; rank 0 commits once all have voted
//! ([`checkpoint::finish_parts`]). A rank that dies mid-write leaves an uncommitted temporary
//! directory, which the next attempt removes.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use crate::checkpoint;
use crate::contract::protocol::{Emit, WorkerMessage};
use crate::trainer::faults::{self, Faults, Kind};

/// How long rank 0 waits for the other ranks' parts of a checkpoint.
const PART_TIMEOUT: Duration = Duration::from_secs(900);

/// One checkpoint, serialised.
pub struct Snapshot {
    /// Step of the checkpoint.
    pub step: u64,
    /// This rank's files (name, bytes).
    pub files: Vec<(String, Vec<u8>)>,
}

/// Writes snapshots in the background.
pub struct Saver {
    root: PathBuf,
    rank: usize,
    world: usize,
    keep: usize,
    asynchronous: bool,
    faults: Faults,
    emit: Emit,
    in_flight: Option<JoinHandle<Result<()>>>,
}

impl Saver {
    /// A saver for checkpoints under `root`, keeping the newest `keep`.
    pub fn new(
        root: PathBuf,
        rank: usize,
        world: usize,
        keep: usize,
        asynchronous: bool,
        faults: Faults,
        emit: Emit,
    ) -> Saver {
        Saver {
            root,
            rank,
            world,
            keep: keep.max(1),
            asynchronous,
            faults,
            emit,
            in_flight: None,
        }
    }

    /// Starts saving `snapshot` (after the previous save finished); with `asynchronous` off,
    /// or when `wait` is set, returns only once it is committed.
    pub fn save(&mut self, snapshot: Snapshot, wait: bool) -> Result<()> {
        self.wait()?;
        let (root, rank, world, keep, faults, emit) = (
            self.root.clone(),
            self.rank,
            self.world,
            self.keep,
            self.faults.clone(),
            self.emit.clone(),
        );
        let work = move || write(&root, rank, world, keep, &faults, &emit, snapshot);
        if self.asynchronous && !wait {
            self.in_flight = Some(
                std::thread::Builder::new()
                    .name("checkpoint-writer".into())
                    .spawn(work)?,
            );
            Ok(())
        } else {
            work()
        }
    }

    /// Waits for the save in flight, if any, and returns its result.
    pub fn wait(&mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow!("the checkpoint writer thread panicked"))?,
            None => Ok(()),
        }
    }
}

fn write(
    root: &std::path::Path,
    rank: usize,
    world: usize,
    keep: usize,
    faults: &Faults,
    emit: &Emit,
    s: Snapshot,
) -> Result<()> {
    let dir = root.join(checkpoint::dir_name(s.step));
    let tmp = checkpoint::tmp_dir(&dir);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if faults.at(Kind::KillInCheckpoint, s.step) {
        // Die with half of the files on disk: the commit must never happen.
        checkpoint::write_files(&tmp, &s.files[..s.files.len() / 2])?;
        faults::abort(&format!(
            "killed while writing the step-{} checkpoint",
            s.step
        ));
    }
    if world == 1 {
        let part = checkpoint::write_files(&tmp, &s.files)?;
        checkpoint::finish_with(&dir, part)?;
    } else {
        checkpoint::write_part(&dir, rank, &s.files)?;
        if rank == 0 {
            checkpoint::finish_parts(&dir, world, PART_TIMEOUT)?;
        }
    }
    if rank == 0 {
        if faults.at(Kind::CorruptCheckpoint, s.step) {
            corrupt(&dir.join("model.safetensors"))?;
        }
        checkpoint::retain(root, keep)?;
        emit(WorkerMessage::CheckpointCommitted {
            step: s.step,
            path: dir.display().to_string(),
        });
    }
    Ok(())
}

/// Flips one byte in the middle of `path` (fault injection: bit rot after the commit).
fn corrupt(path: &std::path::Path) -> Result<()> {
    let mut bytes = std::fs::read(path)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(path, bytes)?;
    eprintln!("fault injection: flipped a byte of {}", path.display());
    Ok(())
}
