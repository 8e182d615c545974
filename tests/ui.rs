//! The web page (`zflow run --ui`, `zflow ui`) in a real headless Chromium (Debian's, driven
//! through its ChromeDriver over the WebDriver protocol): while a tiny recipe trains, the page
//! draws the stage graph with each stage's state and a loss curve that grows; afterwards
//! `zflow ui` shows every stage done, the injected crash's restart, and a stage's details on a
//! click. Screenshots go to
//! `target/ui-screenshots/` (the test's artifacts). Also: a request without the token is
//! refused, and the server listens on loopback only.
//!
//! Needs Chromium and ChromeDriver (`scripts/browser.sh`, which `scripts/test.sh` runs): always
//! under CI; elsewhere the test is ignored unless `ZFLOW_CHROMEDRIVER` names the driver.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{Sandbox, free_port};
use serde_json::{Value, json};

const TOKEN: &str = "ui-test-token-0123456789";

/// A headless Chromium session through ChromeDriver.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let driver_path =
            std::env::var("ZFLOW_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {driver_path} (scripts/browser.sh installs it): {e}")
            });
        let base = format!("http://127.0.0.1:{port}");
        wait_for(Duration::from_secs(30), "chromedriver to answer", || {
            get(&format!("{base}/status")).is_some_and(|(code, _)| code == 200)
        });
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1600,1300",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let mut b = Browser {
            driver,
            base,
            session: String::new(),
            _profile: profile,
        };
        let reply = b.call("POST", "/session", caps);
        b.session = reply["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {reply}"))
            .to_string();
        b
    }

    /// One WebDriver command; returns its `value`.
    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let reply = match method {
            "GET" => ureq::get(&url).call(),
            "DELETE" => ureq::delete(&url).call(),
            _ => ureq::post(&url)
                .header("Content-Type", "application/json")
                .send(body.to_string()),
        };
        let text = reply
            .unwrap_or_else(|e| panic!("webdriver {method} {path}: {e}"))
            .body_mut()
            .read_to_string()
            .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.call(
            "POST",
            &format!("/session/{}/url", self.session),
            json!({ "url": url }),
        );
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            json!({ "script": script, "args": [] }),
        )
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.call(
            "GET",
            &format!("/session/{}/screenshot", self.session),
            json!({}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = ureq::delete(&format!("{}/session/{}", self.base, self.session)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn chromium() -> String {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("chromium")
        .to_string()
}

/// GET `url`: (status, body), or `None` when nothing answers.
fn get(url: &str) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.get(url).call().ok()?;
    let code = r.status().as_u16();
    Some((code, r.body_mut().read_to_string().unwrap_or_default()))
}

fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The local addresses (hex, as /proc/net/tcp writes them) of the sockets listening on `port`.
fn listening_addresses(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // f[1] = local address:port, f[3] = state (0A = LISTEN).
            if f.len() > 3
                && f[3] == "0A"
                && let Some((addr, p)) = f[1].split_once(':')
                && u16::from_str_radix(p, 16) == Ok(port)
            {
                out.push(addr.to_string());
            }
        }
    }
    out
}

/// The number of points of `stage`'s loss curve on the page.
fn loss_points(b: &Browser, stage: &str) -> u64 {
    b.eval(&format!(
        "const c = document.querySelector('.phase[data-stage=\"{stage}\"] svg[data-title=\"loss\"]');\
         return c ? Number(c.dataset.points) : 0;"
    ))
    .as_u64()
    .unwrap_or(0)
}

