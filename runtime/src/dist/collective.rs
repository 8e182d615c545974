//! The data-parallel group: worker processes joined in a ring of TCP connections.
//!
//! Each rank is one process (one device). Rank 0 listens on the *rendezvous* address; every
//! other rank connects there and says where its own ring listener is; rank 0 answers everyone
//! with the full table. Then rank r connects to rank r+1 (mod world) and accepts rank r-1: a
//! ring. On it run the three classic bandwidth-optimal collectives over host `f32` buffers
//! split into one block per rank:
//!
//! - [`Group::reduce_scatter`]: `world - 1` steps; in step s rank r sends its partial sum of
//!   block r-s to r+1 and adds the block r-s-1 it receives from r-1. Afterwards rank r holds the
//!   sum of block r+1 (we rotate the blocks so that it is block r).
//! - [`Group::all_gather`]: `world - 1` steps passing finished blocks around.
//! - [`Group::all_reduce_sum`]: the two in turn.
//!
//! Each block's sum is computed by one chain in rank order and then copied, so every rank
//! gets the same bytes, and the same world size gives the same bytes run after run: a resumed
//! multi-rank run stays bit-identical to an uninterrupted one.
//!
//! Why not burn-collective (burn's own library, the obvious choice): in 0.21 its
//! multi-process ("global") operations end with a sync whose list of synced peers is cleared on
//! a copy, so the second all-reduce of a process waits forever (seen here: two ranks hung in
//! their first step); it also numbers nodes in registration order, so the summation order
//! (and the bits) would change from launch to launch. NCCL/RCCL bindings would need the vendor
//! libraries at build time, which CI does not have. The ring here is ~250 lines of std::net; a
//! GPU build would swap in RCCL behind the same three calls.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::contract::env;
use crate::contract::exit::PeerLost;
use crate::dist::handshake::{self, Key};

