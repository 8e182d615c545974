//! The recipe fuzzer: shipped and test recipes with their values, names, sizes and nesting
//! replaced by hostile ones, each loaded by the real binary (`zflow plan`). No mutant may
//! crash, hang or fail without saying where: an error names `r.yaml:LINE`.
//!
//! The mutants come from a seeded generator; the seed is printed, and `ZFLOW_FUZZ_SEED=N`
//! (with `ZFLOW_FUZZ_CASES=M`) replays or widens a run.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Sandbox;

/// SplitMix64: a small seeded generator, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values a hostile or careless author might write where a value goes.
fn hostile_values(rng: &mut Rng) -> String {
    let depth = 1 + rng.below(300);
    let fixed = [
        "0",
        "-1",
        "-0.0",
        "0.5",
        "1e308",
        "1e999",
        ".nan",
        ".inf",
        "-.inf",
        "4294967296",
        "9223372036854775807",
        "18446744073709551616",
        "-9223372036854775809",
        "true",
        "null",
        "~",
        "\"\"",
        "[]",
        "{}",
        "[1, 2, 3]",
        "{a: 1}",
        "\"../../../etc/passwd\"",
        "/dev/zero",
        "\"${nope}\"",
        "\"$${escaped}\"",
        "\"\\0\"",
        "\"caf\u{e9} \u{1f680}\"",
        "&anchor 7",
        "*anchor",
        "!!binary aGVsbG8=",
        "!custom tag",
        "'single ''quoted'''",
        "|\n  block\n  text",
        "0x10",
        "0o17",
        "+12",
        "1_000",
        "2026-12-01",
    ];
    match rng.below(fixed.len() + 3) {
        i if i < fixed.len() => fixed[i].to_string(),
        i if i == fixed.len() => format!("\"{}\"", "x".repeat(1 + rng.below(100_000))),
        i if i == fixed.len() + 1 => format!("{}1{}", "[".repeat(depth), "]".repeat(depth)),
        _ => format!("{}{}", "{a: ".repeat(depth), "}".repeat(depth)),
    }
}

/// Names a stage, source, phase or setting might be given.
fn hostile_name(rng: &mut Rng) -> String {
    let fixed = [
        "a-b",
        "a_b",
        "a.b",
        "A",
        "",
        "-",
        ".",
        "..",
        "x/y",
        "x y",
        "tokenize",
        "fetch.a",
        "caf\u{e9}",
        "1",
        "true",
        "null",
        "name",
        "needs",
        "kind",
        "phases",
        "stages",
        "model",
        "<<",
    ];
    match rng.below(fixed.len() + 1) {
        i if i < fixed.len() => fixed[i].to_string(),
        _ => "n".repeat(1 + rng.below(400)),
    }
}

/// Positions of `key: value` pairs (block or flow style) in `text`: (key start, key end,
/// value start, value end).
fn pairs(text: &str) -> Vec<(usize, usize, usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for (i, _) in text.match_indices(": ") {
        let mut k = i;
        while k > 0 && (bytes[k - 1].is_ascii_alphanumeric() || b"_.-".contains(&bytes[k - 1])) {
            k -= 1;
        }
        let v = i + 2;
        let mut e = v;
        while e < bytes.len() && !b"\n,}".contains(&bytes[e]) {
            if bytes[e] == b'{' || bytes[e] == b'[' {
                break;
            }
            e += 1;
        }
        if k < i && e > v {
            out.push((k, i, v, e));
        }
    }
    out
}