/// Each stage's state as the page colours it.
fn node_states(b: &Browser) -> Vec<(String, String)> {
    let v = b.eval(
        "return [...document.querySelectorAll('#graph .node')]\
         .map(n => [n.dataset.stage, n.dataset.state || '']);",
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(all(zflow_browser, zflow_torch)),
    ignore = "needs Chromium, ChromeDriver and the torch engine's Python: scripts/test.sh installs them"
)]
fn the_page_draws_the_graph_and_a_growing_curve_while_a_recipe_trains() {
    let sb = Sandbox::new();
    // ~230 steps of the torch engine: long enough to watch the curve grow. The worker
    // crashes at step 40 once and is relaunched: a restart for the events table.
    let recipe =
        common::tiny_train_recipe_on("torch", 1, 1).replace("tokens: 30000", "tokens: 120000");
    sb.write("r.yaml", &recipe);
    let port = free_port();
    let run = sb
        .cmd(&[
            "run",
            "r.yaml",
            "-q",
            "--ui",
            "--ui-port",
            &port.to_string(),
        ])
        .env("ZFLOW_UI_TOKEN", TOKEN)
        .env("ZFLOW_FAULTS", "crash@40")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(sb.path().join("run.err")).unwrap())
        .spawn()
        .unwrap();
    let run = KillOnDrop(run);
    let page = format!("http://127.0.0.1:{port}/");
    wait_for(Duration::from_secs(60), "the ui to answer", || {
        get(&page).is_some()
    });

    // Without the token nothing is served; the server listens on 127.0.0.1 only.
    for path in ["", "api/graph", "api/events", "app.js"] {
        let (code, body) = get(&format!("{page}{path}")).unwrap();
        assert_eq!(code, 401, "/{path} without the token: {body}");
    }
    assert_eq!(
        get(&format!("{page}?token=wrong-token-0123456789"))
            .unwrap()
            .0,
        401
    );
    assert_eq!(listening_addresses(port), vec!["0100007F".to_string()]);

    let b = Browser::start();
    b.goto(&format!("{page}?token={TOKEN}"));
    wait_for(
        Duration::from_secs(20),
        "the graph and the first status",
        || b.eval("return document.body.dataset.ready === '1';") == json!(true),
    );
    let states = node_states(&b);
    let names: Vec<&str> = states.iter().map(|(n, _)| n.as_str()).collect();
    for stage in [
        "fetch.prose",
        "ingest.prose",
        "tokenizer",
        "tokenize.code",
        "mix.p1",
        "train.p1",
    ] {
        assert!(names.contains(&stage), "{stage} not drawn: {names:?}");
    }
    assert!(states.iter().all(|(_, s)| !s.is_empty()), "{states:?}");
    // Edges follow `needs`.
    let edge = b.eval("return !!document.querySelector('#graph path[data-from=\"mix.p1\"][data-to=\"train.p1\"]');");
    assert_eq!(edge, json!(true));

    // The loss curve appears while train.p1 runs, and grows.
    wait_for(Duration::from_secs(180), "train.p1's first steps", || {
        loss_points(&b, "train.p1") >= 2
    });
    let first = loss_points(&b, "train.p1");
    let running = node_states(&b)
        .into_iter()
        .find(|(n, _)| n == "train.p1")
        .unwrap()
        .1;
    b.screenshot("1-training.png");
    wait_for(Duration::from_secs(60), "the loss curve to grow", || {
        loss_points(&b, "train.p1") > first + 5
    });
    let later = loss_points(&b, "train.p1");
    b.screenshot("2-training-later.png");
    assert_eq!(running, "running", "train.p1 while its curve grew");
    // The phase's section says how many documents its global batches mix (mix.p1's report).
    let batches = || {
        b.eval("return document.querySelector('.phase[data-stage=\"train.p1\"] .batches').textContent;")
    };
    wait_for(Duration::from_secs(20), "the phase's batch measure", || {
        batches()
            .as_str()
            .unwrap()
            .starts_with("global batches of ")
    });
    eprintln!("loss curve: {first} points, then {later}");

    // The run ends; `zflow ui` shows its store: every stage done, a stage's details on a click.
    let status = run.wait();
    assert!(status.success(), "zflow run --ui: {}", sb.read("run.err"));
    // `--quiet` silences progress, not the page's address: without it the page is unusable.
    assert!(
        sb.read("run.err")
            .contains(&format!("zflow ui: http://127.0.0.1:{port}/?token={TOKEN}")),
        "{}",
        sb.read("run.err")
    );
    drop(b);
    let port2 = free_port();
    let ui = sb
        .cmd(&["ui", "r.yaml", "--ui-port", &port2.to_string()])
        .env("ZFLOW_UI_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _ui = KillOnDrop(ui);
    let page2 = format!("http://127.0.0.1:{port2}/");
    wait_for(Duration::from_secs(30), "zflow ui to answer", || {
        get(&page2).is_some()
    });
    let b = Browser::start();
    b.goto(&format!("{page2}?token={TOKEN}"));
    wait_for(Duration::from_secs(20), "every stage done", || {
        let s = node_states(&b);
        !s.is_empty() && s.iter().all(|(_, st)| st == "done")
    });
    let loaded_ms = b.eval("return performance.getEntriesByName('zflow-status')[0].startTime;");
    b.eval("document.querySelector('#graph .node[data-stage=\"train.p1\"]').dispatchEvent(new MouseEvent('click', {bubbles: true})); return 0;");
    wait_for(Duration::from_secs(20), "train.p1's details", || {
        b.eval("return document.getElementById('stage-name').textContent;") == json!("train.p1")
    });
    let why = b.eval("return document.getElementById('stage-why').textContent;");
    assert!(why.as_str().unwrap().contains("train.p1: cached"), "{why}");
    let outputs = b.eval("return document.getElementById('stage-outputs').textContent;");
    assert!(
        outputs.as_str().unwrap().contains("metrics.parquet"),
        "{outputs}"
    );
    let log = b.eval("return document.getElementById('stage-log').textContent;");
    assert!(!log.as_str().unwrap().is_empty(), "no log tail");
    // The finished curve holds every step, once; the crash is in the events table.
    let steps = std::fs::read_to_string(sb.output("train.p1").join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(r#""type":"step""#))
        .count() as u64;
    assert_eq!(loss_points(&b, "train.p1"), steps);
    let events = b.eval("return document.querySelector('#events tbody').textContent;");
    assert!(
        events.as_str().unwrap().contains("restart (attempt 1)"),
        "{events}"
    );
    let shot = b.screenshot("3-done.png");
    eprintln!(
        "page ready {loaded_ms} ms after navigation; screenshots in {}",
        shot.parent().unwrap().display()
    );
}

/// A child process killed if the test fails before it ends.
struct KillOnDrop(Child);

impl KillOnDrop {
    fn wait(mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak resident memory (VmHWM, KiB) of process `pid`.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Downloads `url` with the token, returning (status, bytes received) without keeping them.
fn download(url: &str) -> (u16, u64) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.get(url).call().unwrap();
    let code = r.status().as_u16();
    let n = std::io::copy(&mut r.body_mut().as_reader(), &mut std::io::sink()).unwrap();
    (code, n)
}

/// What the page serves is only what a stage committed, streamed (issue: a link to a host
/// file was served, live, and every file was read whole into memory), and the token never
/// travels on a command line. No browser needed.
#[test]
fn the_page_serves_only_committed_bytes_streamed_and_its_token_never_on_a_command_line() {
    let sb = Sandbox::new();
    let host = sb.write("host/secret.txt", "the host file\n");
    sb.write("host/dir/inner.txt", "inside a linked folder\n");
    sb.write(
        "r.yaml",
        &format!(
            "stages:\n  - name: out\n    kind: shell\n    run: |\n      head -c 100000000 /dev/zero > \"$ZFLOW_OUT/big.bin\"\n      ln -s {host} \"$ZFLOW_OUT/host.txt\"\n      ln -s {dir} \"$ZFLOW_OUT/dir\"\n",
            host = host.display(),
            dir = sb.path().join("host/dir").display()
        ),
    );
    sb.ok(&["run", "r.yaml"]);
    // A link in an output is committed as what it points at: a file, a folder copied whole.
    let out = sb.output("out");
    for p in ["host.txt", "dir", "dir/inner.txt"] {
        let meta = std::fs::symlink_metadata(out.join(p)).unwrap();
        assert!(!meta.file_type().is_symlink(), "{p} is still a link");
    }
    assert_eq!(sb.read("zflow-store/../host/secret.txt"), "the host file\n");
    assert_eq!(
        std::fs::read_to_string(out.join("dir/inner.txt")).unwrap(),
        "inside a linked folder\n"
    );

    // The token: no flag takes it; one a URL cannot carry as it is is refused.
    let flag = sb.zflow(&["ui", "r.yaml", "--ui-token", TOKEN]);
    assert_ne!(flag.code, 0, "--ui-token must be gone: {}", flag.stderr);
    let bad = sb
        .cmd(&["ui", "r.yaml", "--ui-port", "0"])
        .env("ZFLOW_UI_TOKEN", "not a url-safe token&x")
        .output()
        .unwrap();
    let bad_err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && bad_err.contains("letters, digits and `-._~`"),
        "{bad_err}"
    );
    let token_file = sb.write("token", &format!("{TOKEN}\n"));
    // A token file other users may read guards nothing, and one that never ends is not read
    // to its end: both refused.
    let mode = |m| -> std::fs::Permissions { std::os::unix::fs::PermissionsExt::from_mode(m) };
    std::fs::set_permissions(&token_file, mode(0o644)).unwrap();
    for (file, why) in [
        (token_file.to_str().unwrap(), "lets other users read it"),
        ("/dev/zero", "not a regular file"),
    ] {
        let refused = sb.zflow(&["ui", "r.yaml", "--ui-port", "0", "--ui-token-file", file]);
        assert!(
            refused.code != 0 && refused.stderr.contains(why),
            "{file}: {}",
            refused.stderr
        );
    }
    std::fs::set_permissions(&token_file, mode(0o600)).unwrap();
    let port = free_port();
    let ui = sb
        .cmd(&[
            "ui",
            "r.yaml",
            "--ui-port",
            &port.to_string(),
            "--ui-token-file",
            token_file.to_str().unwrap(),
        ])
        .env_remove("ZFLOW_UI_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = ui.id();
    let _ui = KillOnDrop(ui);
    let file = |rel: &str| format!("http://127.0.0.1:{port}/api/file/out/{rel}?token={TOKEN}");
    wait_for(Duration::from_secs(30), "zflow ui to answer", || {
        get(&file("host.txt")).is_some()
    });
    assert_eq!(
        get(&file("host.txt")).unwrap(),
        (200, "the host file\n".to_string())
    );
    // The host file changes: the store's copy does not.
    std::fs::write(&host, "changed on the host\n").unwrap();
    assert_eq!(get(&file("host.txt")).unwrap().1, "the host file\n");

    // 8 downloads of 100 MB at once, in bounded memory.
    let before = peak_rss_kib(pid);
    let downloads: Vec<_> = (0..8)
        .map(|_| {
            let url = file("big.bin");
            std::thread::spawn(move || download(&url))
        })
        .collect();
    for d in downloads {
        assert_eq!(d.join().unwrap(), (200, 100_000_000));
    }
    let grown_mib = (peak_rss_kib(pid) - before) as f64 / 1024.0;
    eprintln!("8 x 100 MB downloads: peak RSS grew {grown_mib:.1} MiB");
    assert!(grown_mib < 64.0, "peak RSS grew {grown_mib:.1} MiB");

    // A committed file changed in place, or swapped for a link to a host file: refused.
    std::fs::write(out.join("dir/inner.txt"), "edited in the store\n").unwrap();
    let (code, body) = get(&file("dir/inner.txt")).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("changed since"), "{body}");
    std::fs::remove_file(out.join("host.txt")).unwrap();
    std::os::unix::fs::symlink(&host, out.join("host.txt")).unwrap();
    let (code, body) = get(&file("host.txt")).unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("changed on the host"), "{body}");
}
