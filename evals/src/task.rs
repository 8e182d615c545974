//! Task and group files: `evals/tasks/**/*.yaml`, in lm-evaluation-harness's vocabulary.
//!
//! A file with a top-level `task:` is a task ([`TaskSpec`]), one with `group:` a group
//! ([`GroupSpec`]); files whose name starts with `_` are fragments other files pull in with
//! `include:` (merged key by key, nested maps recursively, the including file winning).
//! Unknown fields are errors that name the file and the field's path.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zflow_files::json::merge;

use crate::dataset::DatasetSpec;

/// How a task turns documents into requests and scores (lm-eval's `output_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputType {
    /// One loglikelihood request per choice; the highest scoring choice is the prediction.
    MultipleChoice,
    /// One (context, continuation) loglikelihood request per document (e.g. lambada).
    Loglikelihood,
    /// The whole target text scored in windows of the model's context (perplexity, bpb).
    LoglikelihoodRolling,
    /// Greedy generation until a stop sequence, then answer extraction (e.g. gsm8k).
    GenerateUntil,
}

/// A metric a task reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Multiple choice: the choice with the highest loglikelihood is the gold one. Loglikelihood
    /// tasks: the continuation is the greedy one.
    Acc,
    /// Multiple choice: as `acc`, with each loglikelihood divided by its choice's length in
    /// characters (lm-eval: `len(choice)` of a Python `str`).
    AccNorm,
    /// Generation: the filtered answer equals the normalised target.
    ExactMatch,
    /// `exp(-mean loglikelihood)` over documents (lm-eval's lambada `perplexity`).
    Perplexity,
    /// `-sum(loglikelihood) / sum(UTF-8 bytes of the scored text) / ln 2`.
    BitsPerByte,
    /// `exp(-sum(loglikelihood) / sum(words))` (rolling tasks).
    WordPerplexity,
    /// `exp(-sum(loglikelihood) / sum(bytes))` (rolling tasks).
    BytePerplexity,
    /// Code generation: the share of documents whose program (`code_eval`) passes its tests in
    /// the sandbox, one greedy sample each (HF `evaluate`'s `code_eval` with k = 1).
    #[serde(rename = "pass@1")]
    PassAt1,
    /// MATH: the math-verify package's verdict on the raw generation against the task's
    /// `math_verify.gold` (lm-eval's `minerva_math` `math_verify`;
    /// `workers/torch/zflow_torch/math_verify.py`).
    MathVerify,
}

impl Metric {
    /// The name used in results (`acc_norm`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Acc => "acc",
            Metric::AccNorm => "acc_norm",
            Metric::ExactMatch => "exact_match",
            Metric::Perplexity => "perplexity",
            Metric::BitsPerByte => "bits_per_byte",
            Metric::WordPerplexity => "word_perplexity",
            Metric::BytePerplexity => "byte_perplexity",
            Metric::PassAt1 => "pass@1",
            Metric::MathVerify => "math_verify",
        }
    }
}

/// A value of `doc_to_text`, `doc_to_target` or `doc_to_choice`, as lm-eval writes them: an
/// integer or a list literal, a column name, or a minijinja template (see [`crate::template`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FieldSpec {
    /// A literal index (sciq's `doc_to_target: 3`).
    Index(i64),
    /// A literal list of choices (mmlu's `["A", "B", "C", "D"]`).
    List(Vec<String>),
    /// A column name (an identifier) or a template (anything else).
    Text(String),
}

/// A task's version: a number or a string in the file, kept as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Version {
    /// `version: 1`.
    Int(i64),
    /// `version: 1.5`.
    Float(f64),
    /// `version: "2024-05"`.
    Text(String),
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Int(i) => write!(f, "{i}"),
            Version::Float(x) => write!(f, "{x}"),
            Version::Text(s) => f.write_str(s),
        }
    }
}

/// How few-shot examples are drawn from the few-shot split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FewshotSampler {
    /// A seeded random sample per document (see [`crate::fewshot`]).
    #[default]
    Random,
    /// The first `num_fewshot` documents of the split (mmlu's `dev` examples).
    FirstN,
}

