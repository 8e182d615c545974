//! `fetch` against the real package registries (PyPI wheels and sdists, npm, Debian), pinned
//! and checked; and every fetch of every shipped recipe, resolved and verified for real.

mod common;

use common::Sandbox;

fn output_file(sb: &Sandbox, stage: &str, file: &str) -> std::path::PathBuf {
    sb.output(stage).join(file)
}

#[test]
fn pip_sdist_npm_and_deb_sources_are_fetched_and_checked() {
    let sb = Sandbox::new();
    sb.write(
        "r.yaml",
        r#"
stages:
  - name: six
    kind: fetch
    url: pip://six==1.16.0/six.py
    sha256: 8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
  - name: sixdocs
    kind: fetch
    url: sdist://six==1.16.0/documentation
    sha256: 1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926
  # Debian keeps only a package's current revision, so this one is not pinned (see below).
  - name: fortunes
    kind: fetch
    url: deb://fortunes-min/usr/share/games/fortunes
  - name: isnumber
    kind: fetch
    url: npm://is-number@7.0.0/package
    sha256: 7b75c1057198cf97696909a9bee176c9c5e9bcb5b03bf3ecef2f484defadd51e
"#,
    );
    let run = sb.ok(&["run", "r.yaml"]);
    assert_eq!(run.counts(), (4, 0, 0, 0), "{}", run.stderr);
    let six = std::fs::read_to_string(output_file(&sb, "six", "six.py")).unwrap();
    assert!(six.contains("__version__ = \"1.16.0\""));
    // The sdist's documentation folder, below its top folder `six-1.16.0/`.
    let docs = std::fs::read_to_string(output_file(&sb, "sixdocs", "index.rst")).unwrap();
    assert!(
        docs.contains("Six: Python 2 and 3 Compatibility Library"),
        "{docs}"
    );
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

#[test]
fn a_debian_version_that_left_the_archive_is_named_with_the_versions_it_has() {
    let sb = Sandbox::new();
    sb.write("r.yaml", "stages:\n  - {name: gone, kind: fetch, url: 'deb://fortunes-min=1:0.0-gone/usr/share/games/fortunes'}\n");
    let run = sb.zflow(&["run", "r.yaml"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let e = &run.stderr;
    assert!(
        e.contains("`fortunes-min` version `1:0.0-gone` is not in the archive")
            && e.contains("offers now: 1:"),
        "{e}"
    );
    assert!(e.contains("PyPI, npm or crates.io"), "{e}");
}

/// Every `fetch` stage of every shipped recipe (but zaya1.yaml's corpora, which are paths on the
/// cluster) downloads from its registry into a fresh store and matches its sha256 pin: a pin that
/// rots fails here, not in a user's first run.
#[test]
fn every_fetch_of_every_shipped_recipe_resolves_and_matches_its_pin() {
    use zflow_pipeline::{LoadOptions, recipe};
    let sb = Sandbox::new();
    let store = sb.path().join("store");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut recipes: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    recipes.sort();
    let mut fetched = 0;
    for path in &recipes {
        let opts = LoadOptions {
            sets: vec![],
            store: Some(store.clone()),
        };
        let loaded = recipe::load(path, &opts, &zflow_stages::registry())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut until = Vec::new();
        for node in loaded.nodes.iter().filter(|n| n.stage.kind() == "fetch") {
            let url = node.config["url"].as_str().unwrap();
            if !url.contains("://") {
                assert!(
                    path.ends_with("zaya1.yaml"),
                    "{}: `{}` fetches a local path `{url}`",
                    path.display(),
                    node.name
                );
                continue;
            }
            assert!(
                !url.starts_with("deb://"),
                "{}: `{}` pins a Debian version, which vanishes at the next point release",
                path.display(),
                node.name
            );
            assert!(
                node.config["sha256"].is_string(),
                "{}: `{}` ({url}) has no sha256 pin",
                path.display(),
                node.name
            );
            until.extend(["--until".to_string(), node.name.clone()]);
        }
        if until.is_empty() {
            continue;
        }
        let mut args = vec![
            "run".to_string(),
            path.display().to_string(),
            "--store".into(),
            store.display().to_string(),
            "--quiet".into(),
            // Here, whatever cluster the recipe names (zaya1.yaml's Slurm partition).
            "--set".into(),
            "executor={kind: local}".into(),
        ];
        args.extend(until.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = sb.zflow(&args);
        assert_eq!(
            run.code,
            0,
            "{}: fetching {until:?} failed:\n{}",
            path.display(),
            run.stderr
        );
        fetched += until.len() / 2;
    }
    assert!(
        fetched >= 12,
        "only {fetched} fetch stages in {} recipes",
        recipes.len()
    );
    byte_level_ids_equal_encode_fasts_on(&store);
}

/// The tokenize stage's byte-level encoder (`stages/src/encoder.rs`) gives `tokenizers`'
/// `encode_fast` ids on the shipped recipes' text: every UTF-8 file the fetches above brought
/// (corpora, benchmark data, package sources; up to 12 MB), as paragraphs, under a BPE trained
/// on the first 2 MB of them as the tokenizer stage trains one.
fn byte_level_ids_equal_encode_fasts_on(store: &std::path::Path) {
    let mut files = Vec::new();
    let mut stack = common::entries_starting_with(store, "fetch.");
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else {
            files.push(p);
        }
    }
    files.sort();
    let (mut docs, mut bytes) = (Vec::new(), 0usize);
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        bytes += text.len();
        docs.extend(text.split("\n\n").map(String::from));
        if bytes > 12 << 20 {
            break;
        }
    }
    assert!(bytes > 4 << 20, "only {bytes} bytes of text fetched");
    let mut sample = Vec::new();
    let mut taken = 0;
    for d in &docs {
        taken += d.len();
        sample.push(d.clone());
        if taken > 2 << 20 {
            break;
        }
    }
    let c: zflow_stages::tokenizer::TokenizerConfig =
        serde_json::from_value(serde_json::json!({"train": {"vocab_size": 8192}})).unwrap();
    let samples = [("shipped".to_string(), sample)].into_iter().collect();
    let tokenizer =
        zflow_stages::tokenizer::train(&c, c.train.as_ref().unwrap(), &samples).unwrap();
    let encoder = zflow_stages::encoder::Encoder::new(&tokenizer);
    assert!(encoder.is_byte_level());
    for d in &docs {
        assert!(
            encoder.agrees_with_encode_fast(d).unwrap(),
            "ids differ on {:?}",
            d.chars().take(200).collect::<String>()
        );
    }
    eprintln!(
        "byte-level encoder = encode_fast on {} documents, {bytes} bytes",
        docs.len()
    );
}

#[test]
fn a_fifo_or_a_device_as_a_fetch_path_is_an_error_not_a_hang() {
    let sb = Sandbox::new();
    let fifo = sb.path().join("pipe");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for url in [fifo.display().to_string(), "/dev/zero".to_string()] {
        sb.write(
            "r.yaml",
            &format!("stages:\n  - {{name: a, kind: fetch, url: '{url}'}}\n"),
        );
        let mut child = sb
            .cmd(&["run", "r.yaml"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("`zflow run` on a fetch of {url} hangs");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("is not a regular file or folder"),
            "{url}: {stderr}"
        );
    }
}

/// The bytes this process and its reaped children have read through `read(2)` and the like
/// (`rchar` of /proc/self/io).
fn bytes_read() -> u64 {
    rchar(&std::fs::read_to_string("/proc/self/io").unwrap())
}

/// The `rchar` of a /proc/PID/io text.
fn rchar(io: &str) -> u64 {
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_plan_reads_no_byte_of_a_local_corpus_and_its_fetch_copies_none() {
    let sb = Sandbox::new();
    // 64 MiB in 16 files, sparse: free to make, and read(2) of them counts as much as any data.
    std::fs::create_dir_all(sb.path().join("corpus")).unwrap();
    for i in 0..16 {
        std::fs::File::create(sb.path().join(format!("corpus/part-{i:02}.txt")))
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
    }
    sb.write(
        "r.yaml",
        "name: in-place\nsources:\n  corpus:\n    url: \"corpus/*.txt\"\n    format: text\n",
    );
    // `zflow plan` runs in a shell whose own reads are a few hundred bytes; the kernel adds a
    // reaped child's counts to its parent's, so the shell's rchar after the plan is the plan's.
    let script = format!(
        "'{}' plan r.yaml >/dev/null && cat /proc/$$/io",
        env!("CARGO_BIN_EXE_zflow")
    );
    let plan_reads = || -> u64 {
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(sb.path())
            .env_remove("ZFLOW_STORE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        rchar(&String::from_utf8_lossy(&out.stdout))
    };
    let corpus = 64u64 << 20;
    let before = plan_reads();
    assert!(
        before < corpus / 16,
        "a plan read {before} bytes of a {corpus}-byte corpus"
    );

    // The fetch hashes each file once and copies none; a plan after it still reads none.
    let start = bytes_read();
    sb.ok(&["run", "r.yaml", "--until", "fetch.corpus"]);
    let fetch_reads = bytes_read() - start;
    assert!(
        (corpus..corpus + corpus / 4).contains(&fetch_reads),
        "the fetch read {fetch_reads} bytes of a {corpus}-byte corpus: each file once"
    );
    let out = sb.output("fetch.corpus");
    let stored: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(stored < 16 << 10, "the fetch stored {stored} bytes");
    let pointer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("part-03.txt")).unwrap()).unwrap();
    assert_eq!(pointer["path"], "corpus/part-03.txt");
    assert_eq!(pointer["size"], 4 << 20);
    let after = plan_reads();
    assert!(
        after < corpus / 16,
        "a plan read {after} bytes of a {corpus}-byte corpus"
    );
}
