//! What the README and the shipped recipes tell a user to type must work as written: the
//! README's test command is the one CI runs, every `zflow` command line they show names flags
//! that command has (a recipe once advertised a `--var` that never existed), and the nano
//! recipe's training speed is stated once, in the README, with the machine it was measured on.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

/// The lines of the README's first code block.
fn first_commands(readme: &str) -> Vec<String> {
    readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README starts with a ```sh block")
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let commands = first_commands(&read("README.md"));
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(
        commands[0].starts_with("scripts/setup.sh && cargo run -- run recipes/zaya1-nano.yaml"),
        "{commands:?}"
    );
    let test_command = commands[1].split('#').next().unwrap().trim();
    let ci = read(".ci/run");
    let ran: Vec<&str> = ci
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("set ") && !l.starts_with("cd "))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(ran, vec![test_command], ".ci/run:\n{ci}");
}

/// Every line of the README's code blocks and of the recipes' comments that starts with
/// `zflow `, as (where it is, the command line without its comment).
fn zflow_lines() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    let mut add = |place: &str, text: &str, code_only: bool| {
        let mut in_code = false;
        for (i, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                in_code = !in_code;
            }
            if code_only && !in_code {
                continue;
            }
            let line = line.trim_start_matches('#').trim();
            if let Some(command) = line.strip_prefix("zflow ") {
                let command = command.split("  #").next().unwrap().trim().to_string();
                lines.push((format!("{place}:{}", i + 1), command));
            }
        }
    };
    add("README.md", &read("README.md"), true);
    for entry in std::fs::read_dir(root().join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = Path::new("recipes").join(path.file_name().unwrap());
            add(
                name.to_str().unwrap(),
                &std::fs::read_to_string(&path).unwrap(),
                false,
            );
        }
    }
    lines
}

/// `zflow WORDS --help`, when WORDS name a command.
fn help(words: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_zflow"))
        .args(words)
        .arg("--help")
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap())
}

#[test]
fn every_zflow_command_line_the_docs_show_names_flags_its_command_has() {
    let lines = zflow_lines();
    assert!(lines.len() > 20, "{lines:?}");
    let mut wrong = Vec::new();
    for (place, line) in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        // The command: one word, or two where the first has subcommands (`bench train`).
        let Some(mut help_text) = help(&words[..1]) else {
            wrong.push(format!("{place}: `zflow {line}`: no such command"));
            continue;
        };
        let mut n = 1;
        if help_text.contains("\nCommands:\n") {
            let Some(sub) = words.get(1).and_then(|_| help(&words[..2])) else {
                wrong.push(format!("{place}: `zflow {line}`: no such command"));
                continue;
            };
            (help_text, n) = (sub, 2);
        }
        let help = help_text;
        for word in &words[n..] {
            let flag = word
                .trim_start_matches('[')
                .split(['=', ']', '|'])
                .next()
                .unwrap();
            if flag.starts_with("--") && !help.contains(&format!("{flag} ")) {
                wrong.push(format!(
                    "{place}: `zflow {line}`: `zflow {}` has no {flag}",
                    words[..n].join(" ")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_nano_recipes_speed_is_stated_once_with_its_machine() {
    let readme = read("README.md");
    let said: Vec<&str> = readme
        .lines()
        .filter(|l| l.contains("tokens/s in phase 1"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    let recipe = read("recipes/zaya1-nano.yaml");
    assert!(
        !recipe.contains("tokens/s"),
        "recipes/zaya1-nano.yaml quotes a speed of its own; the README's is the one"
    );
}
