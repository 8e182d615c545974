//! The live view: one poller re-reads the store (a plan, and what the train stages appended
//! to their `metrics.jsonl`), and every connected page gets what changed as server-sent
//! events.
//!
//! Events (`event:` name, JSON `data:`):
//! - `status`: a [`Status`] (every stage's state, interruptions, preflight verdicts), first on
//!   connecting and whenever a state changes;
//! - `metrics`: a [`MetricsUpdate`]: a train stage's records from index `from` on. `from: 0`
//!   replaces what the page holds (a new identity, or a resumed stage that dropped the steps
//!   after its checkpoint).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::sse::Event;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::watch;
use zflow_pipeline::Engine;
use zflow_stages::train::Record;

use crate::views::{self, Status};

/// What the poller last saw.
#[derive(Clone)]
pub struct Snapshot {
    /// Every stage's state.
    pub status: Arc<Status>,
    /// Each train stage's records so far.
    pub curves: BTreeMap<String, Curve>,
}

/// One train stage's records as the poller holds them.
#[derive(Clone)]
pub struct Curve {
    /// The folder read.
    pub folder: PathBuf,
    /// Bumped whenever the records were read again from the start.
    pub generation: u64,
    /// The records.
    pub records: Arc<Vec<Record>>,
}

/// The `data:` of a `metrics` event.
#[derive(Serialize)]
pub struct MetricsUpdate<'a> {
    /// The train stage.
    pub stage: &'a str,
    /// The index of the first record sent; 0 replaces the page's records.
    pub from: usize,
    /// The records.
    pub records: &'a [Record],
}

/// Starts the poller: while a page is connected, it re-reads the store every `every` (or less
/// often when a plan takes long: at most a quarter of the time goes to polling).
pub fn start(engine: Arc<Engine>, every: Duration) -> watch::Receiver<Option<Arc<Snapshot>>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut readers: BTreeMap<String, CurveReader> = BTreeMap::new();
        let mut generation = 0u64;
        loop {
            // Nobody is looking (the server itself holds one receiver): no plans.
            if tx.receiver_count() <= 1 {
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            let started = Instant::now();
            let engine2 = engine.clone();
            let status = tokio::task::spawn_blocking(move || views::status(&engine2)).await;
            match status {
                Ok(Ok(status)) => {
                    let mut curves = BTreeMap::new();
                    for (stage, folder) in status.train_folders() {
                        let r = readers
                            .entry(stage.to_string())
                            .or_insert_with(|| CurveReader::new(folder));
                        if r.folder != folder {
                            *r = CurveReader::new(folder);
                        }
                        if r.poll() {
                            generation += 1;
                            r.generation = generation;
                        }
                        curves.insert(stage.to_string(), r.curve());
                    }
                    readers.retain(|stage, _| curves.contains_key(stage));
                    let snap = Arc::new(Snapshot {
                        status: Arc::new(status),
                        curves,
                    });
                    if tx.send(Some(snap)).is_err() {
                        return;
                    }
                }
                Ok(Err(e)) => tracing::warn!("ui: reading the store: {e:#}"),
                Err(e) => tracing::warn!("ui: the store reader panicked: {e}"),
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(every.max(started.elapsed() * 3)).await;
        }
    });
    rx
}

/// Reads a train stage's `metrics.jsonl` incrementally: appended lines are parsed once; a
/// rewritten file (new inode, or shorter than what was read) is read again from the start.
struct CurveReader {
    folder: PathBuf,
    inode: u64,
    offset: u64,
    records: Vec<Record>,
    generation: u64,
    /// The records as last published (rebuilt only when they changed).
    published: Arc<Vec<Record>>,
}

impl CurveReader {
    fn new(folder: &Path) -> CurveReader {
        CurveReader {
            folder: folder.to_path_buf(),
            inode: 0,
            offset: 0,
            records: Vec::new(),
            generation: 0,
            published: Arc::new(Vec::new()),
        }
    }

