//! datatrove's `PIIFormatter`: replaces e-mail addresses and public IPv4 addresses, with
//! datatrove's regular expressions and replacement lists.
//!
//! datatrove cycles through its replacements with a counter that lives as long as the pipeline
//! step, so which replacement a match gets depends on every document the worker processed
//! before. Here the cycle restarts at the first replacement for every document: a document's
//! redacted text depends on that document only (deterministic, whatever the sharding), and the
//! first address of a document always becomes `email@example.com` / `22.214.171.124`.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;

/// The name of this filter's edits in an ingest stage's stats (`edited:pii`).
pub const RULE: &str = "pii";

/// One IPv4 octet, 0..=255, as datatrove's pattern writes it (leading zeros match; Python's
/// `ipaddress` then rejects them, so such matches are left alone).
const OCTET: &str = "(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)";

/// datatrove's e-mail pattern (RFC 5322-like, with IPv4 literals as domains).
static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    let local = r"[A-Za-z0-9!#$%&'*+/=?^_\x60{|}~\-]+";
    let label = r"[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?";
    let pattern = format!(
        r"\b{local}(?:\.{local})*@(?:(?:{label}\.)+{label}|\[(?:{OCTET}\.){{3}}(?:{OCTET}|[A-Za-z0-9\-]*[A-Za-z0-9]:)\])"
    );
    Regex::new(&pattern).expect("e-mail regex compiles")
});

/// datatrove's IPv4 pattern (no word boundaries: `1234.5.6.7` contains `234.5.6.7`).
static IPV4: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(?:{OCTET}\.){{3}}{OCTET}")).expect("IPv4 regex compiles")
});

/// datatrove's e-mail replacements (example.com and example.org are reserved for examples).
pub const EMAIL_REPLACEMENTS: [&str; 2] = ["email@example.com", "firstname.lastname@example.org"];

/// datatrove's IP replacements ("randomly generated, did not respond to ping").
pub const IP_REPLACEMENTS: [&str; 6] = [
    "22.214.171.124",
    "126.96.36.199",
    "188.8.131.52",
    "184.108.40.206",
    "220.127.116.11",
    "18.104.22.168",
];

/// `pii:` settings: datatrove's `PIIFormatter`, every field defaulting to datatrove's value.
/// It never drops a document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pii {
    /// Replace e-mail addresses; default true.
    pub remove_emails: bool,
    /// Replace IPv4 addresses; default true.
    pub remove_ips: bool,
    /// Replace only public IPs (Python's `ipaddress.ip_address(ip).is_global`); default true.
    pub only_remove_public_ips: bool,
    /// E-mail replacements, used in turn within a document; default [`EMAIL_REPLACEMENTS`].
    pub email_replacement: Vec<String>,
    /// IP replacements, used in turn within a document; default [`IP_REPLACEMENTS`].
    pub ip_replacement: Vec<String>,
}

