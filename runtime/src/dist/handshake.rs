//! Who may join a data-parallel group: ranks of one launch prove to each other that they hold
//! the launch's secret, before anything else is said.
//!
//! The supervisor makes a fresh secret for every launch ([`generate_secret`]) and hands it to
//! its workers in the environment ([`crate::contract::env::SECRET`]; a process's environment
//! is readable only by its own user, unlike its command line). Every connection of the
//! rendezvous and the ring starts with a mutual challenge-response keyed by that secret, so
//! neither side sends it:
//!
//! ```text
//! acceptor  -> connector:  zflow-group v1 <nonce A>
//! connector -> acceptor:   <nonce C> <MAC(key, "connector", A, C, payload)> <payload>
//! acceptor  -> connector:  <MAC(key, "acceptor", A, C, payload)>
//! ```
//!
//! The MAC is BLAKE3's keyed hash (the key derived from the secret), compared in constant time;
//! nonces are 32 bytes from the OS. A peer without the secret (another local user, a host on the
//! cluster network, a rank of an older launch) fails the check and is dropped; one that
//! connects and says nothing is dropped after [`HANDSHAKE_TIMEOUT`]; no line may be longer than
//! [`MAX_LINE`]. The acceptor keeps waiting for the real ranks meanwhile, so a bad peer costs no
//! restart ([`accept_peers`]). What flows after the handshake (the ring's data) is not
//! encrypted or signed: it is the same numbers on every rank, and an attacker able to rewrite
//! TCP streams between cluster nodes is beyond what zflow defends against (SECURITY.md).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// How long a peer has to complete its side of the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest line either side may send during the handshake and rendezvous.
pub const MAX_LINE: usize = 64 * 1024;

const GREETING: &str = "zflow-group v1";

/// A fresh launch secret: 32 random bytes, hex.
pub fn generate_secret() -> Result<String> {
    Ok(hex(&random_bytes()?))
}

/// The key both sides of a handshake use, derived from a launch secret.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Key {
    /// Derives the key from the secret the supervisor handed out.
    pub fn from_secret(secret: &str) -> Result<Key> {
        ensure!(
            secret.len() >= 32,
            "the group secret is too short ({} characters; the supervisor makes 64)",
            secret.len()
        );
        Ok(Key(blake3::derive_key(
            "zflow data-parallel group v1",
            secret.as_bytes(),
        )))
    }

    fn mac(&self, role: &str, nonce_a: &str, nonce_c: &str, payload: &str) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for part in [role, nonce_a, nonce_c, payload] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize()
    }
}

/// Connects to `address` (retrying until `deadline` while nothing listens there yet), proves
/// to the acceptor that this side holds `key` and sends `payload` (one line, no newline), and
/// checks that the acceptor holds `key` too.
pub fn connect(
    address: &str,
    what: &str,
    key: &Key,
    payload: &str,
    deadline: Instant,
) -> Result<TcpStream> {
    ensure!(
        !payload.contains('\n') && payload.len() < MAX_LINE / 2,
        "a handshake payload is one short line"
    );
    let mut stream = loop {
        match TcpStream::connect(address) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("waiting for {what} at {address}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!("could not reach {what} at {address} in time: {e}"),
        }
    };
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let not_it = |why: &str| {
        format!("{address} is not {what} of this launch ({why}): another process holds the port?")
    };
    let greeting = read_line(&mut stream).with_context(|| not_it("no greeting"))?;
    let nonce_a = greeting
        .strip_prefix(GREETING)
        .map(str::trim)
        .filter(|n| n.len() == 64)
        .with_context(|| not_it("a wrong greeting"))?
        .to_string();
    let nonce_c = hex(&random_bytes()?);
    let mac = key.mac("connector", &nonce_a, &nonce_c, payload);
    writeln!(stream, "{nonce_c} {} {payload}", mac.to_hex())?;
    let answer = read_line(&mut stream).with_context(|| not_it("no answer"))?;
    let expected = key.mac("acceptor", &nonce_a, &nonce_c, payload);
    ensure!(
        parse_hash(answer.trim()) == Some(expected),
        "{}",
        not_it("it does not hold the launch's secret")
    );
    stream.set_read_timeout(None)?;
    Ok(stream)
}