    /// Reads what is new; true when the records were read again from the start.
    fn poll(&mut self) -> bool {
        let path = self.folder.join("metrics.jsonl");
        let Ok(mut f) = std::fs::File::open(&path) else {
            let restarted = !self.records.is_empty();
            *self = CurveReader::new(&self.folder);
            return restarted;
        };
        let Ok(meta) = f.metadata() else { return false };
        let restarted = meta.ino() != self.inode || meta.len() < self.offset;
        if restarted {
            self.inode = meta.ino();
            self.offset = 0;
            self.records.clear();
        }
        if meta.len() == self.offset {
            return restarted;
        }
        let mut bytes = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut bytes).is_err() {
            return restarted;
        }
        // Only whole lines: the last one may still be being written.
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
        for line in bytes[..complete].split(|&b| b == b'\n') {
            if let Ok(r) = serde_json::from_slice::<Record>(line) {
                self.records.push(r);
            }
        }
        self.offset += complete as u64;
        restarted
    }

    fn curve(&mut self) -> Curve {
        if self.published.len() != self.records.len() {
            self.published = Arc::new(self.records.clone());
        }
        Curve {
            folder: self.folder.clone(),
            generation: self.generation,
            records: self.published.clone(),
        }
    }
}

/// The events a page that last saw `seen` needs to catch up with `now`.
fn catch_up(seen: Option<&Snapshot>, now: &Snapshot) -> Vec<Event> {
    let mut out = Vec::new();
    // Re-sent every few seconds anyway, so the page's "12s ago"s stay about right.
    if seen.is_none_or(|s| {
        !s.status.same_as(&now.status) || now.status.taken_ms - s.status.taken_ms >= 10_000
    }) {
        out.push(json_event("status", &*now.status));
    }
    for (stage, curve) in &now.curves {
        let before = seen.and_then(|s| s.curves.get(stage));
        let from = match before {
            Some(b) if b.folder == curve.folder && b.generation == curve.generation => {
                b.records.len()
            }
            _ => 0,
        };
        if from < curve.records.len()
            || (from == 0 && before.is_some_and(|b| !b.records.is_empty()))
        {
            out.push(json_event(
                "metrics",
                &MetricsUpdate {
                    stage,
                    from,
                    records: &curve.records[from..],
                },
            ));
        }
    }
    out
}

fn json_event(name: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(data).expect("views serialize"))
}

/// The event stream of one page.
pub fn stream(
    rx: watch::Receiver<Option<Arc<Snapshot>>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((rx, None::<Arc<Snapshot>>), |(mut rx, seen)| async move {
        loop {
            let now = rx.borrow_and_update().clone();
            if let Some(now) = now {
                let events = catch_up(seen.as_deref(), &now);
                if !events.is_empty() {
                    let items = futures_util::stream::iter(events.into_iter().map(Ok));
                    return Some((items, (rx, Some(now))));
                }
            }
            rx.changed().await.ok()?;
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn step(n: u64) -> String {
        format!(
            r#"{{"type":"eval","step":{n},"losses":[["prose",{}]]}}"#,
            5.0 - n as f64 / 10.0
        )
    }

    #[test]
    fn appended_lines_are_read_once_and_a_rewrite_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut r = CurveReader::new(dir.path());
        assert!(!r.poll());
        std::fs::write(&path, format!("{}\n{}\n", step(1), step(2))).unwrap();
        assert!(r.poll());
        assert_eq!(r.records.len(), 2);
        // A torn line waits for its end.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let line = step(3);
        f.write_all(&line.as_bytes()[..10]).unwrap();
        assert!(!r.poll());
        assert_eq!(r.records.len(), 2);
        f.write_all(format!("{}\n", &line[10..]).as_bytes())
            .unwrap();
        assert!(!r.poll());
        assert_eq!(r.records.len(), 3);
        // A resume rewrites the file (atomically: a new inode) with fewer lines.
        let tmp = dir.path().join("m.tmp");
        std::fs::write(&tmp, format!("{}\n", step(1))).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert!(r.poll());
        assert_eq!(r.records.len(), 1);
    }
}
