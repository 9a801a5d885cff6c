"""`repexp data prepare TASK`: benchmark data → verl parquet splits + manifest.

Tasks (upstream_recipe.md §3, evaluation_and_data.md §4.2):

| task | train | dev | test |
|---|---|---|---|
| `math` | MATH train (7,500) | the 500 MATH-500 problems of MATH test (by `unique_id`) | the other 4,500 |
| `gsm8k` | GSM8K train (7,473) | 512 GSM8K test problems chosen with the seed | the other 807 |
| `aime24` | MATH train (or DAPO: `--aime-train dapo`) | AIME 2024 (30) | = dev |
| `dapo-with-aime24` | a seeded 4,096-problem subset of the DAPO set | AIME 2024 (30) | = dev |

Sources: a directory of JSONL files (the config's `data.source`) or `hf` (the upstream Hugging Face
ids); loading only fetches raw rows, everything after it is one code path. The DAPO set is not
offline: `--set data.dapo_source=PATH|hf`. Training rows with an empty ground truth or a problem text also in
dev/test (`splits.normalize_text`) are dropped and listed in the manifest; after that, any overlap
between splits is an error (AIME's dev = test is the one designed exception).

Outputs (`--out`, default `results/data/<task>`): `{train,dev,test}.parquet` in verl's row format,
byte-identical for the same inputs and seed, each written atomically, then `manifest.json` last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from repexp import arith, layout
from repexp import splits as sp
from repexp.config import TASKS
from repexp.intermediates import content_digest as sha256_file  # of a file: the SHA-256 of its bytes
from repexp.stage import StageResult
from repexp.verify import routing

SPLITS = layout.SPLITS

# Upstream instruction suffixes (the prompt is question + " " + suffix, one user turn).
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

# data_source values (they route repexp.verify and verl's per-source metrics).
MATH_DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
GSM8K_DATA_SOURCE = "openai/gsm8k"
AIME_DATA_SOURCE = "aime24"
DAPO_DATA_SOURCE = "math_dapo"

DAPO_HF_ID = "ftajwar/deduplicated_dapo_dataset"
MISSING_DAPO = (f"missing DAPO source: the dapo training set ({DAPO_HF_ID}) is not available offline; set "
                "data.dapo_source to a path (a JSONL/parquet file with prompt/problem and answer fields) or hf")
HF = "hf"


class DataError(ValueError):
    """Bad or missing input data; the message names the file (or dataset) and the problem."""


# --------------------------------------------------------------------------- raw tables


@dataclass(frozen=True)
class TableSpec:
    name: str
    local_path: str  # relative to the source directory
    hf_parts: tuple[tuple[str, Optional[str], str], ...]  # (dataset id, config, split), concatenated


TABLES = {
    spec.name: spec
    for spec in (
        TableSpec("math_train", "math/train.jsonl", (("DigitalLearningGmbH/MATH-lighteval", "default", "train"),)),
        TableSpec("math_test", "math/test.jsonl", (("DigitalLearningGmbH/MATH-lighteval", "default", "test"),)),
        TableSpec("math500", "math500/test.jsonl", (("HuggingFaceH4/MATH-500", None, "test"),)),
        TableSpec("gsm8k_train", "gsm8k/train.jsonl", (("openai/gsm8k", "main", "train"),)),
        TableSpec("gsm8k_test", "gsm8k/test.jsonl", (("openai/gsm8k", "main", "test"),)),
        # Upstream's AIME source; the local file is the HuggingFaceH4/aime_2024 copy (same answers).
        TableSpec("aime24", "aime24/test.jsonl",
                  (("MathArena/aime_2024_I", None, "train"), ("MathArena/aime_2024_II", None, "train"))),
        TableSpec("dapo", "", ((DAPO_HF_ID, None, "train"),)),
    )
}


@dataclass
class RawTable:
    """Rows exactly as loaded, with where they came from."""

    name: str
    rows: list[dict]
    origin: str  # a file path or "hf:<id>[:<config>]/<split>"
    sha256: str  # of the file bytes (local) or of the canonical JSON rows (hf)
    kind: str  # "local" | "hf"


def rows_sha256(rows: Sequence[dict]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def load_local(names: Sequence[str], source_dir: Path) -> dict[str, RawTable]:
    if not source_dir.is_dir():
        raise FileNotFoundError(f"{source_dir}: data source directory not found")
    manifest, expected = source_dir / layout.SOURCE_MANIFEST, {}  # written by `repexp download data`
    if manifest.is_file():
        try:
            expected = {entry["path"]: entry["sha256"] for entry in json.loads(manifest.read_text())["files"]}
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{manifest}: unreadable data manifest ({err})") from None
    tables = {}
    for name in names:
        spec = TABLES[name]
        path = source_dir / spec.local_path
        rows = read_jsonl(path)
        digest = sha256_file(path)
        if spec.local_path in expected and expected[spec.local_path] != digest:
            raise DataError(f"{path}: sha256 {digest[:12]}… differs from "
                            f"{layout.SOURCE_MANIFEST} ({expected[spec.local_path][:12]}…): the file was modified")
        tables[name] = RawTable(name, rows, str(path), digest, "local")
    return tables


def load_dapo_file(path: Path) -> RawTable:
    if path.is_dir():
        found = [c for c in (path / Path(layout.DAPO_SOURCE_FILE).name, path / "train.parquet") if c.is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: DAPO source directory has neither train.jsonl nor train.parquet")
        path = found[0]
    if path.suffix != ".parquet":
        return RawTable("dapo", read_jsonl(path), str(path), sha256_file(path), "local")
    import pyarrow.parquet as pq  # the DAPO set as downloaded from the Hub is parquet

    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    if not rows:
        raise DataError(f"{path}: no rows")
    return RawTable("dapo", rows, str(path), sha256_file(path), "local")


def _load_hf_part(dataset_id: str, config: Optional[str], split: str) -> list[dict]:
    """The one place that talks to the Hub (never exercised offline)."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"data.source hf needs the `datasets` package ({err})") from None
    return [dict(row) for row in datasets.load_dataset(dataset_id, config, split=split)]