/// How long the ranks of a launch have to find each other: rank 0 to hear from every rank,
/// each rank to reach rank 0 and its neighbour.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a worker finds its group.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// This worker's rank.
    pub rank: usize,
    /// Ranks in all.
    pub world: usize,
    /// `host:port` of rank 0's rendezvous listener.
    pub rendezvous: String,
    /// `host:port` of this worker's ring listener.
    pub data_address: String,
    /// The launch's secret (see [`crate::dist::handshake`]); the same for every rank of a launch.
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
            data_address: get(env::DATA_ADDRESS)?,
            secret: get(env::SECRET)?,
        }))
    }

    /// The environment variables that give a worker this placement.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (env::RANK, self.rank.to_string()),
            (env::WORLD, self.world.to_string()),
            (env::RENDEZVOUS, self.rendezvous.clone()),
            (env::DATA_ADDRESS, self.data_address.clone()),
            (env::SECRET, self.secret.clone()),
        ]
    }

    /// Placements for `world` ranks on this machine, on free loopback ports, with a fresh
    /// secret.
    pub fn local(world: usize) -> Result<Vec<Placement>> {
        let rendezvous = format!("127.0.0.1:{}", free_port()?);
        let secret = crate::dist::handshake::generate_secret()?;
        (0..world)
            .map(|rank| {
                Ok(Placement {
                    rank,
                    world,
                    rendezvous: rendezvous.clone(),
                    data_address: format!("127.0.0.1:{}", free_port()?),
                    secret: secret.clone(),
                })
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

/// This process's membership of the data-parallel group.
pub struct Group {
    /// This worker's rank.
    pub rank: usize,
    /// Ranks in all.
    pub world: usize,
    ring: Option<Ring>,
}

struct Ring {
    /// To rank + 1.
    next: BufWriter<TcpStream>,
    /// From rank - 1.
    prev: BufReader<TcpStream>,
}

impl Group {
    /// A group of one: every collective is the identity.
    pub fn single() -> Group {
        Group {
            rank: 0,
            world: 1,
            ring: None,
        }
    }

    /// Joins the group described by `placement`; returns once the ring is closed. Every
    /// connection is authenticated with the launch's secret ([`crate::dist::handshake`]); peers
    /// that are not ranks of this launch are turned away while the real ones are awaited.
    pub fn join(placement: &Placement) -> Result<Group> {
        let (rank, world) = (placement.rank, placement.world);
        if world == 1 {
            return Ok(Group::single());
        }
        let key = Key::from_secret(&placement.secret)?;
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let listener = TcpListener::bind(&placement.data_address)
            .with_context(|| format!("rank {rank}: listening on {}", placement.data_address))?;
        // The rendezvous: everyone learns everyone's ring address.
        let table: Vec<String> = if rank == 0 {
            let hub = TcpListener::bind(&placement.rendezvous).with_context(|| {
                format!(
                    "rank 0: listening for the other ranks on {}",
                    placement.rendezvous
                )
            })?;
            let mut table = vec![String::new(); world];
            table[0] = placement.data_address.clone();
            let missing = |joined: usize| format!("{} of the other ranks", world - 1 - joined);
            let members = handshake::accept_peers(&hub, &key, world - 1, deadline, &missing)?;
            for (said, _) in &members {
                let (r, address) = said
                    .split_once(' ')
                    .with_context(|| format!("a bad rendezvous message {said:?}"))?;
                let r: usize = r
                    .parse()
                    .with_context(|| format!("a bad rank in the rendezvous message {said:?}"))?;
                ensure!(
                    r > 0 && r < world && table[r].is_empty(),
                    "rendezvous: rank {r} is out of range or came twice"
                );
                table[r] = address.to_string();
            }
            for (_, mut m) in members {
                writeln!(m, "{}", table.join(" "))?;
            }
            table
        } else {
            let payload = format!("{rank} {}", placement.data_address);
            let what = "the rendezvous (rank 0)";
            let mut stream =
                handshake::connect(&placement.rendezvous, what, &key, &payload, deadline)?;
            // Rank 0 answers once every rank has joined.
            stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))?;
            let line = handshake::read_line(&mut stream)
                .context("waiting for the table of ranks from rank 0")?;
            line.split_whitespace().map(str::to_string).collect()
        };
        ensure!(
            table.len() == world,
            "rendezvous: expected {world} addresses, got {}",
            table.len()
        );
        // Close the ring: connect forward while accepting from behind (the previous rank, and
        // only it). Both at once: each handshake needs the other side to answer.
        let (after, before) = ((rank + 1) % world, (rank + world - 1) % world);
        let (next, accepted) = std::thread::scope(|scope| {
            let behind = scope.spawn(|| {
                let missing = |_| format!("rank {before}");
                handshake::accept_peers(&listener, &key, 1, deadline, &missing)
            });
            let what = format!("rank {after}");
            let next = handshake::connect(&table[after], &what, &key, &rank.to_string(), deadline);
            (next, behind.join().expect("the accepting thread"))
        });
        let (said, prev) = accepted?.pop().expect("one peer");
        let next = next?;
        ensure!(
            said == before.to_string(),
            "rank {said} connected where rank {before} was expected"
        );
        for s in [&next, &prev] {
            s.set_nodelay(true)?;
        }
        Ok(Group {
            rank,
            world,
            ring: Some(Ring {
                next: BufWriter::with_capacity(1 << 20, next),
                prev: BufReader::with_capacity(1 << 20, prev),
            }),
        })
    }

    /// Sums `buf` over all ranks, in place; every rank ends with the same bytes.
    pub fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let blocks = even_blocks(buf.len(), self.world);
        self.reduce_scatter(buf, &blocks)?;
        self.all_gather(buf, &blocks)
    }

    /// Sums block `blocks[r]` of `buf` over all ranks into rank r's `buf` (the other blocks
    /// are left holding partial sums).
    pub fn reduce_scatter(&mut self, buf: &mut [f32], blocks: &[Range<usize>]) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        ensure!(
            blocks.len() == world,
            "{} blocks for {world} ranks",
            blocks.len()
        );
        for s in 0..world - 1 {
            // Block rank-s-1 leaves here first, so the chain for block r ends at rank r.
            let send = (rank + 2 * world - s - 1) % world;
            let recv = (rank + 2 * world - s - 2) % world;
            let incoming = ring.exchange(&buf[blocks[send].clone()], blocks[recv].len())?;
            for (x, y) in buf[blocks[recv].clone()].iter_mut().zip(incoming) {
                *x += y;
            }
        }
        Ok(())
    }

    /// Copies block `blocks[r]` of rank r's `buf` into every rank's `buf`.
    pub fn all_gather(&mut self, buf: &mut [f32], blocks: &[Range<usize>]) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        ensure!(
            blocks.len() == world,
            "{} blocks for {world} ranks",
            blocks.len()
        );
        for s in 0..world - 1 {
            let send = (rank + world - s) % world;
            let recv = (rank + world - s - 1) % world;
            let incoming = ring.exchange(&buf[blocks[send].clone()], blocks[recv].len())?;
            buf[blocks[recv].clone()].copy_from_slice(&incoming);
        }
        Ok(())
    }

    /// Copies `root`'s `buf` into every rank's `buf`: a chain from the root around the ring, in
    /// pieces of 1 MiB so that all links carry data at once (pipelined).
    pub fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let last = (root + world - 1) % world;
        const PIECE: usize = 1 << 18;
        for piece in buf.chunks_mut(PIECE) {
            if rank != root {
                ring.prev
                    .read_exact(bytemuck::cast_slice_mut(piece))
                    .context(PeerLost(
                        "receiving a broadcast (did the previous rank die?)",
                    ))?;
            }
            if rank != last {
                ring.next.write_all(bytemuck::cast_slice(piece))?;
                ring.next.flush()?;
            }
        }
        Ok(())
    }

    /// Waits until every rank gets here.
    pub fn barrier(&mut self) -> Result<()> {
        let mut token = vec![0.0f32; self.world];
        self.all_reduce_sum(&mut token)
    }
}