/// Generation settings of a `generate_until` task (greedy decoding only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationSpec {
    /// Stop sequences; the output is cut before the first one found.
    #[serde(default)]
    pub until: Vec<String>,
    /// The most tokens generated per document.
    #[serde(default = "default_max_gen_toks")]
    pub max_gen_toks: usize,
}

fn default_max_gen_toks() -> usize {
    256
}

/// One answer extraction pipeline (lm-eval's `filter_list` entry: `regex` then `take_first`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    /// Reported next to the metric (`exact_match,strict-match`).
    pub name: String,
    /// The pattern (Rust `regex` syntax, which covers lm-eval's patterns).
    pub regex: String,
    /// Which match to keep: 0 the first, -1 the last (lm-eval's `group_select`).
    #[serde(default)]
    pub group_select: i64,
    /// The answer when nothing matches.
    #[serde(default = "default_fallback")]
    pub fallback: String,
    /// Appended to the text before matching (minerva's `I hope it is correct.`, so a final
    /// sentence cut off by a stop sequence still closes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    /// Applied to the extracted answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<AnswerNormalization>,
}

/// A normalisation of extracted answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerNormalization {
    /// Minerva's MATH final-answer normalisation ([`crate::math::normalize_final_answer`]).
    MinervaMath,
}

/// How two answers that differ as text may still be equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Equivalence {
    /// Both parsed as LaTeX by sympy, their difference simplified to 0 (lm-eval's
    /// `minerva_math` `is_equiv`; `workers/torch/zflow_torch/math_equivalence.py`).
    Sympy,
}

fn default_fallback() -> String {
    "[invalid]".to_string()
}

/// How a code task's programs are made and run (HF `evaluate`'s `code_eval`, as lm-eval's
/// humaneval and mbpp use it): the program is `prefix + answer + "\n" + target`, where the
/// answer is the generation (after the task's first filter, if any) and the target is
/// `doc_to_target` (the tests), and it passes when it exits with status 0 in
/// [`crate::sandbox`] within `timeout` seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeEvalSpec {
    /// A template put before the answer (humaneval: the prompt, whose function the answer
    /// completes).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Wall-clock seconds per program (lm-eval's 3).
    #[serde(default = "default_code_timeout")]
    pub timeout: u64,
}

fn default_code_timeout() -> u64 {
    3
}

/// The reference the `math_verify` metric checks each generation against. lm-eval hard-codes it
/// in `minerva_math`'s Python (the document's whole solution); here the task file names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathVerifySpec {
    /// A template of the document rendering the gold text (`"{{solution}}"`).
    pub gold: String,
}

/// Normalisation before `exact_match` compares (HF `evaluate`'s exact_match options).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExactMatchSpec {
    /// Lowercase both sides.
    #[serde(default)]
    pub ignore_case: bool,
    /// Remove ASCII punctuation from both sides.
    #[serde(default)]
    pub ignore_punctuation: bool,
    /// Patterns deleted from both sides first, in order.
    #[serde(default)]
    pub regexes_to_ignore: Vec<String>,
    /// Answers that differ as text are compared this way too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equivalence: Option<Equivalence>,
}

