//! Fault injection, for the tests that prove recovery works: real crashes, hangs, slow ranks,
//! deaths in the middle of a checkpoint write, corrupted files and bad batches, injected into
//! real worker processes.
//!
//! `ZFLOW_FAULTS` holds `;`-separated faults, each `kind@step` with optional `:key=value`
//! options:
//!
//! ```text
//! crash@7:rank=1              abort rank 1 right after step 7 (SIGABRT, no cleanup)
//! hang@12                     rank 0 stops everything (heartbeats too) after step 12
//! slow@3:ms=400:rank=1        rank 1 sleeps 400 ms in every step from step 3 on
//! kill-in-checkpoint@10       abort halfway through writing the step-10 checkpoint
//! corrupt-checkpoint@10       flip a byte of the committed step-10 weights
//! spike@15                    the batch of step 15 is garbage (uniformly random tokens)
//! ```
//!
//! `rank` defaults to 0. Each fault fires in one attempt only (`attempt=N`, default 1; the
//! supervisor numbers attempts in `ZFLOW_ATTEMPT`), so a relaunched worker does not die again at
//! the same step.

use anyhow::{Context, Result, bail};

use crate::contract::env::{ATTEMPT, FAULTS};

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The process aborts after the step.
    Crash,
    /// The process stops making progress and stops its heartbeats.
    Hang,
    /// Every step from this one on takes `ms` longer on this rank.
    Slow {
        /// The delay per step, milliseconds.
        ms: u64,
    },
    /// The process aborts halfway through writing this step's checkpoint.
    KillInCheckpoint,
    /// A committed file of this step's checkpoint gets a flipped byte.
    CorruptCheckpoint,
    /// This step's batch is replaced by random tokens (a loss spike from bad data).
    Spike,
}

/// One injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub kind: Kind,
    /// At which optimizer step (1-based, as reported).
    pub step: u64,
    /// On which rank.
    pub rank: usize,
    /// In which attempt.
    pub attempt: u32,
}

/// The faults that apply to this process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults(pub Vec<Fault>);

impl Faults {
    /// Parses a `ZFLOW_FAULTS` value.
    pub fn parse(spec: &str) -> Result<Faults> {
        let mut out = Vec::new();
        for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let mut parts = item.split(':');
            let head = parts.next().expect("split yields one part");
            let (kind, step) = head
                .split_once('@')
                .with_context(|| format!("{FAULTS}: `{item}`: expected kind@step"))?;
            let step: u64 = step
                .parse()
                .with_context(|| format!("{FAULTS}: `{item}`: bad step"))?;
            let (mut rank, mut attempt, mut ms) = (0usize, 1u32, None);
            for opt in parts {
                let (k, v) = opt.split_once('=').with_context(|| {
                    format!("{FAULTS}: `{item}`: expected key=value, got `{opt}`")
                })?;
                let bad = || format!("{FAULTS}: `{item}`: bad value for {k}");
                match k {
                    "rank" => rank = v.parse().with_context(bad)?,
                    "attempt" => attempt = v.parse().with_context(bad)?,
                    "ms" => ms = Some(v.parse().with_context(bad)?),
                    _ => bail!(
                        "{FAULTS}: `{item}`: unknown option `{k}` (expected rank, attempt or ms)"
                    ),
                }
            }
            let kind = match kind {
                "crash" => Kind::Crash,
                "hang" => Kind::Hang,
                "slow" => Kind::Slow {
                    ms: ms.with_context(|| format!("{FAULTS}: `{item}`: slow needs ms=N"))?,
                },
                "kill-in-checkpoint" => Kind::KillInCheckpoint,
                "corrupt-checkpoint" => Kind::CorruptCheckpoint,
                "spike" => Kind::Spike,
                _ => bail!(
                    "{FAULTS}: `{item}`: unknown fault `{kind}` (expected crash, hang, slow, kill-in-checkpoint, corrupt-checkpoint or spike)"
                ),
            };
            out.push(Fault {
                kind,
                step,
                rank,
                attempt,
            });
        }
        Ok(Faults(out))
    }

    /// The faults in the environment that apply to `rank` in this attempt.
    pub fn from_env(rank: usize) -> Result<Faults> {
        let attempt: u32 = std::env::var(ATTEMPT)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let all = Faults::parse(&std::env::var(FAULTS).unwrap_or_default())?;
        Ok(Faults(
            all.0
                .into_iter()
                .filter(|f| f.rank == rank && f.attempt == attempt)
                .collect(),
        ))
    }

    /// Whether a fault of `kind`'s variant fires at `step`.
    pub fn at(&self, kind: Kind, step: u64) -> bool {
        self.0.iter().any(|f| {
            std::mem::discriminant(&f.kind) == std::mem::discriminant(&kind) && f.step == step
        })
    }

    /// Extra milliseconds a step takes at `step` (slow-rank faults).
    pub fn delay_ms(&self, step: u64) -> u64 {
        self.0
            .iter()
            .filter_map(|f| match f.kind {
                Kind::Slow { ms } if step >= f.step => Some(ms),
                _ => None,
            })
            .sum()
    }
}

/// Dies like a crashed process: no unwinding, no cleanup, no flushed buffers.
pub fn abort(why: &str) -> ! {
    eprintln!("fault injection: {why}");
    std::process::abort()
}

/// Stops making progress forever (the supervisor must notice and kill the process).
pub fn hang(why: &str) -> ! {
    eprintln!("fault injection: {why}");
    HUNG.store(true, std::sync::atomic::Ordering::SeqCst);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Set when the process plays dead; the heartbeat thread goes quiet too.
pub static HUNG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms_and_rejects_bad_ones() {
        let f = Faults::parse("crash@7:rank=1; hang@12 ;slow@3:ms=400:rank=1;kill-in-checkpoint@10:attempt=2;corrupt-checkpoint@10;spike@15").unwrap();
        assert_eq!(
            f.0[0],
            Fault {
                kind: Kind::Crash,
                step: 7,
                rank: 1,
                attempt: 1
            }
        );
        assert_eq!(f.0[2].kind, Kind::Slow { ms: 400 });
        assert_eq!(f.0[3].attempt, 2);
        assert!(f.at(Kind::Spike, 15) && !f.at(Kind::Spike, 14));
        assert_eq!(Faults(vec![f.0[2]]).delay_ms(5), 400);
        assert_eq!(Faults(vec![f.0[2]]).delay_ms(2), 0);
        for bad in [
            "crash",
            "crash@x",
            "boom@3",
            "slow@3",
            "crash@3:rank",
            "crash@3:color=red",
        ] {
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
    }
}