/// Accepts connections on `listener` until `count` peers holding `key` have joined, or
/// `deadline` passes. Returns each peer's payload and stream. Peers that fail the handshake
/// are logged and dropped; each handshake runs on its own thread, so a silent one delays no
/// other.
pub fn accept_peers(
    listener: &TcpListener,
    key: &Key,
    count: usize,
    deadline: Instant,
    waiting_for: &dyn Fn(usize) -> String,
) -> Result<Vec<(String, TcpStream)>> {
    listener.set_nonblocking(true)?;
    let (tx, rx) = mpsc::channel();
    let mut peers = Vec::new();
    while peers.len() < count {
        match listener.accept() {
            Ok((stream, from)) => {
                let (tx, key) = (tx.clone(), key.clone());
                std::thread::spawn(move || {
                    let _ = tx.send(answer(stream, &key).map_err(|e| format!("{from}: {e:#}")));
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("accepting a connection"),
        }
        while let Ok(result) = rx.try_recv() {
            match result {
                Ok(peer) => peers.push(peer),
                Err(why) => tracing::warn!("rejected a connection: {why}"),
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not join in time ({} of {count} joined)",
                waiting_for(peers.len()),
                peers.len()
            );
        }
    }
    listener.set_nonblocking(false)?;
    Ok(peers)
}

/// The acceptor's side of one handshake.
fn answer(mut stream: TcpStream, key: &Key) -> Result<(String, TcpStream)> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let nonce_a = hex(&random_bytes()?);
    writeln!(stream, "{GREETING} {nonce_a}")?;
    let line = read_line(&mut stream)?;
    let mut parts = line.splitn(3, ' ');
    let (nonce_c, mac, payload) = (
        parts.next().unwrap_or_default(),
        parts.next().and_then(parse_hash),
        parts.next().unwrap_or_default().trim_end(),
    );
    ensure!(
        nonce_c.len() == 64 && mac == Some(key.mac("connector", &nonce_a, nonce_c, payload)),
        "it does not hold the launch's secret"
    );
    let reply = key.mac("acceptor", &nonce_a, nonce_c, payload);
    writeln!(stream, "{}", reply.to_hex())?;
    stream.set_read_timeout(None)?;
    Ok((payload.to_string(), stream))
}

/// Reads one line (without its newline) of at most [`MAX_LINE`] bytes, byte by byte: nothing
/// past the newline is consumed, so the stream can be handed on as it is.
pub fn read_line(stream: &mut TcpStream) -> Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => bail!("the connection closed"),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                ensure!(line.len() < MAX_LINE, "a line longer than {MAX_LINE} bytes");
                line.push(byte[0]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("no complete line within {:?}", stream.read_timeout()?)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    String::from_utf8(line).context("a line that is not UTF-8")
}

fn parse_hash(text: &str) -> Option<blake3::Hash> {
    blake3::Hash::from_hex(text).ok()
}

fn random_bytes() -> Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn holders_of_the_secret_join_and_others_are_turned_away_without_stopping_the_wait() {
        let secret = generate_secret().unwrap();
        let key = Key::from_secret(&secret).unwrap();
        let wrong = Key::from_secret(&generate_secret().unwrap()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let peers = std::thread::scope(|s| {
            // Someone who connects and says nothing; someone who sends garbage; someone with
            // another secret; then the real rank.
            let silent = TcpStream::connect(&address).unwrap();
            let mut garbage = TcpStream::connect(&address).unwrap();
            garbage.write_all(&[b'x'; 70_000]).unwrap_or(());
            let impostor = s.spawn(|| connect(&address, "rank 0", &wrong, "1 x", far()));
            let real = s.spawn(|| connect(&address, "rank 0", &key, "1 here", far()));
            let peers = accept_peers(&listener, &key, 1, far(), &|_| "rank 1".into()).unwrap();
            assert!(real.join().unwrap().is_ok());
            let err = impostor.join().unwrap().unwrap_err();
            assert!(format!("{err:#}").contains("is not rank 0"), "{err:#}");
            drop(silent);
            peers
        });
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[0].0, "1 here");
    }

    #[test]
    fn an_acceptor_without_the_secret_is_found_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let theirs = Key::from_secret(&generate_secret().unwrap()).unwrap();
        let server = std::thread::spawn(move || {
            let _ = accept_peers(&listener, &theirs, 1, far(), &|_| "x".into());
        });
        let ours = Key::from_secret(&generate_secret().unwrap()).unwrap();
        let err = connect(&address, "rank 0", &ours, "1 a", far()).unwrap_err();
        assert!(format!("{err:#}").contains("is not rank 0"), "{err:#}");
        drop(server);
    }

    #[test]
    fn nobody_joining_ends_at_the_deadline_naming_who_is_missing() {
        let key = Key::from_secret(&generate_secret().unwrap()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let soon = Instant::now() + Duration::from_millis(200);
        let err =
            accept_peers(&listener, &key, 2, soon, &|n| format!("{} rank(s)", 2 - n)).unwrap_err();
        assert!(
            format!("{err:#}").contains("2 rank(s) did not join in time"),
            "{err:#}"
        );
    }
}
