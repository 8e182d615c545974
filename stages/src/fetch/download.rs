//! Downloads: the store's download cache with its lock, sha256 pins, HTTP, pip, npm and apt,
//! and unpacking archives.

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use zflow_pipeline::StageContext;

pub(super) fn sha256_file(path: &Path) -> Result<String> {
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

pub(super) fn check_sha(path: &Path, pin: &str) -> Result<()> {
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
pub(super) fn cached_download(
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

pub(super) fn single_file(dir: &Path, spec: &str) -> Result<PathBuf> {
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
pub(super) fn apt_download(ctx: &StageContext, spec: &str, dir: &Path) -> Result<PathBuf> {
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
pub(super) fn apt_versions(name: &str) -> Vec<String> {
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

pub(super) fn run_tool(ctx: &StageContext, cmd: Command, what: &str, hint: &str) -> Result<()> {
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

pub(super) fn http_get(ctx: &StageContext, url: &str, dest: &Path) -> Result<()> {
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
pub(super) fn unzip_path(zip_path: &Path, prefix: &str, out: &Path) -> Result<()> {
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
pub(super) fn unpack_dir(ctx: &StageContext, prefix: &str) -> Result<tempfile::TempDir> {
    tempdir_in(ctx.out_dir().parent().unwrap_or(Path::new(".")), prefix)
}

/// `archive` (a `.tar.gz`: an npm tarball, an sdist) unpacked by `tar` into a fresh folder.
pub(super) fn untar(ctx: &StageContext, archive: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    let unpacked = unpack_dir(ctx, prefix)?;
    let mut cmd = Command::new("tar");
    cmd.arg("-xzf").arg(archive).arg("-C").arg(unpacked.path());
    run_tool(ctx, cmd, "tar -xzf", "install tar")?;
    Ok(unpacked)
}

pub(super) fn tempdir_in(parent: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    fs::create_dir_all(parent)?;
    Ok(tempfile::Builder::new()
        .prefix(&format!(".{prefix}-"))
        .tempdir_in(parent)?)
}

/// An exclusive advisory lock on a file, released on drop (and by the kernel on death).
pub(super) struct FileLock(#[allow(dead_code)] fs::File);

impl FileLock {
    pub(super) fn acquire(path: &Path) -> Result<FileLock> {
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
