//! How a worker ends, and what the supervisor does about it.
//!
//! | class | exit code | the supervisor |
//! | --- | --- | --- |
//! | done | 0, after a `done` message | the phase is complete |
//! | [`Failure::Retry`] | 1 (or a signal) | relaunches every rank from the newest checkpoint, up to `max_restarts` |
//! | [`Failure::LostPeer`] | 4 | as retry, but blames another rank: this one lost a peer in a collective |
//! | [`Failure::Fatal`] | 3 | fails the stage at once: no relaunch can fix it |
//!
//! A worker says which it is in its `error` message (`class`) and in its exit code; the exit
//! code alone decides when the message never arrived.

use serde::{Deserialize, Serialize};

/// Why a worker failed, as far as the supervisor is concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// A crash, a hang, a failed step: a relaunch from the newest checkpoint may get past it.
    #[default]
    Retry,
    /// This rank lost a peer in a collective: the peer is the one that failed.
    LostPeer,
    /// Bad settings or data (a token id beyond the vocabulary, an unreadable job) or a full
    /// disk: every relaunch would fail the same way.
    Fatal,
}

impl Failure {
    /// The worker's exit code for this class.
    pub fn exit_code(self) -> i32 {
        match self {
            Failure::Retry => 1,
            Failure::Fatal => EXIT_FATAL,
            Failure::LostPeer => EXIT_LOST_PEER,
        }
    }

    /// The class an exit code says (`None` for 0 and for codes outside the contract).
    pub fn from_exit_code(code: i32) -> Option<Failure> {
        match code {
            1 => Some(Failure::Retry),
            EXIT_FATAL => Some(Failure::Fatal),
            EXIT_LOST_PEER => Some(Failure::LostPeer),
            _ => None,
        }
    }

    /// The class of error `e`: [`Fatal`] anywhere in its context chain or a disk that is full
    /// (`ENOSPC`) or over quota (`EDQUOT`) is fatal; anything else is worth a retry (a worker
    /// that lost a peer says so with its exit code, [`EXIT_LOST_PEER`]).
    pub fn of(e: &anyhow::Error) -> Failure {
        let full_disk = e.chain().any(|cause| {
            cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
                io.kind() == std::io::ErrorKind::StorageFull
                    || matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            })
        });
        if full_disk || e.downcast_ref::<Fatal>().is_some() {
            Failure::Fatal
        } else {
            Failure::Retry
        }
    }
}

/// Exit code of a worker whose failure no relaunch can fix.
pub const EXIT_FATAL: i32 = 3;

/// Exit code of a worker that lost a peer.
pub const EXIT_LOST_PEER: i32 = 4;

/// An error no relaunch can fix: the error itself (`Err(Fatal(..).into())`) or context on
/// another (`.context(Fatal(..))`).
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn classes_from_the_context_chain_and_exit_codes() {
        let fatal_error: anyhow::Error = Err::<(), _>(Fatal("token id 600 >= 512".into()))
            .context("reading a batch")
            .unwrap_err();
        assert_eq!(Failure::of(&fatal_error), Failure::Fatal);
        let fatal_context = anyhow::anyhow!("no such field `x`")
            .context(Fatal("bad settings".into()))
            .context("starting");
        assert_eq!(Failure::of(&fatal_context), Failure::Fatal);
        let full = anyhow::Error::from(std::io::Error::from_raw_os_error(libc::ENOSPC))
            .context("writing a checkpoint");
        assert_eq!(Failure::of(&full), Failure::Fatal);
        assert_eq!(Failure::of(&anyhow::anyhow!("nan loss")), Failure::Retry);
        for class in [Failure::Retry, Failure::LostPeer, Failure::Fatal] {
            assert_eq!(Failure::from_exit_code(class.exit_code()), Some(class));
        }
    }
}