/// One task, as resolved from its file (and includes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// The task's name (unique among all tasks and groups).
    pub task: String,
    /// Bumped whenever a change to the file changes scores.
    pub version: Version,
    /// Where the documents come from.
    pub dataset: DatasetSpec,
    /// The split evaluated.
    pub split: String,
    /// The split few-shot examples come from (may equal `split`: the document itself is then
    /// never its own example).
    #[serde(default)]
    pub fewshot_split: Option<String>,
    /// Where few-shot documents come from, when not from `dataset` (e.g. a train split that
    /// only exists elsewhere, already preprocessed).
    #[serde(default)]
    pub fewshot_dataset: Option<DatasetSpec>,
    /// Number of few-shot examples.
    #[serde(default)]
    pub num_fewshot: usize,
    /// Seed of the random few-shot sampler.
    #[serde(default = "default_fewshot_seed")]
    pub fewshot_seed: u64,
    /// How few-shot examples are chosen.
    #[serde(default)]
    pub fewshot_sampler: FewshotSampler,
    /// How documents become requests.
    pub output_type: OutputType,
    /// A template rendered once per document and put before the few-shot examples.
    #[serde(default)]
    pub description: Option<String>,
    /// The prompt (for `multiple_inputs` tasks: the gold index, as in lm-eval).
    #[serde(default)]
    pub doc_to_text: Option<FieldSpec>,
    /// The gold choice (index or choice text), or the target text.
    pub doc_to_target: FieldSpec,
    /// The choices of a multiple-choice task (for `multiple_inputs`: the contexts).
    #[serde(default)]
    pub doc_to_choice: Option<FieldSpec>,
    /// Put between the context and the continuation.
    #[serde(default = "default_target_delimiter")]
    pub target_delimiter: String,
    /// Put after each few-shot example.
    #[serde(default = "default_fewshot_delimiter")]
    pub fewshot_delimiter: String,
    /// Winogrande's partial scoring: the choices are contexts, the continuation is shared.
    #[serde(default)]
    pub multiple_inputs: bool,
    /// What is reported.
    pub metrics: Vec<Metric>,
    /// Generation settings (`generate_until` only).
    #[serde(default)]
    pub generation: Option<GenerationSpec>,
    /// Answer extraction pipelines (`generate_until` only); none means the raw output.
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
    /// `exact_match` normalisation.
    #[serde(default)]
    pub exact_match: ExactMatchSpec,
    /// Code tasks: how each answer becomes a program that is run (`pass@1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_eval: Option<CodeEvalSpec>,
    /// MATH tasks: the gold text of the `math_verify` metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub math_verify: Option<MathVerifySpec>,
}

fn default_fewshot_seed() -> u64 {
    1234
}
fn default_target_delimiter() -> String {
    " ".to_string()
}
fn default_fewshot_delimiter() -> String {
    "\n\n".to_string()
}

/// How a group combines its members' metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateSpec {
    /// The metrics aggregated (each must be reported by every member task).
    pub metrics: Vec<Metric>,
    /// Weight each member by its number of documents (lm-eval's `weight_by_size`; the stderr is
    /// then the pooled one). Otherwise a plain mean of the members' values.
    #[serde(default = "default_true")]
    pub weight_by_size: bool,
}

fn default_true() -> bool {
    true
}

/// A group of tasks and groups with an aggregate (mmlu and its four categories).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// The group's name.
    pub group: String,
    /// Member tasks or groups.
    pub tasks: Vec<String>,
    /// The aggregate reported for the group.
    pub aggregate: AggregateSpec,
}

/// A task and where it was read from.
#[derive(Debug, Clone)]
pub struct LoadedTask {
    /// The resolved spec.
    pub spec: TaskSpec,
    /// The task's own file.
    pub file: PathBuf,
    /// blake3 of the canonical JSON of `spec` (so a reformatted file keeps its hash).
    pub config_hash: String,
}

/// All tasks and groups of a folder.
#[derive(Debug, Clone, Default)]
pub struct TaskRegistry {
    /// Tasks by name.
    pub tasks: BTreeMap<String, LoadedTask>,
    /// Groups by name, with the file each came from.
    pub groups: BTreeMap<String, (GroupSpec, PathBuf)>,
}

/// The crate's own task folder (`evals/tasks`).
pub fn builtin_tasks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks")
}

