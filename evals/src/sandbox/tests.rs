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

/// The probe's escape: remount a read-only bind writable, then write into it. The program has
/// no capability to do it with, in its namespace or in one it makes, and the host file is not
/// created.
#[test]
fn a_program_can_neither_remount_its_folders_writable_nor_hold_a_capability() {
    let s = sandbox();
    let escape = format!("zflow-escape-{}", std::process::id());
    let program = format!(
        r#"import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REMOUNT = 4096, 32
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
status = dict(l.split(':', 1) for l in open('/proc/self/status'))
print('uid', os.getuid(), 'CapEff', status['CapEff'].strip(), 'CapPrm', status['CapPrm'].strip(), file=sys.stderr)
def remount_all(where):
    for d in [sys.base_prefix, '/usr', '/etc']:
        rc = libc.mount(None, d.encode(), None, MS_REMOUNT | MS_BIND, None)
        print(where, d, 'remount', rc, os.strerror(ctypes.get_errno()), file=sys.stderr)
remount_all('sandbox')
# A user namespace of its own gives it capabilities there, over locked copies of the mounts.
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
    remount_all('nested')
open(os.path.join(sys.base_prefix, '{escape}'), 'w').write('escaped')
"#
    );
    let run = s.run(&program).unwrap();
    assert!(!run.outcome.passed(), "{run:?}");
    assert!(
        run.stderr.contains(&format!(
            "uid {INSIDE_ID} CapEff 0000000000000000 CapPrm 0000000000000000"
        )),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("remount 0 "),
        "a remount succeeded: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Read-only file system"),
        "{}",
        run.stderr
    );
    assert!(
        !s.prefix.join(&escape).exists(),
        "the program wrote into the host's Python"
    );
}

/// As root, the probe read `/etc/shadow` and opened kernel settings for writing: the program is
/// `nobody` on the host as inside, and its `/proc` is read-only. (Opened without truncating, so
/// that a sandbox that failed here would change nothing.)
#[test]
fn roots_files_and_the_kernels_settings_stay_closed() {
    let program = r#"import os, sys
opened = []
for path, flags in [('/etc/shadow', os.O_RDONLY), ('/etc/sudoers', os.O_RDONLY),
                    ('/proc/sys/vm/swappiness', os.O_WRONLY),
                    ('/proc/sys/kernel/core_pattern', os.O_WRONLY),
                    ('/proc/sysrq-trigger', os.O_WRONLY)]:
    try:
        os.close(os.open(path, flags))
        opened.append(path)
    except OSError as e:
        print(path, e.strerror, file=sys.stderr)
assert not opened, opened
"#;
    let run = sandbox().run(program).unwrap();
    assert_eq!(run.outcome, Outcome::Passed, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("/proc/sys/vm/swappiness Read-only file system"),
        "{}",
        run.stderr
    );
}

/// Output without end, full folders and a swarm of processes cost the host a bounded amount:
/// stderr's tail is kept and stdout dropped as they come, each memory folder holds
/// `folder_bytes`, and the process count binds the whole sandbox (root's included, which the
/// kernel exempts).
#[test]
fn floods_of_output_files_and_processes_are_bounded() {
    let s = sandbox();
    let flood = "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(256):\n    sys.stdout.buffer.write(chunk)\n    sys.stderr.buffer.write(chunk)\nsys.stderr.write('the end')\n";
    let run = s.run(flood).unwrap();
    assert_eq!(run.outcome, Outcome::Passed, "{run:?}");
    assert!(run.stderr.len() <= STDERR_TAIL_BYTES && run.stderr.ends_with("the end"));

    let limits = Limits::default();
    let fill = format!(
        "for i in range(3):\n    with open(f'/tmp/f{{i}}', 'wb') as f:\n        f.write(b'0' * {})\n",
        limits.folder_bytes / 2 - 4096
    );
    let run = s.run(&fill).unwrap();
    assert!(run.stderr.contains("No space left on device"), "{run:?}");

    let swarm = "import os, sys, time\nn = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint('children', n, file=sys.stderr)\n";
    let run = s.run(swarm).unwrap();
    let children: u64 = run
        .stderr
        .split_once("children ")
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{run:?}"));
    assert!(children < limits.processes, "{children} children: {run:?}");
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

/// Under root, a sandbox's processes share one cgroup: six children of 700 MiB each (4.2 GB,
/// each under its own address-space limit) cannot all hold their memory at once. A cgroup's
/// peak stays within its bound, and its folders are gone once it is dropped.
#[test]
#[cfg_attr(
    not(zflow_root),
    ignore = "needs root: a cgroup per sandbox is made only for root runs"
)]
fn under_root_the_whole_sandbox_shares_one_memory_and_process_bound() {
    let s = sandbox();
    let limits = s.limits();
    let group = s.cgroup().expect("root makes a cgroup per sandbox");
    let bound = limits.memory_bytes + 2 * limits.folder_bytes;
    assert_eq!(group.peak_memory().map(|p| p <= bound), Some(true));
    let dirs = group.dirs().to_vec();
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
    drop(group);
    assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?} left");

    let hogs = "import os, time\npids = []\nfor _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n        b = bytearray(700 << 20)\n        for i in range(0, len(b), 4096):\n            b[i] = 1\n        time.sleep(1)\n        os._exit(0)\n    pids.append(pid)\nok = all(os.waitpid(p, 0)[1] == 0 for p in pids)\nassert ok, 'a child was killed'\n";
    let run = s.run(hogs).unwrap();
    // The OOM killer picks a hog (the program sees a child killed) or the process that
    // started the sandbox; either way the program fails.
    assert!(
        run.stderr.contains("a child was killed") || run.stderr.contains("killed for memory"),
        "6 x 700 MiB held at once: {run:?}"
    );
    assert!(!run.outcome.passed());
}

/// A sandbox that cannot start a program (here, an interpreter at a path the sandbox does not
/// bind; under Ubuntu's AppArmor restriction, the user namespace) is an error naming the
/// cause when it is made, not a task whose programs all fail.
#[test]
fn a_sandbox_that_cannot_start_says_why_when_it_is_made() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("python3");
    // Answers as an interpreter installed under /usr, whose executable lives in a host folder
    // the sandbox never sees.
    std::fs::write(
        &fake,
        format!("#!/bin/sh\nprintf '/usr\\n{}\\n'\n", fake.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = format!(
        "{:#}",
        PythonSandbox::new(&fake, Limits::default()).unwrap_err()
    );
    assert!(
        err.contains("cannot run an empty program here")
            && err.contains("ENOENT")
            && err.contains("apparmor_restrict_unprivileged_userns"),
        "{err}"
    );
}
