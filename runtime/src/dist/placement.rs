//! Where each rank of a launch is: its rank, the world, rank 0's rendezvous address and the
//! launch's secret, handed to every rank in its environment ([`crate::contract::env`]). The
//! torch engine's ranks meet at the rendezvous through `torch.distributed`.

use std::net::TcpListener;

use anyhow::{Context, Result, ensure};

use crate::contract::env;

/// Where a worker finds its group.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// This worker's rank.
    pub rank: usize,
    /// Ranks in all.
    pub world: usize,
    /// `host:port` of rank 0's rendezvous listener.
    pub rendezvous: String,
    /// The launch's secret (see [`crate::dist::secret`]); the same for every rank of a launch.
    pub secret: String,
}

impl Placement {
    /// Reads the placement from the environment; `None` when `ZFLOW_WORLD` is unset (a
    /// single-rank run).
    pub fn from_env() -> Result<Option<Placement>> {
        let Ok(world) = std::env::var(env::WORLD) else {
            return Ok(None);
        };
        let get = |name: &str| {
            std::env::var(name).with_context(|| format!("{} is set but {name} is not", env::WORLD))
        };
        let world: usize = world
            .parse()
            .with_context(|| format!("{}={world:?} is not a number", env::WORLD))?;
        let rank: usize = get(env::RANK)?
            .parse()
            .with_context(|| format!("{} is not a number", env::RANK))?;
        ensure!(
            world >= 1 && rank < world,
            "{}={rank} is not below {}={world}",
            env::RANK,
            env::WORLD
        );
        Ok(Some(Placement {
            rank,
            world,
            rendezvous: get(env::RENDEZVOUS)?,
            secret: get(env::SECRET)?,
        }))
    }

    /// The environment variables that give a worker this placement.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (env::RANK, self.rank.to_string()),
            (env::WORLD, self.world.to_string()),
            (env::RENDEZVOUS, self.rendezvous.clone()),
            (env::SECRET, self.secret.clone()),
        ]
    }

    /// Placements for `world` ranks on this machine, on free loopback ports, with a fresh
    /// secret.
    pub fn local(world: usize) -> Result<Vec<Placement>> {
        let rendezvous = format!("127.0.0.1:{}", free_port()?);
        Ok(Placement::all(
            world,
            &rendezvous,
            &crate::dist::secret::generate_secret()?,
        ))
    }

    /// Placements for `world` ranks meeting at `rendezvous`, all holding `secret`.
    pub fn all(world: usize, rendezvous: &str, secret: &str) -> Vec<Placement> {
        (0..world)
            .map(|rank| Placement {
                rank,
                world,
                rendezvous: rendezvous.to_string(),
                secret: secret.to_string(),
            })
            .collect()
    }
}

/// A port nothing listens on right now (the OS picks it; the worker binds it moments later).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("finding a free port")?
        .local_addr()?
        .port())
}