/// One mutant of `base`: one to three edits.
fn mutate(base: &str, rng: &mut Rng) -> String {
    let mut text = base.to_string();
    for _ in 0..1 + rng.below(3) {
        let found = pairs(&text);
        if found.is_empty() {
            break;
        }
        let (k, ke, v, ve) = *rng.pick(&found);
        text = match rng.below(6) {
            // A value replaced (most mutants: values are where semantics live).
            0..=2 => format!("{}{}{}", &text[..v], hostile_values(rng), &text[ve..]),
            // A key renamed.
            3 => format!("{}{}{}", &text[..k], hostile_name(rng), &text[ke..]),
            // A line repeated (duplicate keys) or dropped.
            _ => {
                let lines: Vec<&str> = text.lines().collect();
                let at = rng.below(lines.len());
                let mut out: Vec<&str> = lines.clone();
                if rng.below(2) == 0 {
                    out.insert(at, lines[at]);
                } else {
                    out.remove(at);
                }
                out.join("\n") + "\n"
            }
        };
    }
    text
}

/// What loading one mutant did.
enum Verdict {
    Fine,
    Bad(String),
}

fn load(sb: &Sandbox, text: &str) -> Verdict {
    let store = sb.path().join("zflow-store");
    let _ = std::fs::remove_dir_all(&store);
    sb.write("r.yaml", text);
    let mut child = sb
        .cmd(&["plan", "r.yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read stderr while the child runs: a long message must not fill the pipe and stall it.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut text).map(|_| text)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Verdict::Bad("`zflow plan` hung (20 s)".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = reader.join().unwrap().unwrap();
    if stderr.len() > 20_000 {
        return Verdict::Bad(format!("{} bytes of error output", stderr.len()));
    }
    let located = stderr.contains("r.yaml:")
        && stderr
            .split("r.yaml:")
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    match status.code() {
        _ if stderr.contains("panicked") => Verdict::Bad(format!("panicked:\n{stderr}")),
        Some(0) => Verdict::Fine,
        Some(2) if store.exists() => {
            Verdict::Bad(format!("a bad recipe created the store:\n{stderr}"))
        }
        Some(1 | 2) if located => Verdict::Fine,
        Some(code) => Verdict::Bad(format!("exit {code} without a location:\n{stderr}")),
        None => Verdict::Bad(format!("killed by a signal ({status}):\n{stderr}")),
    }
}

#[test]
fn hostile_values_names_sizes_and_nesting_never_crash_and_every_error_is_located() {
    let seed: u64 = std::env::var("ZFLOW_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    let cases: usize = std::env::var("ZFLOW_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    eprintln!("recipe fuzzer: seed {seed}, {cases} mutants (ZFLOW_FUZZ_SEED to replay)");
    let repo = env!("CARGO_MANIFEST_DIR");
    let bases = [
        std::fs::read_to_string(format!("{repo}/recipes/zaya1-nano.yaml")).unwrap(),
        common::tiny_train_recipe(2, 1),
        "name: six\nvars:\n  mode: fast\nstages:\n  - name: corpus\n    kind: fetch\n    url: data/*.txt\n  - name: words\n    kind: shell\n    needs: [corpus]\n    env: {MODE: \"${mode}\"}\n    resources: {cpus: 1, memory_gb: 0.5}\n    run: cat \"$ZFLOW_IN_CORPUS\"/*.txt | wc -w > \"$ZFLOW_OUT/w\"\n".to_string(),
    ];
    let sb = Sandbox::new();
    sb.write("data/a.txt", "some words\n");
    for base in &bases {
        assert!(
            matches!(load(&sb, base), Verdict::Fine),
            "a base recipe does not load"
        );
    }
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    for case in 0..cases {
        let base = &bases[case % bases.len()];
        let text = mutate(base, &mut rng);
        match load(&sb, &text) {
            Verdict::Fine => {}
            Verdict::Bad(why) => {
                let kept = format!(
                    "{}/fuzz-seed{seed}-mutant{case}.yaml",
                    env!("CARGO_TARGET_TMPDIR")
                );
                std::fs::write(&kept, &text).unwrap();
                let shown: String = text.chars().take(2000).collect();
                failures.push(format!(
                    "mutant {case} ({kept}): {why}\n--- recipe ---\n{shown}"
                ));
            }
        }
    }
    eprintln!(
        "recipe fuzzer: {cases} mutants, {} handled cleanly",
        cases - failures.len()
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {cases} mutants mishandled; first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}