impl TaskRegistry {
    /// Reads every `*.yaml` under `dir` (recursively, in sorted order), skipping `_*` fragments.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let mut files = Vec::new();
        collect_yaml(dir, &mut files)
            .with_context(|| format!("listing task files under {}", dir.display()))?;
        files.sort();
        let mut reg = TaskRegistry::default();
        for file in files {
            reg.add_file(&file)?;
        }
        reg.check_groups()?;
        Ok(reg)
    }

    /// Reads one task or group file into the registry.
    pub fn add_file(&mut self, file: &Path) -> Result<()> {
        let value = load_with_includes(file, 0)?;
        let is_group = value.get("group").is_some();
        if is_group {
            let spec: GroupSpec = from_value(value, file)?;
            if self.tasks.contains_key(&spec.group) || self.groups.contains_key(&spec.group) {
                bail!(
                    "{}: the name `{}` is already taken",
                    file.display(),
                    spec.group
                );
            }
            self.groups
                .insert(spec.group.clone(), (spec, file.to_path_buf()));
        } else {
            let spec: TaskSpec = from_value(value, file)?;
            validate(&spec).with_context(|| format!("task file {}", file.display()))?;
            if self.tasks.contains_key(&spec.task) || self.groups.contains_key(&spec.task) {
                bail!(
                    "{}: the name `{}` is already taken",
                    file.display(),
                    spec.task
                );
            }
            let config_hash = config_hash(&spec);
            self.tasks.insert(
                spec.task.clone(),
                LoadedTask {
                    spec,
                    file: file.to_path_buf(),
                    config_hash,
                },
            );
        }
        Ok(())
    }

    fn check_groups(&self) -> Result<()> {
        for (name, (spec, file)) in &self.groups {
            for member in &spec.tasks {
                if !self.tasks.contains_key(member) && !self.groups.contains_key(member) {
                    bail!(
                        "group file {}: member `{member}` is no known task or group",
                        file.display()
                    );
                }
            }
            // A cycle would make expansion loop forever.
            self.expand(name, &mut Vec::new(), &mut Vec::new())
                .with_context(|| format!("group file {}", file.display()))?;
        }
        Ok(())
    }

    /// The tasks a name stands for, in order: itself for a task, all member tasks (depth first)
    /// for a group.
    pub fn tasks_of(&self, name: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.expand(name, &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    fn expand(&self, name: &str, stack: &mut Vec<String>, out: &mut Vec<String>) -> Result<()> {
        if self.tasks.contains_key(name) {
            if !out.iter().any(|t| t == name) {
                out.push(name.to_string());
            }
            return Ok(());
        }
        let Some((group, _)) = self.groups.get(name) else {
            let known: Vec<&String> = self.tasks.keys().chain(self.groups.keys()).collect();
            bail!("unknown task or group `{name}` (known: {known:?})");
        };
        if stack.iter().any(|s| s == name) {
            bail!(
                "group `{name}` contains itself (via {})",
                stack.join(" -> ")
            );
        }
        stack.push(name.to_string());
        for member in &group.tasks {
            self.expand(member, stack, out)?;
        }
        stack.pop();
        Ok(())
    }
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_yaml(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml")
            && !path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('_'))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Parses a YAML file into JSON values, with YAML 1.2 booleans only.
pub fn read_yaml(file: &Path) -> Result<Value> {
    // A task file is a few KB; a path to something else is refused at this bound.
    let bytes = zflow_files::read::bounded(file, 16 << 20)?;
    let text =
        String::from_utf8(bytes).with_context(|| format!("{}: not UTF-8", file.display()))?;
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let value: Value = serde_saphyr::from_str_with_options(&text, options)
        .map_err(|e| anyhow::anyhow!("{}: invalid YAML: {e}", file.display()))?;
    if !value.is_object() {
        bail!("{}: expected a map at the top level", file.display());
    }
    Ok(value)
}

fn load_with_includes(file: &Path, depth: usize) -> Result<Value> {
    if depth > 8 {
        bail!(
            "{}: includes nested more than 8 deep (a cycle?)",
            file.display()
        );
    }
    let mut value = read_yaml(file)?;
    let include = value.as_object_mut().and_then(|m| m.remove("include"));
    match include {
        None => Ok(value),
        Some(Value::String(inc)) => {
            let inc_path = file.parent().unwrap_or(Path::new(".")).join(&inc);
            let mut base = load_with_includes(&inc_path, depth + 1)
                .with_context(|| format!("{}: in `include: {inc}`", file.display()))?;
            merge(&mut base, value);
            Ok(base)
        }
        Some(other) => bail!(
            "{}: `include` must be a file name, not {other}",
            file.display()
        ),
    }
}

fn from_value<T: serde::de::DeserializeOwned>(value: Value, file: &Path) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            anyhow::anyhow!("{}: {inner}", file.display())
        } else {
            anyhow::anyhow!("{}: field `{path}`: {inner}", file.display())
        }
    })
}

