//! Compute backends: burn's CPU `flex` backend always; CUDA and ROCm (HIP) behind the `cuda` and
//! `rocm` cargo features. GPU libraries load at run time, so both features build on a machine
//! without a GPU; [`probe`] checks a device is really there before burn touches it (burn panics
//! in a worker thread otherwise).

use anyhow::{Result, bail};

/// A backend a worker can train on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// burn's CPU backend (`flex`).
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// AMD GPUs through ROCm/HIP (ZAYA1's MI300X).
    Rocm,
}

impl BackendKind {
    /// Parses a recipe's `backend:` value.
    pub fn parse(name: &str) -> Result<BackendKind> {
        Ok(match name {
            "cpu" | "flex" => BackendKind::Cpu,
            "cuda" => BackendKind::Cuda,
            "rocm" | "hip" => BackendKind::Rocm,
            other => bail!("unknown backend `{other}`: expected cpu, cuda or rocm"),
        })
    }

    /// Whether this build of zflow includes the backend.
    pub fn compiled(self) -> bool {
        match self {
            BackendKind::Cpu => true,
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Rocm => cfg!(feature = "rocm"),
        }
    }
}

/// Checks that device `index` of `kind` can be used: the backend is compiled in, its driver
/// library loads, and the device exists. Returns a description such as "cuda:0 (1 device)".
pub fn probe(kind: BackendKind, index: usize) -> Result<String> {
    if !kind.compiled() {
        bail!(
            "backend {kind:?} is not compiled into this zflow; rebuild with `cargo build --features {}`",
            if kind == BackendKind::Cuda {
                "cuda"
            } else {
                "rocm"
            }
        );
    }
    let (lib, init, count_fn, name) = match kind {
        BackendKind::Cpu => return Ok(format!("cpu ({} threads)", rayon_threads())),
        BackendKind::Cuda => ("libcuda.so.1", Some("cuInit"), "cuDeviceGetCount", "cuda"),
        BackendKind::Rocm => ("libamdhip64.so", None, "hipGetDeviceCount", "rocm"),
    };
    let count = device_count(lib, init, count_fn)?;
    if index >= count {
        bail!("{name}: device {index} requested, but the driver reports {count} device(s)");
    }
    Ok(format!("{name}:{index} ({count} device(s))"))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Loads a GPU driver library with dlopen and asks it for the number of devices.
fn device_count(lib: &str, init: Option<&str>, count_fn: &str) -> Result<usize> {
    use std::ffi::CString;
    let c_lib = CString::new(lib)?;
    // SAFETY: dlopen/dlsym with valid C strings; the symbols are called with the C signatures
    // the CUDA driver and HIP runtime document: `int f(unsigned)` and `int f(int*)`.
    unsafe {
        let handle = libc::dlopen(c_lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            bail!(
                "no GPU driver: {lib} could not be loaded (is the driver installed and on the library path?)"
            );
        }
        if let Some(init) = init {
            let sym = libc::dlsym(handle, CString::new(init)?.as_ptr());
            if sym.is_null() {
                bail!("{lib} has no {init}");
            }
            let f: extern "C" fn(u32) -> i32 = std::mem::transmute(sym);
            let rc = f(0);
            if rc != 0 {
                bail!(
                    "{init} failed with error {rc}: the driver is present but no usable GPU was found"
                );
            }
        }
        let sym = libc::dlsym(handle, CString::new(count_fn)?.as_ptr());
        if sym.is_null() {
            bail!("{lib} has no {count_fn}");
        }
        let f: extern "C" fn(*mut i32) -> i32 = std::mem::transmute(sym);
        let mut n = 0i32;
        let rc = f(&mut n);
        if rc != 0 {
            bail!("{count_fn} failed with error {rc}");
        }
        if n <= 0 {
            bail!("the driver ({lib}) reports no GPU");
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_there_and_names_parse() {
        assert!(probe(BackendKind::Cpu, 0).unwrap().starts_with("cpu"));
        assert_eq!(BackendKind::parse("hip").unwrap(), BackendKind::Rocm);
        assert!(
            BackendKind::parse("tpu")
                .unwrap_err()
                .to_string()
                .contains("cpu, cuda or rocm")
        );
    }

    #[test]
    fn a_missing_gpu_is_a_clear_error_not_a_panic() {
        // On machines without the driver (CI) this is an error naming the library; with a GPU
        // and the feature compiled it succeeds. Either way: no panic.
        for kind in [BackendKind::Cuda, BackendKind::Rocm] {
            match probe(kind, 0) {
                Ok(desc) => assert!(desc.contains(':')),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("not compiled")
                            || msg.contains("could not be loaded")
                            || msg.contains("GPU"),
                        "{msg}"
                    );
                }
            }
        }
    }
}
