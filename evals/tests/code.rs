//! The code tasks' programs, as the harness assembles them, run in the sandbox: every
//! HumanEval reference solution passes, and so does every MBPP reference solution of the first
//! 100 problems (MBPP's `test_setup_code`, which lm-eval ignores too, is empty for them); a
//! wrong answer fails.

use std::path::{Path, PathBuf};

use zflow_evals::TaskRegistry;
use zflow_evals::request::PreparedTask;
use zflow_evals::sandbox::{Limits, PythonSandbox};
use zflow_evals::task::builtin_tasks_dir;

fn python() -> PathBuf {
    std::env::var_os("ZFLOW_TORCH_PYTHON")
        .map(PathBuf::from)
        .expect("ZFLOW_TORCH_PYTHON is not set: scripts/test.sh sets it")
}

/// The programs of `task`'s first `limit` documents with the documents' `column` as answers.
fn reference_programs(task: &str, column: &str, limit: usize) -> Vec<String> {
    let registry = TaskRegistry::load_dir(&builtin_tasks_dir()).unwrap();
    let root = zflow_evals::evaluate::test_data_root();
    let prepared = PreparedTask::prepare(&registry.tasks[task], Path::new(&root), None).unwrap();
    let instances = prepared.instances(Some(limit)).unwrap();
    instances
        .iter()
        .map(|inst| {
            let answer = prepared.docs.docs[inst.doc_index][column].as_str().unwrap();
            inst.program(answer)
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(zflow_eval_fixtures),
    ignore = "needs the benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
)]
fn reference_solutions_pass_and_a_wrong_answer_fails() {
    // A loaded CI machine runs 2 programs at once: more room than lm-eval's 3 s.
    let sandbox = PythonSandbox::new(
        &python(),
        Limits {
            wall_secs: 10,
            cpu_secs: 10,
            ..Limits::default()
        },
    )
    .unwrap();
    for (task, column, limit) in [
        ("humaneval", "canonical_solution", 164),
        ("mbpp", "code", 100),
    ] {
        let programs = reference_programs(task, column, limit);
        assert_eq!(programs.len(), limit);
        let runs = sandbox.run_all(&programs, 2).unwrap();
        let failed: Vec<(usize, &String)> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.outcome.passed())
            .map(|(i, r)| (i, &r.stderr))
            .collect();
        assert!(failed.is_empty(), "{task}: {failed:?}");
    }
    let wrong = reference_programs("humaneval", "entry_point", 1);
    assert!(!sandbox.run(&wrong[0]).unwrap().outcome.passed());
}
