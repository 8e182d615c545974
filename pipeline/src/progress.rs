//! Progress display: a line per running stage (indicatif) on a terminal, plain timestamped
//! lines when output is not a terminal (CI logs, files), nothing with `--quiet`.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Live bars (stderr is a terminal).
    Bars,
    /// Plain lines, at most one per stage every few seconds.
    Plain,
    /// Nothing.
    Quiet,
}

/// The whole run's progress display.
#[derive(Clone)]
pub struct Progress {
    mode: Mode,
    multi: MultiProgress,
}

impl Progress {
    /// Bars on a terminal, plain lines otherwise, nothing when `quiet`.
    pub fn auto(quiet: bool) -> Progress {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Bars
        } else {
            Mode::Plain
        };
        Progress::new(mode)
    }

    /// A display in the given mode.
    pub fn new(mode: Mode) -> Progress {
        let multi = MultiProgress::new();
        if mode != Mode::Bars {
            multi.set_draw_target(ProgressDrawTarget::hidden());
        }
        Progress { mode, multi }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Prints a line above the bars (or plainly), unless quiet.
    pub fn println(&self, line: &str) {
        match self.mode {
            Mode::Bars => {
                let _ = self.multi.println(line);
            }
            Mode::Plain => eprintln!("{line}"),
            Mode::Quiet => {}
        }
    }

    /// Prints a line the user needs whatever the mode (where the page is served, a record
    /// that could not be written): above the bars, or plainly on stderr, `--quiet` included.
    pub fn notice(&self, line: &str) {
        match self.mode {
            Mode::Bars => {
                let _ = self.multi.println(line);
            }
            Mode::Plain | Mode::Quiet => eprintln!("{line}"),
        }
    }

    /// Runs `f` with the bars hidden, so other output does not tear them.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.multi.suspend(f)
    }

    /// A progress line for a stage that starts now.
    pub fn stage(&self, name: &str) -> StageProgress {
        let bar = (self.mode == Mode::Bars).then(|| {
            let bar = self.multi.add(ProgressBar::new_spinner());
            bar.set_style(spinner_style());
            bar.set_prefix(name.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        StageProgress {
            name: name.to_string(),
            bar,
            plain: self.mode == Mode::Plain,
            state: Arc::new(Mutex::new(PlainState {
                last: Instant::now(),
                pos: 0,
                len: None,
                msg: String::new(),
            })),
        }
    }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner:.green} {prefix:.bold} [{elapsed_precise}] {msg}")
        .expect("valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner:.green} {prefix:.bold} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} {per_sec} eta {eta} {msg}",
    )
    .expect("valid template")
    .progress_chars("=> ")
}

struct PlainState {
    last: Instant,
    pos: u64,
    len: Option<u64>,
    msg: String,
}

/// One stage's progress line. Cheap to clone; safe to use from any thread.
#[derive(Clone)]
pub struct StageProgress {
    name: String,
    bar: Option<ProgressBar>,
    plain: bool,
    state: Arc<Mutex<PlainState>>,
}

/// Plain mode prints at most this often per stage.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

impl StageProgress {
    /// A progress handle that shows nothing (for tests and tools).
    pub fn hidden(name: &str) -> StageProgress {
        Progress::new(Mode::Quiet).stage(name)
    }

    /// Sets the amount of work (turns the spinner into a bar).
    pub fn set_length(&self, len: u64) {
        if let Some(bar) = &self.bar {
            bar.set_style(bar_style());
            bar.set_length(len);
        }
        self.state.lock().unwrap_or_else(|e| e.into_inner()).len = Some(len);
    }

    /// Adds `n` units of work done.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
        self.plain_update(|s| s.pos += n);
    }

    /// Sets the work done.
    pub fn set_position(&self, pos: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
        }
        self.plain_update(|s| s.pos = pos);
    }

    /// Sets the text after the bar (e.g. `loss 3.21 | 12k tok/s`).
    pub fn set_message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        if let Some(bar) = &self.bar {
            bar.set_message(msg.clone());
        }
        self.plain_update(|s| s.msg = msg);
    }

    fn plain_update(&self, f: impl FnOnce(&mut PlainState)) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        if self.plain && s.last.elapsed() >= PLAIN_EVERY {
            s.last = Instant::now();
            let amount = match s.len {
                Some(len) if len > 0 => format!(
                    "{}/{} ({:.0}%)",
                    s.pos,
                    len,
                    100.0 * s.pos as f64 / len as f64
                ),
                _ => s.pos.to_string(),
            };
            eprintln!("  {} ... {} {}", self.name, amount, s.msg);
        }
    }

    /// Removes the line.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