impl Default for Pii {
    fn default() -> Self {
        Pii {
            remove_emails: true,
            remove_ips: true,
            only_remove_public_ips: true,
            email_replacement: EMAIL_REPLACEMENTS.iter().map(|s| s.to_string()).collect(),
            ip_replacement: IP_REPLACEMENTS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Bytes an e-mail match can contain.
fn is_email_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+/=?^_`{|}~-.@[]:".contains(&b)
}

/// Python's `ipaddress.ip_address(s)` for a string the IPv4 pattern matched: its value, or
/// `None` where Python raises (an octet with a leading zero).
fn parse_ipv4(s: &str) -> Option<u32> {
    let mut value = 0u32;
    for part in s.split('.') {
        if part.len() > 1 && part.starts_with('0') {
            return None;
        }
        value = (value << 8) | part.parse::<u8>().ok()? as u32;
    }
    Some(value)
}

/// Python's `IPv4Address.is_global` (Python 3.13: not in 100.64.0.0/10 and not private, the
/// private networks being IANA's non-globally-reachable blocks, 192.0.0.9 and 192.0.0.10
/// excepted). Multicast addresses count as global, as in Python.
fn is_global(ip: u32) -> bool {
    let within = |net: [u8; 4], len: u32| {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        ip & mask == u32::from_be_bytes(net)
    };
    if within([100, 64, 0, 0], 10) {
        return false;
    }
    if ip == u32::from_be_bytes([192, 0, 0, 9]) || ip == u32::from_be_bytes([192, 0, 0, 10]) {
        return true;
    }
    let private: [([u8; 4], u32); 13] = [
        ([0, 0, 0, 0], 8),
        ([10, 0, 0, 0], 8),
        ([127, 0, 0, 0], 8),
        ([169, 254, 0, 0], 16),
        ([172, 16, 0, 0], 12),
        ([192, 0, 0, 0], 24),
        ([192, 0, 2, 0], 24),
        ([192, 168, 0, 0], 16),
        ([198, 18, 0, 0], 15),
        ([198, 51, 100, 0], 24),
        ([203, 0, 113, 0], 24),
        ([240, 0, 0, 0], 4),
        ([255, 255, 255, 255], 32),
    ];
    !private.iter().any(|&(net, len)| within(net, len))
}

/// Replaces the `matches` (byte ranges, in order) of `text` for which `replacement` gives
/// one: the new text, or `None` when nothing was replaced.
fn replace_ranges<'r>(
    text: &str,
    matches: impl IntoIterator<Item = (usize, usize)>,
    mut replacement: impl FnMut(&str) -> Option<&'r str>,
) -> Option<String> {
    let mut out: Option<String> = None;
    let mut copied = 0;
    for (start, end) in matches {
        if let Some(r) = replacement(&text[start..end]) {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(&text[copied..start]);
            o.push_str(r);
            copied = end;
        }
    }
    let mut out = out?;
    out.push_str(&text[copied..]);
    Some(out)
}

impl Pii {
    /// Checks the settings; `at` is their recipe path (`filters.pii`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        for (name, list, on) in [
            (
                "email_replacement",
                &self.email_replacement,
                self.remove_emails,
            ),
            ("ip_replacement", &self.ip_replacement, self.remove_ips),
        ] {
            if on && list.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.{name}"),
                    "needs at least one replacement",
                ));
            }
        }
        Ok(())
    }

    /// The byte ranges of `text` the e-mail pattern matches, as Python's `re.sub` would find
    /// them. The pattern only runs on the runs of e-mail characters around each `@` (with the
    /// text before as context for its `\b`), which gives the same matches: a match contains an
    /// `@` and only such characters.
    fn email_matches(text: &str) -> Vec<(usize, usize)> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        let mut pos = 0;
        while let Some(at) = text[pos..].find('@').map(|i| pos + i) {
            let start = bytes[..at]
                .iter()
                .rposition(|&b| !is_email_byte(b))
                .map_or(0, |i| i + 1);
            let end = bytes[at + 1..]
                .iter()
                .position(|&b| !is_email_byte(b))
                .map_or(text.len(), |i| at + 1 + i);
            let window = &text[..end];
            let mut from = start;
            while from < end
                && let Some(m) = EMAIL.find_at(window, from)
            {
                found.push((m.start(), m.end()));
                from = m.end();
            }
            pos = end;
        }
        found
    }

    /// Redacts `text`: the new text (borrowed when nothing changed) and how many addresses were
    /// replaced. E-mails first, then IPs, as datatrove; each list restarts for every document.
    pub fn redact<'a>(&self, text: &'a str) -> (Cow<'a, str>, u64) {
        let mut count = 0u64;
        let mut text = Cow::Borrowed(text);
        if self.remove_emails && !self.email_replacement.is_empty() && text.contains('@') {
            let matches = Self::email_matches(&text);
            let mut turn = self.email_replacement.iter().cycle();
            if let Some(new) = replace_ranges(&text, matches, |_| {
                count += 1;
                turn.next().map(String::as_str)
            }) {
                text = Cow::Owned(new);
            }
        }
        if self.remove_ips && !self.ip_replacement.is_empty() && text.contains('.') {
            let matches: Vec<_> = IPV4
                .find_iter(&text)
                .map(|m| (m.start(), m.end()))
                .collect();
            let mut turn = self.ip_replacement.iter().cycle();
            let public_only = self.only_remove_public_ips;
            if let Some(new) = replace_ranges(&text, matches, |ip| {
                let valid = parse_ipv4(ip).is_some_and(|v| !public_only || is_global(v));
                valid.then(|| {
                    count += 1;
                    turn.next().map_or("", String::as_str)
                })
            }) {
                text = Cow::Owned(new);
            }
        }
        (text, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(text: &str) -> (String, u64) {
        let (t, n) = Pii::default().redact(text);
        (t.into_owned(), n)
    }

    #[test]
    fn emails_are_replaced_in_turn() {
        assert_eq!(
            redact("Write to jane.doe@mail.example.net or bob+news@Company.CO.uk, or admin@[10.0.0.1]."),
            (
                "Write to email@example.com or firstname.lastname@example.org, or email@example.com."
                    .to_string(),
                3
            )
        );
        // No dot in the domain, or no local part: not an e-mail.
        assert_eq!(
            redact("user@localhost and @handle"),
            ("user@localhost and @handle".into(), 0)
        );
        // `\b`: the match starts at a word boundary, so "-x" is not part of it.
        assert_eq!(redact("see:-x@y.org"), ("see:-email@example.com".into(), 1));
    }

    #[test]
    fn public_ips_only() {
        assert_eq!(
            redact("Server 8.8.8.8 and 1.1.1.1 answered; 93.184.216.34 did not."),
            (
                "Server 22.214.171.124 and 126.96.36.199 answered; 188.8.131.52 did not.".into(),
                3
            )
        );
        for private in [
            "192.168.1.1",
            "10.0.0.1",
            "127.0.0.1",
            "172.16.5.4",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
        ] {
            let text = format!("The router at {private} is local.");
            assert_eq!(redact(&text), (text.clone(), 0), "{private}");
        }
        // Leading zeros: Python's ipaddress rejects them, so they stay.
        assert_eq!(
            redact("Old 08.08.08.08 notation."),
            ("Old 08.08.08.08 notation.".into(), 0)
        );
        // No word boundaries, as in datatrove: part of a longer number is matched.
        assert_eq!(redact("v1234.5.6.7"), ("v122.214.171.124".into(), 1));
        // With only_remove_public_ips off, private addresses go too.
        let all = Pii {
            only_remove_public_ips: false,
            ..Pii::default()
        };
        assert_eq!(all.redact("at 192.168.1.1").0, "at 22.214.171.124");
    }

    #[test]
    fn is_global_matches_python() {
        for (ip, global) in [
            ("8.8.8.8", true),
            ("224.0.0.1", true),
            ("192.0.0.9", true),
            ("192.0.0.1", false),
            ("169.254.1.1", false),
            ("198.19.0.1", false),
            ("198.20.0.1", true),
            ("203.0.113.7", false),
            ("172.32.0.1", true),
            ("240.1.2.3", false),
        ] {
            assert_eq!(is_global(parse_ipv4(ip).unwrap()), global, "{ip}");
        }
    }

    #[test]
    fn counts_and_determinism() {
        let text = "Mail a@b.com, c@d.org and e@f.net from 8.8.4.4, 192.168.0.1 and 9.9.9.9.";
        let (once, n) = redact(text);
        assert_eq!(n, 5);
        assert_eq!(
            once,
            "Mail email@example.com, firstname.lastname@example.org and email@example.com from \
             22.214.171.124, 192.168.0.1 and 126.96.36.199."
        );
        // The same document always gets the same text: the turn restarts per document.
        let pii = Pii::default();
        assert_eq!(pii.redact(text).0, once);
        assert_eq!(pii.redact(text).0, once);
        // Nothing to redact: the text is borrowed, not copied.
        assert!(matches!(
            pii.redact("Nothing here. Really."),
            (Cow::Borrowed(_), 0)
        ));
        let off = Pii {
            remove_emails: false,
            remove_ips: false,
            ..Pii::default()
        };
        assert_eq!(off.redact(text).1, 0);
    }
}
