//! `fetch` against the real package registries (PyPI, Debian, npm), pinned and checked.

mod common;

use common::Sandbox;

fn output_file(sb: &Sandbox, stage: &str, file: &str) -> std::path::PathBuf {
    sb.output(stage).join(file)
}

#[test]
fn pip_deb_and_npm_sources_are_fetched_and_checked() {
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        r#"
stages:
  - name: six
    kind: fetch
    url: pip://six==1.16.0/six.py
    sha256: 8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
  - name: fortunes
    kind: fetch
    url: deb://fortunes-min=1:1.99.1-7.3/usr/share/games/fortunes
    sha256: 9eed5b45064e41133dae0967cf3a17588ad77c014fcc7bf1527fa3ea48e44d07
  - name: isnumber
    kind: fetch
    url: npm://is-number@7.0.0/package
    sha256: 7b75c1057198cf97696909a9bee176c9c5e9bcb5b03bf3ecef2f484defadd51e
"#,
    );
    let run = sb.ok(&["run", "r.yaml"]);
    assert_eq!(run.counts(), (3, 0, 0, 0), "{}", run.stderr);
    let six = std::fs::read_to_string(output_file(&sb, "six", "six.py")).unwrap();
    assert!(six.contains("__version__ = \"1.16.0\""));
    let fortunes = std::fs::read_to_string(output_file(&sb, "fortunes", "fortunes")).unwrap();
    assert!(
        fortunes.contains("\n%\n"),
        "fortune records are separated by % lines"
    );
    assert!(output_file(&sb, "isnumber", "index.js").exists());
    // Cached downloads are reused: a second stage reading the same wheel downloads nothing.
    let again = sb.ok(&[
        "run",
        "r.yaml",
        "--set",
        "stages.six.url=pip://six==1.16.0/six-1.16.0.dist-info",
    ]);
    assert_eq!(again.ran(), ["six"]);
    assert!(output_file(&sb, "six", "METADATA").exists());
}

#[test]
fn a_wrong_pin_fails_with_both_hashes_and_nothing_is_committed() {
    let sb = Sandbox::new();
    let wrong = "0".repeat(64);
    sb.write(
        "r.yaml",
        &format!("stages:\n  - {{name: six, kind: fetch, url: 'pip://six==1.16.0/six.py', sha256: '{wrong}'}}\n"),
    );
    let run = sb.zflow(&["run", "r.yaml"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("sha256 mismatch") && run.stderr.contains(&wrong),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("8abb2f1d86890a2d"), "{}", run.stderr);
    let status = sb.ok(&["status", "r.yaml"]);
    assert!(status.stdout.contains("failed"), "{}", status.stdout);
}

#[test]
fn missing_paths_in_packages_and_local_files_are_clear_errors() {
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        "stages:\n  - {name: a, kind: fetch, url: 'pip://six==1.16.0/nope'}\n  - {name: b, kind: fetch, url: 'data/*.csv'}\n",
    );
    let run = sb.zflow(&["run", "r.yaml"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("`nope` is not in the archive"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("`data/*.csv` matches no files"),
        "{}",
        run.stderr
    );
}
