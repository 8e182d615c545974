use super::*;

#[test]
fn parses_scontrol_one_liners() {
    let line = "JobId=12 JobName=zflow-train.p1 UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0 RunTime=00:00:07";
    assert_eq!(
        parse_scontrol(line),
        Some(JobState {
            state: "RUNNING".into(),
            exit_code: "0:0".into(),
            restarts: 2
        })
    );
    assert_eq!(parse_scontrol("garbage"), None);
    assert!(
        is_final("CANCELLED")
            && is_final("NODE_FAIL")
            && !is_final("PENDING")
            && !is_final("REQUEUED")
    );
}

#[test]
fn maps_resources_to_sbatch_options() {
    let cfg = SlurmConfig {
        partition: Some("gpu".into()),
        time: Some("1:00:00".into()),
        sbatch_args: vec!["--exclusive".into()],
        ..Default::default()
    };
    let r = Resources {
        cpus: 16,
        gpus: 8,
        memory_gb: 1.5,
        ranks: 8,
        nodes: 2,
        time_min: 0,
    };
    let o = sbatch_options(&cfg, "train.p1", &r, Path::new("/s/x.out"), Path::new("/r"));
    for want in [
        "--job-name=zflow-train.p1",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--cpus-per-task=2",
        "--gpus-per-node=4",
        "--mem=1536M",
        "--time=1:00:00",
        "--partition=gpu",
        "--exclusive",
        "--requeue",
    ] {
        assert!(o.contains(&want.to_string()), "{want} missing from {o:?}");
    }
    let r = Resources {
        time_min: 90,
        ..Default::default()
    };
    let o = sbatch_options(&cfg, "s", &r, Path::new("o"), Path::new("."));
    assert!(
        o.contains(&"--time=90".to_string())
            && o.contains(&"--ntasks=1".to_string())
            && !o.iter().any(|x| x.starts_with("--gpus")),
        "{o:?}"
    );
    let one = [(
        PathBuf::from("/s/a b.spec.json"),
        PathBuf::from("/s/x.exit-"),
    )];
    let s = script(&cfg, &o, Path::new("/bin/zflow"), &one);
    assert!(
        s.contains("#SBATCH --time=90\n")
            && s.contains("specs=('/s/a b.spec.json')")
            && s.contains("'/bin/zflow' exec-stage \"${specs[$i]}\"")
            && s.contains("-gt 3 ]"),
        "{s}"
    );
    // A time limit asks for the signal that requeues the job before it; none, or a short one,
    // none.
    assert!(o.contains(&format!("--signal=B:USR1@{TIME_LIMIT_LEAD_S}")));
    let short = Resources {
        time_min: 5,
        ..Default::default()
    };
    let o = sbatch_options(
        &SlurmConfig::default(),
        "s",
        &short,
        Path::new("o"),
        Path::new("."),
    );
    assert!(!o.iter().any(|x| x.starts_with("--signal")), "{o:?}");
    for (text, minutes) in [
        ("90", Some(90)),
        ("1:00:00", Some(60)),
        ("2-00:00:00", Some(2880)),
        ("1-12", Some(2160)),
        ("1-00:30", Some(1470)),
        ("INFINITE", None),
    ] {
        assert_eq!(slurm_minutes(text), minutes, "{text}");
    }
    let unlimited = sbatch_options(
        &SlurmConfig::default(),
        "s",
        &Resources::default(),
        Path::new("o"),
        Path::new("."),
    );
    assert!(!unlimited.iter().any(|x| x.starts_with("--signal")));
}

#[test]
fn near_its_time_limit_the_script_requeues_its_job_and_records_no_exit() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let executable = |name: &str, body: &str| {
        let path = d.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    // The stage outlives the signal; `scontrol` notes what it was asked.
    let stage = executable("zflow", "sleep 1");
    executable("scontrol", &format!("echo \"$@\" > {}/asked", d.display()));
    let exit = d.join("x.exit-");
    let text = script(
        &SlurmConfig::default(),
        &[],
        &stage,
        &[(d.join("spec.json"), exit.clone())],
    );
    let path = executable("job.sh", "");
    std::fs::write(&path, text).unwrap();
    let mut job = Command::new("bash")
        .arg(&path)
        .env("SLURM_JOB_ID", "77")
        .env(
            "PATH",
            format!("{}:{}", d.display(), std::env::var("PATH").unwrap()),
        )
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(job.id() as i32, libc::SIGUSR1) };
    assert!(job.wait().unwrap().success());
    let asked = std::fs::read_to_string(d.join("asked")).unwrap();
    assert_eq!(asked.trim(), "requeue 77");
    let requeues = std::fs::read_to_string(d.join("x.exit-77.time-requeues")).unwrap();
    assert_eq!(requeues.trim(), "1");
    assert!(
        !d.join("x.exit-77").exists(),
        "a requeued job recorded an exit"
    );
}

#[test]
fn a_missing_slurm_is_named() {
    let err = slurm_command("zflow-no-such-sbatch", &["--parsable"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not on PATH") && err.contains("zflow-no-such-sbatch --parsable"),
        "{err}"
    );
}

#[test]
fn a_job_that_ended_before_its_script_finished_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let exit_file = dir.path().join("exit-7");
    let mut report = JobReport {
        id: "7".into(),
        state: "FAILED".into(),
        restarts: 1,
    };
    let e = format!(
        "{:#}",
        finished(&mut report, "1:0", &exit_file).unwrap_err()
    );
    assert!(
        e.contains("ended FAILED with exit code 1:0 before its script recorded an exit status")
            && e.contains("slurmd log"),
        "{e}"
    );
    std::fs::write(&exit_file, "3\n").unwrap();
    let e = format!(
        "{:#}",
        finished(&mut report, "3:0", &exit_file).unwrap_err()
    );
    assert!(
        e.ends_with("ended FAILED with exit code 3:0, stage exit status 3"),
        "{e}"
    );
    std::fs::write(&exit_file, "0\n").unwrap();
    report.state = "COMPLETED".into();
    assert!(finished(&mut report, "0:0", &exit_file).is_ok());
}