def load_hf(names: Sequence[str],
            loader: Callable[[str, Optional[str], str], list[dict]] = _load_hf_part) -> dict[str, RawTable]:
    tables = {}
    for name in names:
        spec = TABLES[name]
        rows: list[dict] = []
        origins = []
        for dataset_id, config, split in spec.hf_parts:
            part = loader(dataset_id, config, split)
            if name == "aime24":  # MathArena ships AIME I and II as two datasets
                part = [{**row, "contest": "II" if dataset_id.endswith("_II") else "I"} for row in part]
            rows.extend(part)
            origins.append(f"hf:{dataset_id}{':' + config if config else ''}/{split}")
        tables[name] = RawTable(name, rows, " + ".join(origins), rows_sha256(rows), "hf")
    return tables


# --------------------------------------------------------------------------- canonical problems


@dataclass
class Problem:
    problem_id: str
    source: str  # math | gsm8k | aime24 | dapo | arith | arith-hard | arith-mid
    source_split: str
    index: int  # row index in the source split (upstream's extra_info.index)
    question: str
    ground_truth: str
    data_source: str
    solution: Optional[str] = None
    level: Optional[str] = None
    subject: Optional[str] = None
    unique_id: Optional[str] = None


def _field(table: RawTable, i: int, row: dict, *names: str, required: bool = True) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    if required:
        raise DataError(f"{table.origin}, row {i}: missing field {' / '.join(repr(n) for n in names)}")
    return None


