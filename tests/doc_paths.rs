//! Every repository path that the docs (ARCHITECTURE.md, README.md, SECURITY.md and the
//! crates' READMEs) or a code comment names must exist: a map that points at moved or deleted
//! files misleads whoever picks the code up next.
//!
//! A path is a token that starts with one of the repository's top-level folders
//! (`pipeline/src/run.rs`), or one with a folder and a source file name (`commands/ckpt.rs`).
//! It may be written from the repository's root, from the folder of the file that names it,
//! from that file's crate (or its `src/`) or Python package, and in Markdown from the folder a
//! section's heading names (`## The engine (pipeline/src)`, in backticks) or that folder's
//! parent. Patterns (`*`, `{`, `<`, `$`), URLs, absolute paths, build outputs (`target/`) and
//! files of other projects that comments cite ([`ELSEWHERE`]) are skipped.

use std::path::{Path, PathBuf};

/// The repository's top-level folders: a token starting with one of these is a path.
const TOP: &[&str] = &[
    "pipeline/",
    "stages/",
    "runtime/",
    "evals/",
    "recipes/",
    "workers/",
    "scripts/",
    "tests/",
    "src/",
    "files/",
    "ui/",
    "gguf/",
    ".ci/",
];

/// Paths of other projects that comments cite (Megatron-LM's and transformers' sources).
const ELSEWHERE: &[&str] = &["megatron/", "src/transformers/"];

/// Source file endings: a token with a folder and one of these is a path.
const SOURCE: &[&str] = &[".rs", ".py", ".sh", ".md", ".yaml", ".toml", ".lock"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's tracked files (git), relative to its root.
fn tracked() -> Vec<PathBuf> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git lists the repository's files");
    assert!(out.status.success(), "git ls-files failed");
    out.stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        .collect()
}

/// The text of `file` where paths are named: all of a Markdown file; the comments of code
/// (after `//` in Rust, `#` in Python, shell and YAML) and Python's docstrings (every line
/// from one that opens a triple-quoted string to the one that closes it), one entry per line.
fn prose(file: &Path, text: &str) -> Vec<(usize, String)> {
    let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
    let mut in_docstring = false;
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            if ext == "py" {
                let was = in_docstring;
                in_docstring ^= line.matches("\"\"\"").count() % 2 == 1;
                if was || line.contains("\"\"\"") {
                    return Some((i + 1, line.to_string()));
                }
            }
            let part = match ext {
                "md" => Some(line),
                "rs" => line.find("//").map(|at| &line[at..]),
                "py" | "sh" | "yaml" | "yml" | "toml" => line.find('#').map(|at| &line[at..]),
                _ => None,
            }?;
            Some((i + 1, part.to_string()))
        })
        .collect()
}

/// The tokens of `line` that name repository paths.
fn paths_in(line: &str) -> Vec<String> {
    line.split(|c: char| {
        c.is_whitespace() || matches!(c, '`' | '(' | ')' | '[' | ']' | '"' | '\'' | ',' | ';')
    })
    .map(|t| t.trim_end_matches([':', '.', ',']))
    .filter(|t| {
        let looks = TOP.iter().any(|top| t.starts_with(top))
            || (t.contains('/') && SOURCE.iter().any(|ext| t.ends_with(ext)));
        let pattern = t.contains(['*', '{', '}', '<', '>', '$', '|', '=', '\\'])
            || t.contains("...")
            || t.contains("://")
            || t.starts_with('/')
            || t.starts_with('~')
            || t.starts_with("target/")
            || t.contains("/target/")
            || t.contains("..")
            || ELSEWHERE.iter().any(|e| t.starts_with(e));
        looks && !pattern
    })
    .map(str::to_string)
    .collect()
}

/// Where a path named in `file` may be written from.
fn bases(file: &Path) -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.clone()];
    let mut dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    out.push(root.join(&dir));
    loop {
        let package = root.join(&dir);
        if package.join("Cargo.toml").exists() || package.join("pyproject.toml").exists() {
            out.push(root.join(&dir));
            out.push(root.join(&dir).join("src"));
            out.push(root.join(&dir).join("zflow_torch"));
        }
        if !dir.pop() {
            break;
        }
    }
    out
}

#[test]
fn every_path_the_docs_and_comments_name_exists() {
    let mut missing = Vec::new();
    let mut checked = 0usize;
    for file in tracked() {
        let Ok(text) = std::fs::read_to_string(root().join(&file)) else {
            continue; // not text
        };
        let file_bases = bases(&file);
        let mut bases = file_bases.clone();
        for (line, part) in prose(&file, &text) {
            if part.starts_with('#') && file.extension().is_some_and(|e| e == "md") {
                bases = file_bases.clone();
                for dir in part.split('`').skip(1).step_by(2) {
                    let dir = root().join(dir.trim_end_matches('/'));
                    if dir.is_dir() {
                        bases.extend(dir.parent().map(Path::to_path_buf));
                        bases.push(dir);
                    }
                }
            }
            for path in paths_in(&part) {
                checked += 1;
                let clean = path.trim_end_matches('/');
                if !bases.iter().any(|b| b.join(clean).exists()) {
                    missing.push(format!("{}:{line}: `{path}`", file.display()));
                }
            }
        }
    }
    eprintln!("{checked} path mentions checked");
    assert!(checked > 100, "the scan found almost no paths ({checked})");
    assert!(
        missing.is_empty(),
        "{} path(s) named in docs or comments do not exist:\n{}",
        missing.len(),
        missing.join("\n")
    );
}
