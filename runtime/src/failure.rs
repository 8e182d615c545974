//! Failures a relaunch cannot fix, told apart from those it may.
//!
//! A worker that crashes, hangs or loses a peer is relaunched from the newest checkpoint; one
//! that fails on its settings or data (a token id beyond the vocabulary, a bad job) or on a
//! full disk would fail the same way on every relaunch, so the supervisor stops at once. A
//! worker says which it is in its `error` message ([`crate::protocol::WorkerMessage::Error`])
//! and in its exit code ([`EXIT_FATAL`]).

/// Exit code of a worker whose failure no relaunch can fix (`1` is any other failure).
pub const EXIT_FATAL: i32 = 3;

/// An error no relaunch can fix; wrap the cause in it (`Err(Fatal(...).into())`, or
/// `.context(Fatal(...))`).
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

/// Whether `e` is one no relaunch can fix: a [`Fatal`] anywhere in its chain, or a disk that
/// is full (`ENOSPC`) or over quota (`EDQUOT`).
pub fn is_fatal(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.is::<Fatal>()
            || cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
                io.kind() == std::io::ErrorKind::StorageFull
                    || matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn fatal_anywhere_in_the_chain_and_full_disks_are_fatal() {
        let wrapped: anyhow::Error = Err::<(), _>(Fatal("token id 600 >= 512".into()))
            .context("reading a batch")
            .unwrap_err();
        assert!(is_fatal(&wrapped));
        let full = anyhow::Error::from(std::io::Error::from_raw_os_error(libc::ENOSPC))
            .context("writing a checkpoint");
        assert!(is_fatal(&full));
        let peer = anyhow::anyhow!("receiving from the previous rank (did it die?)");
        assert!(!is_fatal(&peer));
    }
}