impl Ring {
    /// Sends `out` to the next rank while receiving `len` values from the previous one (at the
    /// same time, so two ranks sending large blocks to each other cannot both block on a full
    /// socket buffer).
    fn exchange(&mut self, out: &[f32], len: usize) -> Result<Vec<f32>> {
        let next = &mut self.next;
        let prev = &mut self.prev;
        std::thread::scope(|scope| {
            let sender = scope.spawn(move || -> std::io::Result<()> {
                next.write_all(bytemuck::cast_slice(out))?;
                next.flush()
            });
            let mut incoming = vec![0.0f32; len];
            let received = prev.read_exact(bytemuck::cast_slice_mut(&mut incoming));
            sender
                .join()
                .expect("sender thread")
                .context(PeerLost("sending to the next rank (did it die?)"))?;
            received.context(PeerLost("receiving from the previous rank (did it die?)"))?;
            Ok(incoming)
        })
    }
}

/// `len` elements in `parts` contiguous blocks as equal as can be.
pub fn even_blocks(len: usize, parts: usize) -> Vec<Range<usize>> {
    (0..parts)
        .map(|i| len * i / parts..len * (i + 1) / parts)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on `world` ranks (threads of this process, over real loopback sockets).
    fn on_ranks<T: Send + 'static>(
        world: usize,
        f: impl Fn(&mut Group) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let placements = Placement::local(world).unwrap();
        let handles: Vec<_> = placements
            .into_iter()
            .map(|p| {
                let f = f.clone();
                std::thread::spawn(move || f(&mut Group::join(&p).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_gives_every_rank_the_same_exact_sum() {
        for world in [2, 3, 4] {
            let results = on_ranks(world, move |g| {
                // Values whose sums are exact in f32, so the expected result is unambiguous.
                let mut buf: Vec<f32> = (0..1001).map(|i| (i * (g.rank + 1)) as f32).collect();
                g.all_reduce_sum(&mut buf).unwrap();
                // Twice in a row: a second collective must work too.
                let mut again = vec![1.0f32; 7];
                g.all_reduce_sum(&mut again).unwrap();
                (buf, again)
            });
            let factor: usize = (1..=world).sum();
            for (buf, again) in &results {
                assert_eq!(
                    buf,
                    &(0..1001).map(|i| (i * factor) as f32).collect::<Vec<_>>(),
                    "world {world}"
                );
                assert_eq!(again, &vec![world as f32; 7]);
            }
        }
    }

    #[test]
    fn broadcast_from_any_root() {
        for root in 0..3 {
            let results = on_ranks(3, move |g| {
                let mut buf: Vec<f32> = if g.rank == root {
                    (0..700_000).map(|i| i as f32).collect()
                } else {
                    vec![0.0; 700_000]
                };
                g.broadcast(&mut buf, root).unwrap();
                buf
            });
            for buf in results {
                assert!(
                    buf.iter().enumerate().all(|(i, &x)| x == i as f32),
                    "root {root}"
                );
            }
        }
    }

    #[test]
    fn reduce_scatter_and_all_gather_with_uneven_blocks() {
        let results = on_ranks(3, |g| {
            let blocks = vec![0..5, 5..6, 6..20];
            let mut buf: Vec<f32> = (0..20).map(|i| i as f32 + g.rank as f32 * 100.0).collect();
            g.reduce_scatter(&mut buf, &blocks).unwrap();
            let mine: Vec<f32> = buf[blocks[g.rank].clone()].to_vec();
            // Now gather rank-specific values.
            let mut gathered = vec![f32::NAN; 20];
            for i in blocks[g.rank].clone() {
                gathered[i] = g.rank as f32;
            }
            g.all_gather(&mut gathered, &blocks).unwrap();
            g.barrier().unwrap();
            (g.rank, mine, gathered)
        });
        for (rank, mine, gathered) in results {
            let range = [0..5, 5..6, 6..20][rank].clone();
            let expected: Vec<f32> = range.map(|i| 3.0 * i as f32 + 300.0).collect();
            assert_eq!(mine, expected, "rank {rank}");
            let owners: Vec<f32> = (0..20)
                .map(|i| {
                    if i < 5 {
                        0.0
                    } else if i < 6 {
                        1.0
                    } else {
                        2.0
                    }
                })
                .collect();
            assert_eq!(gathered, owners);
        }
    }
}
