//! `zflow`: the command line. A thin layer: parse arguments, load the recipe through the
//! engine (`zflow-pipeline`) with every stage kind registered (`zflow-stages`), and print.

/// mimalloc: tokenization allocates a small string per token, and glibc's malloc was a third
/// of the tokenize profile; mimalloc makes the whole tokenize path ~1.3x faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod commands;
mod eval;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Reproduce a foundation-model training recipe end to end from one YAML file.
#[derive(Parser)]
#[command(name = "zflow", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The recipe and its command-line overrides.
#[derive(Args, Clone)]
pub struct RecipeArgs {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Override a recipe value: `--set path.to.key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// The store folder (beats the recipe's `store:`).
    #[arg(long, env = "ZFLOW_STORE")]
    pub store: Option<PathBuf>,
}

/// Where `zflow ui` (and `zflow run --ui`) serve the page.
#[derive(Args, Clone)]
pub struct UiArgs {
    /// The address to bind: loopback unless you ask for another (e.g. 0.0.0.0 to be reached
    /// from other machines; every request needs the page's token either way).
    #[arg(long = "ui-host", default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// The port (0: any free one).
    #[arg(long = "ui-port", default_value_t = 8265)]
    pub port: u16,
    /// A file holding the page's access token, readable by its owner alone (default:
    /// `ZFLOW_UI_TOKEN` when set, else a fresh random one). Never a flag with the token itself:
    /// `ps` shows every process's arguments to every user of the machine.
    #[arg(long = "ui-token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// The environment variable that may hold the ui's token (`--ui-token-file` wins).
const UI_TOKEN_ENV: &str = "ZFLOW_UI_TOKEN";

impl UiArgs {
    fn options(&self) -> anyhow::Result<zflow_ui::Options> {
        let token = match &self.token_file {
            Some(path) => Some(
                read_token_file(path)
                    .map_err(|e| anyhow::anyhow!("--ui-token-file {}: {e}", path.display()))?,
            ),
            None => std::env::var(UI_TOKEN_ENV).ok(),
        };
        Ok(zflow_ui::Options {
            host: self.host,
            port: self.port,
            token,
            ..Default::default()
        })
    }
}

/// The longest token file read (a token is one short line).
const TOKEN_FILE_BYTES: u64 = 4096;

/// The token in `path`: a regular file that only its owner may read (a token others can read
/// guards nothing), of at most [`TOKEN_FILE_BYTES`], read no further.
fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        anyhow::bail!("not a regular file");
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "mode {mode:04o} lets other users read it, so the token guards nothing: `chmod 600 {}`",
            path.display()
        );
    }
    let mut text = String::new();
    file.take(TOKEN_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > TOKEN_FILE_BYTES {
        anyhow::bail!("longer than {TOKEN_FILE_BYTES} bytes: a token is one short line");
    }
    Ok(text.trim().to_string())
}

#[derive(Subcommand)]
enum Command {
    /// Run the recipe's stages (those not already complete in the store).
    Run {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Run only these stages (their inputs must be complete).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Run these stages and everything after them.
        #[arg(long, value_delimiter = ',')]
        from: Vec<String>,
        /// Run these stages and everything they need.
        #[arg(long, value_delimiter = ',')]
        until: Vec<String>,
        /// Re-run these stages even if complete.
        #[arg(long, value_delimiter = ',')]
        force: Vec<String>,
        /// CPU slots: how many single-core stages may run at once (default: all cores).
        #[arg(short = 'j', long)]
        jobs: Option<u32>,
        /// GPU slots available to stages.
        #[arg(long, default_value_t = 0)]
        gpus: u32,
        /// Memory (GiB) available to stages (default: the machine's).
        #[arg(long)]
        memory_gb: Option<f64>,
        /// No progress display (warnings and errors only).
        #[arg(short, long)]
        quiet: bool,
        /// Also serve the run's web page (as `zflow ui` does) while it runs.
        #[arg(long)]
        ui: bool,
        #[command(flatten)]
        ui_args: UiArgs,
    },
    /// Serve a web page of the recipe and its store: the stage graph coloured by state, each
    /// stage's config, identity, why, log and outputs, live training curves, restarts and
    /// preflight results, and the evaluation report. Prints its address (with its token).
    Ui {
        #[command(flatten)]
        recipe: RecipeArgs,
        #[command(flatten)]
        ui_args: UiArgs,
    },
    /// Run what the recipe's `report` needs and print the evaluation tables (Markdown; CSV,
    /// LaTeX, JSON and plots beside it).
    Report {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// CPU slots (default: all cores).
        #[arg(short = 'j', long)]
        jobs: Option<u32>,
        /// No progress display.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show what would run, what is cached, and why.
    Plan {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Plan as if these stages were forced.
        #[arg(long, value_delimiter = ',')]
        force: Vec<String>,
        /// Instead of the plan, print what starting this stage would submit or run: the
        /// Slurm batch script (nodes, tasks and GPUs per node) and every rank's command with
        /// its environment.
        #[arg(long, value_name = "STAGE")]
        launch: Option<String>,
        /// Refuse the recipe if a phase's predicted memory per rank (`zflow size`) exceeds
        /// this hardware's: `mi300x`, `h200` or `this`.
        #[arg(long)]
        hardware: Option<String>,
    },
    /// Explain one stage: cached, or why it will run.
    Why {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The stage.
        stage: String,
    },
    /// Each stage's state: done, running (and by whom), failed, pending.
    Status {
        #[command(flatten)]
        recipe: RecipeArgs,
    },
    /// Print the stage graph.
    Graph {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Output format.
        #[arg(long, default_value = "dot", value_parser = ["dot", "mermaid"])]
        format: String,
    },
    /// Print a stage's log (its newest attempt's log file).
    Logs {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The stage.
        stage: String,
        /// Print only the log file's path.
        #[arg(long)]
        path: bool,
    },
    /// Print the output folder of a stage that is complete (for scripts and other tools).
    Path {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The stage.
        stage: String,
    },
    /// Remove store entries that none of the given recipes reference.
    Gc {
        /// The store.
        store: PathBuf,
        /// Recipes whose outputs to keep.
        #[arg(required = true)]
        recipes: Vec<PathBuf>,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Hash a store's committed outputs again (every byte is read) and compare them with
    /// their manifests; exits 1 naming each file that differs. Commits take the hashes the
    /// stage's own process took as it ended, so this is where changed bytes are found.
    Verify {
        /// The store.
        store: PathBuf,
        /// Only the outputs of these stages (all complete outputs when none are given).
        stages: Vec<String>,
    },
    /// Run SQL over the store's tables (`runs`, `stages`, and Parquet outputs).
    Query {
        /// The store.
        store: PathBuf,
        /// The SQL query.
        sql: String,
    },
    /// Evaluate one model (a .gguf file, a zflow checkpoint folder or a Hugging Face ZAYA1
    /// folder) on tasks of evals/tasks: the results table, and the results JSON with --out.
    Eval(eval::EvalArgs),
    /// Model size: parameters, FLOPs per token and memory per device at each phase's sequence
    /// length, and the sizing rules (from the recipe's `model:`; ZAYA1-base when absent).
    Size {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Data-parallel groups (default: each phase's `train.launch`).
        #[arg(long)]
        dp: Option<usize>,
        /// Sequences per rank per micro-step (default: each phase's `train.micro_batch`).
        #[arg(long)]
        micro_batch: Option<usize>,
        /// Also check each phase's memory against this hardware's and project step time,
        /// tokens/s, GPU-hours and days per phase on it: `mi300x`, `h200` (datasheet numbers)
        /// or `this` (measured on this machine now).
        #[arg(long)]
        hardware: Option<String>,
        /// GPUs for the projection (default: each phase's ranks).
        #[arg(long)]
        gpus: Option<usize>,
        /// Print each phase's memory per rank as JSON: `{"phases": [{"name", "setup",
        /// "peak_bytes_per_rank", <each term>}]}`.
        #[arg(long)]
        json: bool,
    },
    /// Checkpoint tools.
    Ckpt {
        #[command(subcommand)]
        what: CkptCommand,
    },
    /// Run one stage attempt inside a Slurm job (the Slurm executor's batch scripts call it).
    #[command(hide = true)]
    ExecStage {
        /// The attempt's spec (`<stage log>.spec.json`).
        spec: PathBuf,
    },
    /// Run one node's ranks of a Slurm launch and relay them (a train stage's `srun` steps
    /// call it, one per node).
    #[command(hide = true)]
    NodeAgent {
        /// The node's first rank.
        first_rank: usize,
        /// Ranks on the node.
        local_world: usize,
        /// `gpu`: each rank binds the GPU at its local rank; `cpu`: none.
        #[arg(value_parser = ["gpu", "cpu"])]
        devices: String,
        /// The engine's command, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

#[derive(Subcommand)]
enum CkptCommand {
    /// Look inside a checkpoint (a train stage's `final/` or `checkpoints/step-N/`): checksum
    /// status, step, data cursor, routing biases, tensors. Exits 1 when it does not verify
    /// (after printing what could still be read).
    Inspect {
        /// The checkpoint folder.
        path: PathBuf,
    },
    /// Export a checkpoint as a Hugging Face folder: config.json, model.safetensors, tokenizer
    /// files; in transformers 5.23's layout unless `--layout legacy` (Zyphra's fork, vLLM).
    Export {
        /// Output format; `hf` is the one there is.
        #[arg(long, default_value = "hf", value_parser = ["hf"])]
        format: String,
        /// The folder's layout: `transformers` (transformers 5.23's `models.zaya`) or `legacy`.
        #[arg(long, default_value = "transformers")]
        layout: zflow_runtime::hf::Layout,
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// The folder to create (must not exist, or be empty).
        out: PathBuf,
        /// A tokenizer.json, or a folder holding one (a tokenizer stage's output), to ship.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// Take the model's sizes from this recipe's `model:` (default: the checkpoint's
        /// model.json, else the job.json next to it).
        #[arg(long)]
        recipe: Option<PathBuf>,
    },
    /// Import a Hugging Face ZAYA1 folder (config.json + safetensors, f32/bf16/f16) as a zflow
    /// checkpoint.
    Import {
        /// The Hugging Face folder.
        hf: PathBuf,
        /// The checkpoint folder to create (must not exist, or be empty).
        out: PathBuf,
    },
    /// Re-partition a checkpoint for another number of ranks: `--dp N` moves the ZeRO-1
    /// optimizer shards to N data-parallel ranks. Weights, trainer state and data cursor are copied unchanged, so
    /// training resumed from OUT reads the same data in the same order.
    Reshape {
        /// The checkpoint folder.
        input: PathBuf,
        /// The checkpoint folder to create (must not exist, or be empty; written atomically).
        out: PathBuf,
        /// Data-parallel ranks.
        #[arg(long)]
        dp: usize,
    },
}

fn main() -> ExitCode {
    // Started as the process reaper, this process serves as one and exits here.
    zflow_pipeline::supervise::install();
    // Die quietly on a closed pipe (`zflow size ... | head`) like other Unix tools.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let quiet = matches!(
        cli.command,
        Command::Run { quiet: true, .. } | Command::Report { quiet: true, .. }
    );
    let progress = zflow_pipeline::progress::Progress::auto(quiet);
    zflow_pipeline::logging::init(&progress, quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Ui { recipe, ui_args } => commands::ui(&recipe, ui_args.options()?).await,
            Command::Run {
                recipe,
                only,
                from,
                until,
                force,
                jobs,
                gpus,
                memory_gb,
                quiet: _,
                ui,
                ui_args,
            } => {
                let flags = commands::RunFlags {
                    only,
                    from,
                    until,
                    force,
                    jobs,
                    gpus,
                    memory_gb,
                    ui: if ui { Some(ui_args.options()?) } else { None },
                };
                commands::run(&recipe, flags, progress).await
            }
            Command::Report {
                recipe,
                jobs,
                quiet: _,
            } => {
                let flags = commands::RunFlags {
                    only: vec![],
                    from: vec![],
                    until: vec![],
                    force: vec![],
                    jobs,
                    gpus: 0,
                    memory_gb: None,
                    ui: None,
                };
                commands::report(&recipe, flags, progress).await
            }
            Command::Plan {
                recipe,
                force,
                launch,
                hardware,
            } => commands::plan(&recipe, &force, launch.as_deref(), hardware.as_deref()),
            Command::Why { recipe, stage } => commands::why(&recipe, &stage),
            Command::Status { recipe } => commands::status(&recipe),
            Command::Graph { recipe, format } => commands::graph(&recipe, &format),
            Command::Logs {
                recipe,
                stage,
                path,
            } => commands::logs(&recipe, &stage, path),
            Command::Path { recipe, stage } => commands::output_path(&recipe, &stage),
            Command::Gc {
                store,
                recipes,
                dry_run,
            } => commands::gc(&store, &recipes, dry_run),
            Command::Verify { store, stages } => commands::verify(&store, &stages),
            Command::Query { store, sql } => commands::query(&store, &sql).await,
            Command::Eval(args) => tokio::task::spawn_blocking(move || eval::run(&args))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r),
            Command::Size {
                recipe,
                dp,
                micro_batch,
                hardware,
                gpus,
                json,
            } => commands::size(
                &recipe,
                commands::size::SizeArgs {
                    dp,
                    micro_batch,
                    hardware: hardware.as_deref(),
                    gpus,
                    json,
                },
            ),
            Command::Bench { what } => bench::bench(what).await,
            Command::ExecStage { spec } => commands::exec_stage(&spec).await,
            Command::NodeAgent {
                first_rank,
                local_world,
                devices,
                command,
            } => {
                let node = zflow_stages::node_agent::NodeRanks {
                    first_rank,
                    local_world,
                    bind_devices: devices == "gpu",
                    program: command[0].clone(),
                    args: command[1..].to_vec(),
                };
                let code =
                    tokio::task::spawn_blocking(move || zflow_stages::node_agent::run(&node))
                        .await??;
                Ok(ExitCode::from(code as u8))
            }
            Command::Ckpt {
                what: CkptCommand::Inspect { path },
            } => {
                let seen = zflow_runtime::checkpoint::inspect(&path);
                print!("{}", seen.text);
                Ok(if seen.verified {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                })
            }
            Command::Ckpt {
                what:
                    CkptCommand::Export {
                        format: _,
                        layout,
                        checkpoint,
                        out,
                        tokenizer,
                        recipe,
                    },
            } => commands::ckpt_export(&checkpoint, &out, layout, tokenizer, recipe.as_deref()),
            Command::Ckpt {
                what: CkptCommand::Import { hf, out },
            } => commands::ckpt_import(&hf, &out),
            Command::Ckpt {
                what: CkptCommand::Reshape { input, out, dp },
            } => commands::ckpt_reshape(&input, &out, dp),
        }
    });
    // Stages still blocked on a cancelled child must not keep us alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(
                if e.downcast_ref::<zflow_pipeline::RecipeError>().is_some() {
                    2
                } else {
                    1
                },
            )
        }
    }
}
