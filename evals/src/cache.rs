//! The request cache: every scored request, on disk, so an interrupted evaluation resumes at
//! request level and nothing scored is ever scored again.
//!
//! One append-only JSON-lines file per model identity (`<dir>/<hash of identity>.jsonl`); each
//! line is `{"key": <hex>, ...value}` with the key a blake3 of (model identity, request). Lines
//! are written as results arrive and fsynced every [`SYNC_EVERY`] records (or seconds) and when
//! the cache is dropped, so a crash loses at most that much work. A torn last line (a crash
//! mid-write) is cut off when the file is reopened; any other unreadable line is an error.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::model::Score;
use crate::request::Request;

/// fsync after this many new records (or [`SYNC_INTERVAL`]), whichever comes first.
pub const SYNC_EVERY: usize = 512;
/// fsync at least this often while records arrive.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(10);

/// A cache key: blake3 of the model identity and the request.
pub type Key = [u8; 32];

/// What is cached for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cached {
    /// A loglikelihood (one rolling text sums its windows before caching).
    Score(Score),
    /// A generation.
    Text {
        /// The generated text, stop sequence removed.
        text: String,
    },
}

#[derive(Serialize, Deserialize)]
struct Line {
    key: String,
    #[serde(flatten)]
    value: Cached,
}

/// The cache of one model.
pub struct Cache {
    path: PathBuf,
    file: File,
    map: HashMap<Key, Cached>,
    identity: String,
    unsynced: usize,
    last_sync: Instant,
}

impl Cache {
    /// Opens (or creates) the cache of the model `identity` under `dir`.
    pub fn open(dir: &Path, identity: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating cache folder {}", dir.display()))?;
        let name = &blake3::hash(identity.as_bytes()).to_hex()[..24];
        let path = dir.join(format!("{name}.jsonl"));
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .with_context(|| format!("opening cache {}", path.display()))?;
        let map = read_all(&mut file, &path)?;
        Ok(Cache {
            path,
            file,
            map,
            identity: identity.to_string(),
            unsynced: 0,
            last_sync: Instant::now(),
        })
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of cached requests.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The key of `request` for this cache's model.
    pub fn key(&self, request: &Request) -> Key {
        key(&self.identity, request)
    }

    /// The cached result of a request, if any.
    pub fn get(&self, key: &Key) -> Option<&Cached> {
        self.map.get(key)
    }

    /// Records a result (appended now, fsynced per the module docs).
    pub fn put(&mut self, key: Key, value: Cached) -> Result<()> {
        let line = Line {
            key: hex(&key),
            value: value.clone(),
        };
        let mut text = serde_json::to_string(&line)?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .with_context(|| format!("appending to cache {}", self.path.display()))?;
        self.map.insert(key, value);
        self.unsynced += 1;
        if self.unsynced >= SYNC_EVERY || self.last_sync.elapsed() >= SYNC_INTERVAL {
            self.sync()?;
        }
        Ok(())
    }

    /// Flushes everything written so far to disk.
    pub fn sync(&mut self) -> Result<()> {
        if self.unsynced > 0 {
            self.file
                .sync_data()
                .with_context(|| format!("fsync of cache {}", self.path.display()))?;
            self.unsynced = 0;
        }
        self.last_sync = Instant::now();
        Ok(())
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = self.sync();
    }
}

/// blake3 of the canonical JSON of (identity, request).
pub fn key(identity: &str, request: &Request) -> Key {
    let json = serde_json::to_vec(&(identity, request)).expect("requests serialise");
    *blake3::hash(&json).as_bytes()
}

fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Key> {
    if s.len() != 64 {
        return None;
    }
    let mut k = [0u8; 32];
    for (i, byte) in k.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(k)
}

fn read_all(file: &mut File, path: &Path) -> Result<HashMap<Key, Cached>> {
    let mut map = HashMap::new();
    let mut reader = BufReader::new(&mut *file);
    let mut buf = Vec::new();
    let mut good_end = 0u64;
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buf.last() != Some(&b'\n') {
            // A torn write: the process died mid-line. Everything before it is good.
            break;
        }
        let line: Line = serde_json::from_slice(&buf).with_context(|| {
            format!(
                "cache {} line {line_no} is corrupt; delete the file to start over",
                path.display()
            )
        })?;
        let Some(k) = unhex(&line.key) else {
            bail!(
                "cache {} line {line_no}: bad key {:?}",
                path.display(),
                line.key
            );
        };
        map.insert(k, line.value);
        good_end += n as u64;
    }
    drop(reader);
    if file.metadata()?.len() > good_end {
        file.set_len(good_end)
            .with_context(|| format!("cutting the torn end of cache {}", path.display()))?;
    }
    file.seek(SeekFrom::End(0))?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(c: &str) -> Request {
        Request::Loglikelihood {
            context: "ctx".into(),
            continuation: c.into(),
        }
    }

    #[test]
    fn survives_reopen_and_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let score = Score {
            logprob: -1.2345678901234567,
            is_greedy: true,
        };
        {
            let mut c = Cache::open(dir.path(), "model-a").unwrap();
            let k = c.key(&req(" a"));
            c.put(k, Cached::Score(score)).unwrap();
            let k = c.key(&Request::Generate {
                context: "q".into(),
                until: vec![],
                max_gen_toks: 3,
            });
            c.put(
                k,
                Cached::Text {
                    text: "x\ny".into(),
                },
            )
            .unwrap();
        }
        let path = {
            let c = Cache::open(dir.path(), "model-a").unwrap();
            assert_eq!(c.len(), 2);
            assert_eq!(
                c.get(&c.key(&req(" a"))),
                Some(&Cached::Score(score)),
                "f64 round-trips exactly"
            );
            c.path().to_path_buf()
        };
        // Simulate a crash mid-write.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"key\":\"00").unwrap();
        drop(f);
        let mut c = Cache::open(dir.path(), "model-a").unwrap();
        assert_eq!(c.len(), 2);
        let k = c.key(&req(" b"));
        c.put(k, Cached::Score(score)).unwrap();
        drop(c);
        assert_eq!(Cache::open(dir.path(), "model-a").unwrap().len(), 3);
        // Another model does not see these entries.
        let other = Cache::open(dir.path(), "model-b").unwrap();
        assert!(other.is_empty());
        assert_ne!(other.key(&req(" a")), key("model-a", &req(" a")));
    }

    #[test]
    fn corrupt_middle_line_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = {
            let c = Cache::open(dir.path(), "m").unwrap();
            c.path().to_path_buf()
        };
        std::fs::write(&path, "not json\n{}\n").unwrap();
        let err = format!("{:#}", Cache::open(dir.path(), "m").err().unwrap());
        assert!(
            err.contains(&path.display().to_string()) && err.contains("line 1"),
            "{err}"
        );
    }
}
