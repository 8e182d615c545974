//! The device kinds a recipe's `backend:` may name (a train stage's `train.backend`, an eval
//! stage's `backend`). The torch engine maps them onto PyTorch devices
//! (`workers/torch/zflow_torch/trainer.py`'s `device_for`: ROCm builds of PyTorch call their
//! GPUs `cuda`).

/// The backends, in the order errors list them.
pub const BACKENDS: &[&str] = &["cpu", "cuda", "rocm"];

/// Whether `name` is one of [`BACKENDS`]; the error says which ones are.
pub fn check_backend(name: &str) -> Result<(), String> {
    if BACKENDS.contains(&name) {
        Ok(())
    } else {
        Err(format!(
            "unknown backend `{name}`: expected {}",
            BACKENDS.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_backends_there_are() {
        assert!(check_backend("rocm").is_ok());
        let err = check_backend("flex").unwrap_err();
        assert!(
            err.contains("`flex`") && err.contains("cpu, cuda, rocm"),
            "{err}"
        );
    }
}