/// Checks what serde cannot: combinations of fields that make no sense together.
fn validate(spec: &TaskSpec) -> Result<()> {
    use OutputType::*;
    let needs_choices = spec.output_type == MultipleChoice;
    if needs_choices && spec.doc_to_choice.is_none() {
        bail!("field `doc_to_choice`: a multiple_choice task needs its choices");
    }
    if !needs_choices && spec.doc_to_choice.is_some() {
        bail!("field `doc_to_choice`: only multiple_choice tasks have choices");
    }
    if spec.multiple_inputs && spec.output_type != MultipleChoice {
        bail!("field `multiple_inputs`: only for multiple_choice tasks");
    }
    if spec.output_type == GenerateUntil && spec.generation.is_none() {
        bail!("field `generation`: a generate_until task needs `generation: {{until: [...]}}`");
    }
    if spec.output_type != GenerateUntil && (spec.generation.is_some() || !spec.filters.is_empty())
    {
        bail!("fields `generation`/`filters`: only for generate_until tasks");
    }
    if spec.num_fewshot > 0 && spec.fewshot_split.is_none() {
        bail!(
            "field `fewshot_split`: num_fewshot is {} but no few-shot split is named",
            spec.num_fewshot
        );
    }
    for ds in std::iter::once(&spec.dataset).chain(&spec.fewshot_dataset) {
        if let Some(p) = &ds.process_docs {
            crate::process::columns(p).context("field `process_docs`")?;
        }
    }
    if spec.metrics.is_empty() {
        bail!("field `metrics`: name at least one metric");
    }
    for m in &spec.metrics {
        let ok = match spec.output_type {
            MultipleChoice => matches!(m, Metric::Acc | Metric::AccNorm),
            Loglikelihood => matches!(m, Metric::Acc | Metric::Perplexity | Metric::BitsPerByte),
            LoglikelihoodRolling => matches!(
                m,
                Metric::WordPerplexity | Metric::BytePerplexity | Metric::BitsPerByte
            ),
            GenerateUntil => matches!(m, Metric::ExactMatch | Metric::PassAt1 | Metric::MathVerify),
        };
        if !ok {
            bail!(
                "field `metrics`: `{}` is not defined for {:?} tasks",
                m.name(),
                spec.output_type
            );
        }
    }
    if spec.metrics.contains(&Metric::PassAt1) != spec.code_eval.is_some() {
        bail!("fields `metrics`/`code_eval`: `pass@1` and `code_eval` go together");
    }
    if spec.metrics.contains(&Metric::MathVerify) != spec.math_verify.is_some() {
        bail!(
            "fields `metrics`/`math_verify`: the `math_verify` metric needs its gold text \
             (`math_verify: {{gold: TEMPLATE}}`), and the setting needs the metric"
        );
    }
    if spec.multiple_inputs && spec.metrics.contains(&Metric::AccNorm) {
        bail!("field `metrics`: acc_norm needs choices as continuations, not multiple inputs");
    }
    for f in &spec.filters {
        regex::Regex::new(&f.regex)
            .with_context(|| format!("field `filters`: filter `{}` has a bad regex", f.name))?;
    }
    for r in &spec.exact_match.regexes_to_ignore {
        regex::Regex::new(r)
            .with_context(|| format!("field `exact_match.regexes_to_ignore`: bad regex {r:?}"))?;
    }
    Ok(())
}

/// blake3 of the canonical JSON of a spec (field order fixed by the struct).
pub fn config_hash(spec: &TaskSpec) -> String {
    let json = serde_json::to_vec(spec).expect("a task spec serialises");
    blake3::hash(&json).to_hex().to_string()
}

#[cfg(test)]
mod tests;
