//! A Hugging Face folder's weights: `model.safetensors`, or the shards its
//! `model.safetensors.index.json` lists (how Llama-3-8B, Qwen3-4B, Gemma-3-12B and ZAYA1 at full
//! size ship), memory-mapped; and their content hash, taken tensor by tensor from the maps.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};
use safetensors::SafeTensors;
use serde_json::Value;

/// The most bytes of `model.safetensors.index.json` read: Llama-3-405B's is under 2 MB.
const INDEX_BYTES: u64 = 64 << 20;

/// The mapped safetensors files of a Hugging Face folder, in the index's shard order (sorted
/// by name).
pub struct HfFiles {
    /// Each file's map and path.
    pub files: Vec<(memmap2::Mmap, PathBuf)>,
}

impl HfFiles {
    /// Maps `dir`'s `model.safetensors`, or else every shard its
    /// `model.safetensors.index.json` names. A shard is a plain file name in `dir`: a name
    /// with a path in it (`../x`, `/etc/x`) is refused, naming the index and the name.
    pub fn open(dir: &Path) -> Result<HfFiles> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let v: Value =
                serde_json::from_slice(&zflow_files::read::bounded(&index, INDEX_BYTES)?)
                    .with_context(|| format!("{}: not JSON", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| anyhow!("{}: no `weight_map` object", index.display()))?;
            let mut shards = BTreeSet::new();
            for (tensor, shard) in map {
                let shard = shard.as_str().ok_or_else(|| {
                    anyhow!(
                        "{}: `weight_map.{tensor}` is {shard}, expected a file name",
                        index.display()
                    )
                })?;
                ensure!(
                    Path::new(shard).file_name() == Some(shard.as_ref()),
                    "{}: `weight_map.{tensor}` is `{shard}`, expected a file name in the folder",
                    index.display()
                );
                shards.insert(shard);
            }
            ensure!(
                !shards.is_empty(),
                "{}: `weight_map` is empty",
                index.display()
            );
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            bail!(
                "{}: neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            );
        };
        let files = paths
            .into_iter()
            .map(|p| Ok((zflow_files::map::read_only(&p)?, p)))
            .collect::<Result<_>>()?;
        Ok(HfFiles { files })
    }

    /// Each file's parsed table of tensors, with its path.
    pub fn tables(&self) -> Result<Vec<(&Path, SafeTensors<'_>)>> {
        self.files
            .iter()
            .map(|(map, p)| {
                let table = SafeTensors::deserialize(map)
                    .with_context(|| format!("{}: not a safetensors file", p.display()))?;
                Ok((p.as_path(), table))
            })
            .collect()
    }

    /// A BLAKE3 hash (hex) of the weights: every tensor's name, dtype, shape and bytes, in name
    /// order. It reads the maps, so it costs no memory beyond the page cache, and it does not
    /// depend on how the tensors are split into shards or ordered in a file, or on a file's
    /// metadata. A tensor in two shards is refused.
    pub fn content_hash(&self) -> Result<String> {
        let tables = self.tables()?;
        let mut by_name = std::collections::BTreeMap::new();
        for (p, t) in &tables {
            for (name, view) in t.tensors() {
                if by_name.insert(name.clone(), view).is_some() {
                    bail!("{}: tensor `{name}` is in two shards", p.display());
                }
            }
        }
        let mut hasher = blake3::Hasher::new();
        for (name, view) in by_name {
            let header = serde_json::json!([name, format!("{:?}", view.dtype()), view.shape()]);
            let header = header.to_string();
            hasher.update(&(header.len() as u64).to_le_bytes());
            hasher.update(header.as_bytes());
            hasher.update(&(view.data().len() as u64).to_le_bytes());
            hasher.update(view.data());
        }
        Ok(hasher.finalize().to_hex().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;

    fn write(path: &Path, tensors: &[(&str, &[f32])]) {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((n, v), b)| (*n, TensorView::new(Dtype::F32, vec![v.len()], b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn a_sharded_folder_hashes_as_its_single_file() {
        let (a, b) = ([1.0f32, 2.0], [3.0f32]);
        let single = tempfile::tempdir().unwrap();
        write(
            &single.path().join("model.safetensors"),
            &[("a", &a), ("b", &b)],
        );
        let sharded = tempfile::tempdir().unwrap();
        write(&sharded.path().join("s-1.safetensors"), &[("b", &b)]);
        write(&sharded.path().join("s-2.safetensors"), &[("a", &a)]);
        std::fs::write(
            sharded.path().join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"a": "s-2.safetensors", "b": "s-1.safetensors"}}"#,
        )
        .unwrap();
        let hash = |d: &Path| HfFiles::open(d).unwrap().content_hash().unwrap();
        assert_eq!(hash(single.path()), hash(sharded.path()));
        // One value changed is another hash.
        write(
            &single.path().join("model.safetensors"),
            &[("a", &a), ("b", &[4.0])],
        );
        assert_ne!(hash(single.path()), hash(sharded.path()));
    }

    #[test]
    fn an_index_that_names_a_path_or_a_tensor_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        std::fs::write(&index, r#"{"weight_map": {"a": "../outside.safetensors"}}"#).unwrap();
        let err = format!("{:#}", HfFiles::open(dir.path()).err().unwrap());
        assert!(
            err.contains("`weight_map.a` is `../outside.safetensors`, expected a file name"),
            "{err}"
        );
        write(&dir.path().join("s-1.safetensors"), &[("a", &[1.0])]);
        write(&dir.path().join("s-2.safetensors"), &[("a", &[1.0])]);
        std::fs::write(
            &index,
            r#"{"weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors"}}"#,
        )
        .unwrap();
        let err = format!(
            "{:#}",
            HfFiles::open(dir.path())
                .unwrap()
                .content_hash()
                .unwrap_err()
        );
        assert!(err.contains("tensor `a` is in two shards"), "{err}");
    }
}
