//! Hostile programs, each contained and scored as a failure, leaving the host as it was.

use super::*;

fn sandbox() -> PythonSandbox {
    PythonSandbox::new(Path::new("python3"), Limits::default()).expect("python3 and namespaces")
}

/// Processes on the host whose command line holds `marker`.
fn processes_marked(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(marker))
        .count()
}

#[test]
fn a_correct_program_passes_and_a_wrong_one_fails() {
    let s = sandbox();
    assert_eq!(
        s.run("assert sum([1, 2]) == 3\n").unwrap().outcome,
        Outcome::Passed
    );
    let run = s.run("def f():\n    return 2\nassert f() == 3\n").unwrap();
    assert_eq!(run.outcome, Outcome::Failed { code: 1 });
    assert!(run.stderr.contains("AssertionError"), "{}", run.stderr);
}

#[test]
fn a_fork_bomb_is_contained_and_leaves_no_process() {
    let marker = format!("zflow-bomb-{}", std::process::id());
    // Every child re-runs the bomb with the marker in its command line; a failed fork is
    // retried, so only the sandbox's end stops it.
    let program = format!(
        "import os, sys\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n        continue\n    if pid == 0:\n        os.execv(sys.executable, [sys.executable, '-I', '/sandbox/program.py', '{marker}'])\n"
    );
    let run = sandbox().run(&program).unwrap();
    assert!(!run.outcome.passed(), "{run:?}");
    assert_eq!(
        processes_marked(&marker),
        0,
        "bomb processes outlived the sandbox"
    );
}

#[test]
fn files_outside_the_sandbox_can_be_neither_removed_nor_read() {
    let host = tempfile::tempdir().unwrap();
    let canary = host.path().join("canary");
    std::fs::create_dir(&canary).unwrap();
    std::fs::write(canary.join("secret.txt"), "the user's secret").unwrap();
    let c = canary.display();
    let s = sandbox();
    let removal = format!("import os, shutil\nos.system('rm -rf {c}')\nshutil.rmtree('{c}')\n");
    assert!(!s.run(&removal).unwrap().outcome.passed());
    let reading = format!("print(open('{c}/secret.txt').read())\n");
    let run = s.run(&reading).unwrap();
    assert!(!run.outcome.passed());
    assert!(run.stderr.contains("FileNotFoundError"), "{}", run.stderr);
    // The system folders are there, read-only.
    let writing = "open('/usr/zflow-sandbox-probe', 'w').write('x')\n";
    let run = s.run(writing).unwrap();
    assert!(!run.outcome.passed());
    assert!(
        run.stderr.contains("Read-only file system"),
        "{}",
        run.stderr
    );
    assert!(!Path::new("/usr/zflow-sandbox-probe").exists());
    assert_eq!(
        std::fs::read_to_string(canary.join("secret.txt")).unwrap(),
        "the user's secret"
    );
}

#[test]
fn an_infinite_loop_is_killed() {
    let run = sandbox().run("while True:\n    pass\n").unwrap();
    assert!(matches!(run.outcome, Outcome::Killed { .. }), "{run:?}");
}

#[test]
fn a_100_gb_allocation_and_a_huge_file_fail() {
    let s = sandbox();
    let run = s.run("x = bytearray(100 * 2**30)\n").unwrap();
    assert!(!run.outcome.passed());
    assert!(run.stderr.contains("MemoryError"), "{}", run.stderr);
    let run = s
        .run("with open('big', 'wb') as f:\n    f.write(b'0' * (64 << 20))\n")
        .unwrap();
    assert!(!run.outcome.passed(), "{run:?}");
}

#[test]
fn a_socket_reaches_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let program = format!(
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'hi')\n"
    );
    let run = sandbox().run(&program).unwrap();
    assert!(run.stderr.contains("Network is unreachable"), "{run:?}");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the sandbox reached the host's loopback"
    );
}

#[test]
fn programs_run_in_parallel_in_order() {
    let programs: Vec<String> = (0..8).map(|i| format!("assert {i} % 2 == 0\n")).collect();
    let runs = sandbox().run_all(&programs, 4).unwrap();
    let passed: Vec<bool> = runs.iter().map(|r| r.outcome.passed()).collect();
    assert_eq!(passed, (0..8).map(|i| i % 2 == 0).collect::<Vec<_>>());
}
