//! What an ingest stage keeps of each document: NFC, length limits, the quality filters
//! ([`crate::filters`]), exact and near dedup, in that order, counting every drop by rule and
//! every edit (C4's removed lines, redacted addresses) by filter.

use std::collections::{HashMap, HashSet};

use unicode_normalization::UnicodeNormalization;

use super::IngestConfig;
use crate::decontaminate::{Action, NgramSet};
use crate::ingest_stats::IngestStats;
use crate::minhash::{MinHasher, similarity};

/// NFC, length limits, filters and dedup, in that order, one document at a time, counting drops.
pub(super) struct Cleaner<'a> {
    c: &'a IngestConfig,
    seen: HashSet<[u8; 32]>,
    pub(super) stats: IngestStats,
    /// Of a deduplicated shard: every kept document's hash, for the source's dedup stage.
    pub(super) hashes: Option<Vec<crate::dedup::DocHash>>,
    /// With `near_dedup`: what near-duplicate detection keeps.
    pub(super) near: Option<Near>,
    /// With `decontaminate`: the eval tasks' test n-grams.
    ngrams: Option<NgramSet>,
    /// With `decontaminate: {action: flag}`: (document id, tasks) of each kept document that
    /// overlaps a task.
    pub(super) flagged: Vec<(u64, Vec<String>)>,
    /// The tasks the document being cleaned overlaps, until it is kept or dropped.
    pending_flag: Option<Vec<String>>,
}

/// Near-duplicate detection in an ingest stage ([`crate::minhash`]).
pub(super) enum Near {
    /// Unsharded: drop a document verified similar to the first earlier document that had one
    /// of its bands.
    Drop {
        hasher: MinHasher,
        jaccard: f64,
        /// Band -> the first document (index into `signatures`) that had it.
        first: HashMap<[u8; 16], u32>,
        /// Every document's signature, dropped ones too (a band points at its first).
        signatures: Vec<Vec<u64>>,
    },
    /// A shard: record every kept document's bands and signature for the source's dedup stage.
    Record {
        hasher: MinHasher,
        bands: Vec<crate::dedup::DocHash>,
        /// The kept documents' signatures, one after another (`bands * rows` values each).
        signatures: Vec<u64>,
    },
}

impl<'a> Cleaner<'a> {
    pub(super) fn new(c: &'a IngestConfig, ngrams: Option<NgramSet>) -> Self {
        let near = c.near_dedup.map(|settings| {
            let hasher = MinHasher::new(settings);
            match c.shard {
                None => Near::Drop {
                    hasher,
                    jaccard: settings.jaccard,
                    first: HashMap::new(),
                    signatures: Vec::new(),
                },
                Some(_) => Near::Record {
                    hasher,
                    bands: Vec::new(),
                    signatures: Vec::new(),
                },
            }
        });
        let mut rules = vec!["filter", "empty", "min_chars", "max_chars"];
        rules.extend(c.filters.drop_rules());
        if c.decontaminate.as_ref().map(|d| d.action) == Some(Action::Remove) {
            rules.push("decontaminate");
        }
        rules.push("duplicate");
        if matches!(near, Some(Near::Drop { .. })) {
            rules.push("near_duplicate");
        }
        let dropped = rules.iter().map(|r| (r.to_string(), 0, 0)).collect();
        Cleaner {
            c,
            seen: HashSet::new(),
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
            hashes: (c.shard.is_some() && c.dedup).then(Vec::new),
            near,
            ngrams,
            flagged: Vec::new(),
            pending_flag: None,
        }
    }

    /// Whether `text` is a near duplicate of an earlier document (unsharded); a shard records
    /// the bands of the document it is about to keep instead, and says no.
    fn near_duplicate(&mut self, text: &str) -> bool {
        let doc = self.stats.docs_out;
        match &mut self.near {
            None => false,
            Some(Near::Drop {
                hasher,
                jaccard,
                first,
                signatures,
            }) => {
                let signature = hasher.signature(text);
                let me = signatures.len() as u32;
                let mut hit = false;
                for band in hasher.bands_of(&signature) {
                    match first.entry(band) {
                        std::collections::hash_map::Entry::Occupied(e) => {
                            hit = hit
                                || similarity(&signature, &signatures[*e.get() as usize])
                                    >= *jaccard;
                        }
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(me);
                        }
                    }
                }
                signatures.push(signature);
                hit
            }
            Some(Near::Record {
                hasher,
                bands,
                signatures,
            }) => {
                let bytes = text.len() as u64;
                let mut signature = hasher.signature(text);
                bands.extend(
                    hasher
                        .bands_of(&signature)
                        .into_iter()
                        .map(|hash| crate::dedup::DocHash { hash, doc, bytes }),
                );
                // Fixed-size records: a wordless text (no bands, never a candidate) pads.
                signature.resize(hasher.signature_len(), u64::MAX);
                signatures.extend(signature);
                false
            }
        }
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
    pub(super) fn keep(&mut self, text: String) -> Option<String> {
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
            // One hash per text: the stage's own dedup set and a shard's record share it.
            let hash = c.dedup.then(|| blake3::hash(text.as_bytes()));
            if hash.is_some_and(|h| !self.seen.insert(*h.as_bytes())) {
                "duplicate"
            } else if self.near_duplicate(&text) {
                "near_duplicate"
            } else {
                if let (Some(hashes), Some(h)) = (&mut self.hashes, &hash) {
                    let bytes = text.len() as u64;
                    hashes.push(crate::dedup::DocHash::of(h, self.stats.docs_out, bytes));
                }
                if let Some(tasks) = self.pending_flag.take() {
                    self.flagged.push((self.stats.docs_out, tasks));
                }
                self.stats.docs_out += 1;
                self.stats.bytes_out += text.len() as u64;
                return Some(text);
            }
        };
        self.pending_flag = None;
        if let Some(entry) = self.stats.dropped.iter_mut().find(|(r, _, _)| r == rule) {
            entry.1 += 1;
            entry.2 += bytes;
        }
        None
    }
}
