//! The launch secret: who may join a data-parallel group.
//!
//! The supervisor makes a fresh secret for every launch, relaunches included
//! ([`generate_secret`]), and hands it to its ranks in the environment
//! ([`crate::contract::env::SECRET`]; a process's environment is readable only by its own user,
//! unlike its command line). Before any collective runs, the ranks prove to each other that they
//! hold it, both ways, without sending it: rank 0 posts a nonce at the rendezvous, each rank
//! posts a BLAKE3 keyed hash of it, its own nonce and its rank, and each rank checks the rank
//! after it in the ring and answers it with its own hash over the same values
//! (`workers/torch/zflow_torch/distributed.py`, `prove_secret`; SECURITY.md).

use std::io::Read;

use anyhow::{Context, Result};

/// A fresh launch secret: 32 random bytes from the OS, hex.
pub fn generate_secret() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_64_hex_digits_and_fresh() {
        let (a, b) = (generate_secret().unwrap(), generate_secret().unwrap());
        assert!(
            a.len() == 64 && a.bytes().all(|c| c.is_ascii_hexdigit()),
            "{a}"
        );
        assert_ne!(a, b);
    }
}
