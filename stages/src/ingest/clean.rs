//! What an ingest stage keeps of each document: NFC, length limits, the quality filters
//! ([`crate::filters`]), exact dedup within a run, in that order, counting every drop by rule
//! and every edit (C4's removed lines, redacted addresses) by filter; and the records of the
//! kept documents that the source's `dedup` stage deduplicates over the whole source
//! ([`crate::dedup`]).

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Result;
use unicode_normalization::UnicodeNormalization;

use super::IngestConfig;
use crate::decontaminate::{Action, NgramSet};
use crate::ingest_stats::IngestStats;
use crate::minhash::MinHasher;
use crate::sorted_runs::{DocHash, RunWriter};

/// NFC, length limits, filters and dedup, in that order, one document at a time, counting drops.
pub(super) struct Cleaner<'a> {
    c: &'a IngestConfig,
    pub(super) stats: IngestStats,
    /// With `dedup`: the kept documents' text hashes.
    exact: Option<Exact>,
    /// With `near_dedup`: the kept documents' bands and signatures.
    near: Option<Near>,
    /// With `decontaminate`: the eval tasks' test n-grams.
    ngrams: Option<NgramSet>,
    /// With `decontaminate: {action: flag}`: each kept document that overlaps a task.
    flagged: Flagged,
    /// The tasks the document being cleaned overlaps, until it is kept or dropped.
    pending_flag: Option<Vec<String>>,
}

/// (document id, the tasks it overlaps) of each kept document that overlaps an eval task.
pub(super) type Flagged = Vec<(u64, Vec<String>)>;

/// Exact dedup in memory bounded by a run: the hashes of the documents kept since the last run
/// went to disk, where a repeat is dropped at once; every kept document's record goes into a
/// sorted run (`hashes/`), and the `dedup` stage's merge drops the repeats in other runs.
struct Exact {
    in_run: HashSet<[u8; 16]>,
    runs: RunWriter,
}

/// Near-dedup records ([`crate::minhash`]): every kept document's bands in sorted runs
/// (`bands/`) and its signature (`signatures.bin`, in document order), which the `dedup` stage
/// clusters.
struct Near {
    hasher: MinHasher,
    bands: RunWriter,
    signatures: BufWriter<std::fs::File>,
}