def _text(table: RawTable, i: int, value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{table.origin}, row {i}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def _answer_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def math_problems(table: RawTable, split: str) -> list[Problem]:
    from repexp.verify import last_boxed

    problems = []
    for i, row in enumerate(table.rows):
        question = _text(table, i, _field(table, i, row, "problem"), "problem")
        solution = _text(table, i, _field(table, i, row, "solution"), "solution")
        answer = _field(table, i, row, "answer", required=False)
        if answer is None:  # the Hub copy has no answer column: derive it as the local files did
            answer = last_boxed(solution) or ""
        problems.append(Problem(f"math/{split}/{i}", "math", split, i, question, _answer_text(answer), MATH_DATA_SOURCE,
                                solution, level=None if row.get("level") is None else str(row["level"]),
                                subject=row.get("type") or row.get("subject"), unique_id=row.get("unique_id")))
    return problems


def gsm8k_problems(table: RawTable, split: str) -> list[Problem]:
    problems = []
    for i, row in enumerate(table.rows):
        question = _text(table, i, _field(table, i, row, "question"), "question")
        solution = _text(table, i, _field(table, i, row, "answer"), "answer")
        if "####" not in solution:
            raise DataError(f"{table.origin}, row {i}: answer has no '#### <number>' line")
        truth = solution.split("####")[-1].strip().replace(",", "")
        problems.append(Problem(f"gsm8k/{split}/{i}", "gsm8k", split, i, question, truth, GSM8K_DATA_SOURCE, solution))
    return problems


_AIME_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def aime_problems(table: RawTable) -> list[Problem]:
    """AIME 2024 in contest order (I-1 … II-15); ids like `aime24/2024-I-1` do not depend on the source."""
    keyed = []
    for i, row in enumerate(table.rows):
        question = _text(table, i, _field(table, i, row, "problem", "question"), "problem")
        answer = _answer_text(_field(table, i, row, "answer"))
        if "url" in row:
            match = _AIME_URL.search(str(row["url"]))
            if not match:
                raise DataError(f"{table.origin}, row {i}: url {row['url']!r} is not an AoPS AIME problem link")
            year, contest, number = int(match.group(1)), match.group(2), int(match.group(3))
        else:
            contest = _field(table, i, row, "contest")
            year, number = 2024, int(_field(table, i, row, "problem_idx"))
        if answer.isdigit():
            answer = str(int(answer))  # "025" → "25", as MathArena stores them
        keyed.append(((year, contest, number), question, answer, row.get("solution")))
    keyed.sort(key=lambda item: item[0])
    problems: list[Problem] = []
    for position, ((year, contest, number), question, answer, solution) in enumerate(keyed):
        pid = f"aime24/{year}-{contest}-{number}"
        if problems and problems[-1].problem_id == pid:  # sorted: a repeat is the previous problem
            raise DataError(f"{table.origin}: AIME problem {year}-{contest}-{number} occurs twice")
        problems.append(Problem(pid, "aime24", "test", position, question, answer, AIME_DATA_SOURCE, solution))
    return problems


def dapo_problems(table: RawTable) -> list[Problem]:
    problems = []
    for i, row in enumerate(table.rows):
        prompt = _field(table, i, row, "prompt", "problem", "question")
        if isinstance(prompt, list):  # a chat list: the (last) user turn is the question
            turns = [t.get("content") for t in prompt if isinstance(t, dict) and t.get("role") == "user"]
            prompt = turns[-1] if turns else None
        question = _text(table, i, prompt, "prompt")
        answer = _field(table, i, row, "answer", "solution")
        problems.append(Problem(f"dapo/train/{i}", "dapo", "train", i, question, _answer_text(answer),
                                DAPO_DATA_SOURCE))
    return problems


# --------------------------------------------------------------------------- task recipes


@dataclass
class Options:
    seed: int = 0
    limit_train: Optional[int] = None
    limit_dev: Optional[int] = None
    limit_test: Optional[int] = None
    gsm8k_dev_size: int = sp.GSM8K_DEV_SIZE
    dapo_train_size: int = sp.DAPO_TRAIN_SIZE
    aime_train: str = "math"  # aime24 only: "math" | "dapo"


@dataclass
class Prepared:
    task: str
    splits: dict[str, list[Problem]]
    dropped: list[dict] = field(default_factory=list)
    dev_equals_test: bool = False
    notes: list[str] = field(default_factory=list)


def tables_needed(task: str, options: Options) -> list[str]:
    aime_train = "dapo" if options.aime_train == "dapo" else "math_train"
    return {"math": ["math_train", "math_test", "math500"], "gsm8k": ["gsm8k_train", "gsm8k_test"],
            "aime24": [aime_train, "aime24"], "dapo-with-aime24": ["dapo", "aime24"]}.get(task, [])  # arith: none


def _pick(problems: Sequence[Problem], indices: Sequence[int]) -> list[Problem]:
    return [problems[i] for i in indices]


def build(task: str, tables: dict[str, RawTable], options: Options) -> Prepared:
    """Raw tables → checked splits; the shared path for every source."""
    notes: list[str] = []
    dev_equals_test = task in ("aime24", "dapo-with-aime24")  # AIME's dev = test, the one designed overlap
    if task == "math":
        train = math_problems(tables["math_train"], "train")
        test_pool = math_problems(tables["math_test"], "test")
        dev_rows = math_problems(tables["math500"], "test")
        # the Hub's MATH-lighteval has no unique_id: then MATH-500 is matched by problem text
        how = "unique_id" if all(p.unique_id for p in test_pool + dev_rows) else "problem text"
        key = (lambda p: p.unique_id) if how == "unique_id" else (lambda p: sp.normalize_text(p.question))
        keys, members = [key(p) for p in test_pool], [key(p) for p in dev_rows]
        try:
            dev_idx, test_idx = sp.split_by_membership(keys, members, what=f"MATH-500 in MATH test (by {how})")
        except sp.SplitError as err:
            raise DataError(f"{tables['math500'].origin} vs {tables['math_test'].origin}: {err}") from None
        notes.append(f"dev = the {len(dev_idx)} MATH-500 problems of MATH test, matched by {how}")
        dev, test = _pick(test_pool, dev_idx), _pick(test_pool, test_idx)
    elif task == "gsm8k":
        train = gsm8k_problems(tables["gsm8k_train"], "train")
        test_pool = gsm8k_problems(tables["gsm8k_test"], "test")
        dev_idx, test_idx = sp.seeded_dev_test(len(test_pool), options.gsm8k_dev_size, options.seed)
        dev, test = _pick(test_pool, dev_idx), _pick(test_pool, test_idx)
    elif task in ("aime24", "dapo-with-aime24"):
        aime = aime_problems(tables["aime24"])
        dev, test = list(aime), list(aime)
        wants_dapo = task == "dapo-with-aime24" or options.aime_train == "dapo"
        if wants_dapo and "dapo" not in tables:
            raise DataError(MISSING_DAPO)
        train = dapo_problems(tables["dapo"]) if wants_dapo else math_problems(tables["math_train"], "train")
    else:  # a built-in task (the CLI's choices and the config allow no other)
        train, dev, test = ([generated_problem(task, q) for q in questions]
                            for questions in arith.task_split(task, options.seed).values())
        kinds = f", kinds {', '.join(arith.KIND_TASKS[task])}" if task in arith.KIND_TASKS else ""
        notes.append(f"generated: {len(train)} train, {len(dev)} dev, {len(test)} test questions (repexp.arith{kinds})")

    # Training rows nobody can score, or that leak dev/test problems, are dropped (and listed).
    dropped = [{"problem_id": p.problem_id, "split": "train", "reason": "empty ground truth"}
               for p in train if not p.ground_truth]
    kept = [p for p in train if p.ground_truth]
    keep_idx, leak_idx = sp.drop_overlapping([p.question for p in kept], [p.question for p in dev + test])
    for i in leak_idx:
        dropped.append({"problem_id": kept[i].problem_id, "split": "train", "reason": "problem text also in dev/test"})
    train = _pick(kept, keep_idx)
    for name, rows in (("dev", dev), ("test", test)):
        empty = [p.problem_id for p in rows if not p.ground_truth]
        if empty:
            raise DataError(f"{name} split: {len(empty)} problems have an empty ground truth, e.g. {empty[:3]}")

    if train and train[0].source == "dapo":
        try:
            subset = sp.train_subset(len(train), options.dapo_train_size, options.seed)
        except sp.SplitError as err:
            raise DataError(f"{tables['dapo'].origin}: {err} (after dropping {len(dropped)} rows)") from None
        train = _pick(train, subset)
        notes.append(f"train = a seeded {options.dapo_train_size}-problem subset of the DAPO set")

    result = {name: _pick(rows, sp.limit(list(range(len(rows))), getattr(options, f"limit_{name}"), options.seed,
                                         f"limit/{name}"))
              for name, rows in (("train", train), ("dev", dev), ("test", test))}
    for name, rows in result.items():
        if not rows:
            raise DataError(f"{task}: the {name} split is empty")
    sp.check_disjoint({name: [sp.SplitRow(p.problem_id, p.question) for p in rows] for name, rows in result.items()},
                      may_share=[("dev", "test")] if dev_equals_test else [])
    return Prepared(task, result, dropped, dev_equals_test, notes)


# --------------------------------------------------------------------------- verl rows and parquet


def generated_problem(task: str, question: arith.Question) -> Problem:
    """A question of a built-in task (`arith.TASKS`) as a canonical problem."""
    data_source = {"arith": routing.ARITH_DATA_SOURCE, "arith-hard": routing.ARITH_HARD_DATA_SOURCE,
                   "arith-mid": routing.ARITH_MID_DATA_SOURCE}[task]  # repexp.verify's arith, final-number families
    return Problem(f"{task}/{question.index}", task, "generated", question.index, question.text,
                   str(question.answer), data_source)


def chat_prompt(problem: Problem) -> list[dict]:
    """The prompt as chat messages: question + instruction in one user turn; the built-in arithmetic
    tasks put their instruction in a short system turn instead (it replaces the chat template's default
    system prompt, which would be most of the prompt's tokens), followed by worked examples
    (`repexp.arith.shot_messages`: the model then answers with the number instead of explaining
    until the token cap)."""
    if problem.source == "arith":
        return arith.shot_messages(problem.question)
    if problem.source in arith.KIND_TASKS:
        return arith.hard_messages(problem.question)
    instruction = GSM8K_INSTRUCTION if problem.source == "gsm8k" else MATH_INSTRUCTION
    return [{"role": "user", "content": f"{problem.question} {instruction}"}]


# The text fields of a row's `extra_info`, after its split and index: the row (verl_row) and the parquet
# schema (parquet_schema) both read this one list.
EXTRA_INFO_TEXT = ("problem_id", "source", "source_split", "question", "solution", "level", "subject")


def verl_row(problem: Problem, split: str) -> dict:
    return {
        "data_source": problem.data_source,
        "prompt": chat_prompt(problem),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem.ground_truth},
        "extra_info": {"split": split, "index": problem.index,
                       **{name: getattr(problem, name) for name in EXTRA_INFO_TEXT}},
    }


