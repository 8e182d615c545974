//! What the tests of the PyTorch worker's Python side share.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// Runs `python3 -m zflow_torch.<module> <args>` from `workers/torch` and returns its stdout,
/// failing the test (with the Python error) if it does not succeed.
pub fn zflow_torch<I, S>(module: &str, args: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let workers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workers/torch");
    let out = Command::new("python3")
        .current_dir(&workers)
        .arg("-m")
        .arg(format!("zflow_torch.{module}"))
        .args(args)
        .output()
        .expect("this test needs python3 on PATH");
    assert!(
        out.status.success(),
        "python3 -m zflow_torch.{module} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