impl<'a> Cleaner<'a> {
    /// A cleaner writing its dedup records under `out` (the stage's output folder).
    pub(super) fn new(c: &'a IngestConfig, ngrams: Option<NgramSet>, out: &Path) -> Result<Self> {
        let run = c.dedup_run_records;
        let exact = c
            .dedup
            .then(|| -> Result<Exact> {
                Ok(Exact {
                    in_run: HashSet::new(),
                    runs: RunWriter::create(out.join(crate::dedup::EXACT), run)?,
                })
            })
            .transpose()?;
        let near = c
            .near_dedup
            .map(|settings| -> Result<Near> {
                let path = out.join(crate::dedup::SIGNATURES);
                Ok(Near {
                    hasher: MinHasher::new(settings),
                    bands: RunWriter::create(out.join(crate::dedup::NEAR), run)?,
                    signatures: BufWriter::new(std::fs::File::create(path)?),
                })
            })
            .transpose()?;
        let mut rules = vec!["filter", "empty", "min_chars", "max_chars"];
        rules.extend(c.filters.drop_rules());
        if c.decontaminate.as_ref().map(|d| d.action) == Some(Action::Remove) {
            rules.push("decontaminate");
        }
        rules.push("duplicate");
        let dropped = rules.iter().map(|r| (r.to_string(), 0, 0)).collect();
        Ok(Cleaner {
            c,
            stats: IngestStats {
                dropped,
                contamination: ngrams
                    .as_ref()
                    .map(|set| set.tasks.iter().map(|t| (t.clone(), 0, 0)).collect())
                    .unwrap_or_default(),
                edited: [
                    (c.filters.c4.is_some(), crate::filters::c4::RULE),
                    (c.filters.pii.is_some(), crate::filters::pii::RULE),
                ]
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, rule)| (rule.to_string(), 0, 0, 0))
                .collect(),
                ..Default::default()
            },
            exact,
            near,
            ngrams,
            flagged: Vec::new(),
            pending_flag: None,
        })
    }

    /// Whether the text whose hash is `hash` repeats a document of the current run (and if not,
    /// notes it there).
    fn repeats(&mut self, hash: &blake3::Hash) -> bool {
        let key = DocHash::of(hash, 0, 0).hash;
        self.exact.as_mut().is_some_and(|e| !e.in_run.insert(key))
    }

    /// Records a document about to be kept as document `doc`: its text hash in the exact runs,
    /// its bands and signature for near dedup.
    fn record(&mut self, hash: Option<blake3::Hash>, text: &str) -> Result<()> {
        let (doc, bytes) = (self.stats.docs_out, text.len() as u64);
        if let (Some(exact), Some(h)) = (&mut self.exact, hash)
            && exact.runs.push(DocHash::of(&h, doc, bytes))?
        {
            exact.in_run.clear();
        }
        if let Some(near) = &mut self.near {
            let mut signature = near.hasher.signature(text);
            for hash in near.hasher.bands_of(&signature) {
                near.bands.push(DocHash { hash, doc, bytes })?;
            }
            // Fixed-size records: a wordless text (no bands, never a candidate) pads.
            signature.resize(near.hasher.signature_len(), u64::MAX);
            for v in signature {
                near.signatures.write_all(&v.to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// Writes the last runs and the signatures.
    pub(super) fn finish(self) -> Result<(IngestStats, Flagged)> {
        if let Some(exact) = self.exact {
            exact.runs.finish()?;
        }
        if let Some(near) = self.near {
            near.bands.finish()?;
            near.signatures.into_inner()?.sync_all()?;
        }
        Ok((self.stats, self.flagged))
    }

    /// Runs the quality filters ([`crate::filters`]) on `text`, editing it in place (C4's line
    /// removal, PII redaction) and counting the edits; `Some(rule)` when one drops it.
    fn filter(&mut self, text: &mut String) -> Option<&'static str> {
        if self.c.filters.is_empty() {
            return None;
        }
        let bytes = text.len() as u64;
        let outcome = self.c.filters.apply(std::mem::take(text));
        let Some(kept) = outcome.kept else {
            return outcome.dropped_by;
        };
        *text = kept;
        for (rule, edits) in [
            (crate::filters::c4::RULE, outcome.c4_lines_removed),
            (crate::filters::pii::RULE, outcome.pii_redactions),
        ] {
            if edits > 0
                && let Some(e) = self.stats.edited.iter_mut().find(|e| e.0 == rule)
            {
                e.1 += 1;
                e.2 += bytes;
                e.3 += edits;
            }
        }
        None
    }

    /// Whether `text` overlaps an eval task's test documents and is to be removed: counted per
    /// task either way; a flagged one is listed (under the id it is about to get, if it is
    /// not dropped as a duplicate after).
    fn contaminated(&mut self, text: &str) -> bool {
        let Some(set) = &self.ngrams else {
            return false;
        };
        let tasks = set.overlaps(text);
        if tasks.is_empty() {
            return false;
        }
        let remove = self.c.decontaminate.as_ref().map(|d| d.action) == Some(Action::Remove);
        for &t in &tasks {
            let entry = &mut self.stats.contamination[t as usize];
            entry.1 += 1;
            entry.2 += u64::from(remove);
        }
        if !remove {
            let names = tasks
                .iter()
                .map(|&t| set.tasks[t as usize].clone())
                .collect();
            self.pending_flag = Some(names);
        }
        remove
    }

    /// The cleaned text, or `None` (counted under its rule) when a rule drops it.
    pub(super) fn keep(&mut self, text: String) -> Result<Option<String>> {
        let c = self.c;
        self.stats.bytes_in += text.len() as u64;
        let mut text: String = if c.nfc { text.nfc().collect() } else { text };
        // A dropped document counts its bytes as read (after NFC), before any filter's edit.
        let bytes = text.len() as u64;
        let chars = text.trim().chars().count();
        let rule = if chars == 0 {
            "empty"
        } else if chars < c.min_chars {
            "min_chars"
        } else if c.max_chars.is_some_and(|m| chars > m) {
            "max_chars"
        } else if let Some(rule) = self.filter(&mut text) {
            rule
        } else if self.contaminated(&text) {
            "decontaminate"
        } else {
            // One hash per text: the run's set and the record share it.
            let hash = c.dedup.then(|| blake3::hash(text.as_bytes()));
            if hash.as_ref().is_some_and(|h| self.repeats(h)) {
                "duplicate"
            } else {
                self.record(hash, &text)?;
                if let Some(tasks) = self.pending_flag.take() {
                    self.flagged.push((self.stats.docs_out, tasks));
                }
                self.stats.docs_out += 1;
                self.stats.bytes_out += text.len() as u64;
                return Ok(Some(text));
            }
        };
        self.pending_flag = None;
        if let Some(entry) = self.stats.dropped.iter_mut().find(|(r, _, _)| r == rule) {
            entry.1 += 1;
            entry.2 += bytes;
        }
        Ok(None)
    }
}