def parquet_schema():
    import pyarrow as pa

    text = pa.string()
    info = [("split", text), ("index", pa.int64()), *((name, text) for name in EXTRA_INFO_TEXT)]
    return pa.schema([("data_source", text), ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
                      ("ability", text), ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
                      ("extra_info", pa.struct(info))])


def write_parquet(rows: list[dict], path: Path) -> None:
    """Byte-deterministic: fixed schema and row order, no pandas metadata, fixed writer settings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from repexp.io import atomic_path

    table = pa.Table.from_pylist(rows, schema=parquet_schema())
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", compression_level=3, use_dictionary=True,
                       write_statistics=True, version="2.6")


# --------------------------------------------------------------------------- prepare


def prepare(task: str, out_dir: str | Path, *, source: str, options: Options, dapo_source: Optional[str] = None,
            tables: Optional[dict[str, RawTable]] = None) -> dict:
    """Load (unless `tables` are given), split, check, write; returns the manifest."""
    import pyarrow

    from repexp import __version__
    from repexp.io import write_json_atomic

    if tables is None:  # the task and --aime-train are the CLI's choices, or from a checked config
        names = tables_needed(task, options)
        if "dapo" in names and not dapo_source:
            raise DataError(MISSING_DAPO)  # before any other table is read or downloaded
        local = [n for n in names if n != "dapo"]
        tables = {} if not local else load_hf(local) if source == HF else load_local(local, Path(source))
        if "dapo" in names:
            tables.update(load_hf(["dapo"]) if dapo_source == HF else {"dapo": load_dapo_file(Path(dapo_source))})
    prepared = build(task, tables, options)  # everything is checked before anything is written

    out_dir = Path(out_dir)
    outputs = {}
    for split in SPLITS:
        rows = [verl_row(p, split) for p in prepared.splits[split]]
        path = layout.split_file(out_dir, split)
        write_parquet(rows, path)
        outputs[split] = {"file": path.name, "rows": len(rows), "sha256": sha256_file(path),
                          "data_sources": sorted({r["data_source"] for r in rows}),
                          "first_problem_ids": [r["extra_info"]["problem_id"] for r in rows[:3]]}
    manifest = {
        "task": task,
        "seed": options.seed,
        "source": source,
        "inputs": {name: {"origin": t.origin, "kind": t.kind, "rows": len(t.rows), "sha256": t.sha256}
                   for name, t in sorted(tables.items())},
        "options": {
            **{f"limit_{name}": getattr(options, f"limit_{name}") for name in SPLITS},
            "gsm8k_dev_size": options.gsm8k_dev_size if task == "gsm8k" else None,
            "dapo_train_size": options.dapo_train_size if "dapo" in tables else None,
            "aime_train": options.aime_train if task == "aime24" else None,
        },
        "splits": outputs,
        "dev_equals_test": prepared.dev_equals_test,
        "dropped": prepared.dropped,
        "notes": prepared.notes,
        "instruction": {"gsm8k": GSM8K_INSTRUCTION, "arith": arith.SYSTEM_PROMPT,
                        **{kind_task: arith.HARD_SYSTEM_PROMPT for kind_task in arith.KIND_TASKS}}.get(
                            task, MATH_INSTRUCTION),
        "versions": {"repexp": __version__, "pyarrow": pyarrow.__version__},
    }
    write_json_atomic(layout.manifest_file(out_dir), manifest)
    return manifest


# --------------------------------------------------------------------------- CLI


def _at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value}")
        return value
    return parse


_positive = _at_least(1, "positive")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import config_options

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prep = sub.add_parser("prepare", help="write train/dev/test parquet splits and manifest.json for a task")
    prep.add_argument("task", choices=TASKS)
    prep.add_argument("--out", default=None, help="output directory (default: <results_dir>/data/TASK)")
    config_options(prep, "data.source=../shared/data data.limit_test=64 data.split_seed=1")
    paper = prep.add_argument_group("the paper's split recipe (fixed in the workflow)")
    paper.add_argument("--dapo-train-size", type=_positive, default=None,
                       help=f"DAPO training subset size (default: {sp.DAPO_TRAIN_SIZE})")
    paper.add_argument("--gsm8k-dev-size", type=_positive, default=None,
                       help=f"GSM8K dev size (default: {sp.GSM8K_DEV_SIZE})")
    paper.add_argument("--aime-train", choices=("math", "dapo"), default=None,
                       help="aime24 task: train on MATH train (default) or the DAPO subset")


def run(args: argparse.Namespace) -> int:  # the one action: prepare
    from repexp import jobs

    def build(cfg, **given):  # unlike the workflow's, a hand run reads data.dapo_source for any task
        return jobs.PreprocessJob(config=cfg.data, **{"out": str(layout.data_dir(cfg.results_dir, args.task)),
                                                      **given})

    try:
        job = jobs.hand_job("preprocess", args, build, task=args.task, out=args.out,
                            **{name: getattr(args, name) for name in ("dapo_train_size", "gsm8k_dev_size",
                                                                      "aime_train")})
    except ValueError as err:  # a ConfigError names the key
        print(f"repexp data prepare {args.task}: error: {err}", file=sys.stderr)
        return 2
    return run_job(job).code


def run_job(job):
    """A task's splits and manifest (`repexp.jobs.PreprocessJob`: the workflow's and `repexp data prepare`'s);
    its node logs the source files as input datasets."""
    from repexp.tracking.outputs import source_datasets

    data = job.config
    options = Options(seed=data.split_seed, limit_train=data.limit_train, limit_dev=data.limit_dev,
                      limit_test=data.limit_test, **{name: getattr(job, name) for name in ("gsm8k_dev_size",
                      "dapo_train_size", "aime_train") if getattr(job, name) is not None})  # None: Options' default
    out = job.out
    try:
        manifest = prepare(job.task, out, source=data.source, options=options, dapo_source=data.dapo_source)
    except (DataError, sp.SplitError, FileNotFoundError) as err:
        print(f"repexp data prepare {job.task}: error: {err}", file=sys.stderr)
        return StageResult(code=2)
    from repexp.intermediates import record_content

    for info in manifest["splits"].values():
        record_content(Path(out) / info["file"])  # a byte-identical rebuild reruns nothing made from it
    counts = ", ".join(f"{name} {info['rows']}" for name, info in manifest["splits"].items())
    print(f"{job.task}: wrote {out} ({counts}; dropped {len(manifest['dropped'])} training rows)")
    return StageResult(inputs=source_datasets(manifest))
