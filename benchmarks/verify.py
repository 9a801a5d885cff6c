"""Verifier throughput (sequential vs process pool) and full-data agreement rates.

    .venv/bin/python benchmarks/verify.py throughput [--problems 150 --samples 32 --workers 2]
    .venv/bin/python benchmarks/verify.py agreement
    .venv/bin/python benchmarks/verify.py study
    .venv/bin/python benchmarks/verify.py compare --rev ae3f9bb [--repeats 3]

`throughput` synthesises model-like responses from the shipped reference solutions
(MATH test, GSM8K test, AIME 2024): the solution text with its final answer replaced
by a correct answer in an equivalent form, a wrong answer (a few distinct ones per
problem, as samples of one prompt repeat answers), an earlier box later corrected, or
a truncated solution with no answer. All methods score the same responses in the same
run, each method in a fresh process warmed identically on other problems (the LaTeX
parser and sympy get much faster after their first few hundred inputs), caches cold:

- baseline: every response's answer through Math-Verify, nothing reused (what a
  per-response scorer such as verl's does);
- `score()` in a loop (string/integer fast paths and the result cache);
- `score_batch` in-process (extract all, compare each distinct (gold, answer) once);
- `score_batch` on a new process pool (pays the worker start) and on a warm one.

A worst-case set gives every response a different radical (`\\frac{a\\sqrt2}{b}`), so nothing
deduplicates and no exact fast path applies: every response costs a Math-Verify comparison.
The table reports responses/s and the ratio to the baseline, plus the projected cost
of the paper sweep's test evaluation.

`agreement` scores every reference solution against its own ground truth, with the
production scorer and with Math-Verify alone (no string/integer fast path); the
numbers in docs/data.md come from here.

`compare` measures this checkout's `score_batch` (in-process) against the `repexp` package of
another git revision on the same MATH responses, alternating the two in fresh processes, so the
ratio holds even on a loaded machine whose absolute CPU rates drift.

`study` scores the labelled agreement corpus (`tests/data/agreement_corpus.jsonl`) with the
repexp grader, the paper grader and Math-Verify alone (the paper's AIME scorer applied to every
task), and prints accuracy against the labels per task plus every disagreement class: the table
in docs/data.md, "Agreement study".
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from repexp import verify
from repexp.verify import compare

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
MATH, GSM8K, AIME = "DigitalLearningGmbH/MATH-lighteval", "openai/gsm8k", "aime24"
# Paper sweep: test problems per task, 256 samples, 3 seeds x (RepExp + GRPO) + the base model.
SWEEP = {"math": 4500, "gsm8k": 807, "aime24": 30}
SAMPLES, EVALS_PER_TASK = 256, 3 * 2 + 1


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- synthetic responses


def _strip_final_box(solution: str) -> str:
    start = max(solution.rfind("\\boxed"), solution.rfind("\\fbox"))
    return solution[:start] if start >= 0 else solution


def _math_forms(gold: str) -> list[str]:
    forms = [gold, gold.replace(",", ", "), gold.replace("\\frac", "\\dfrac")]
    if "=" not in gold and not gold.startswith("\\text"):
        forms.append(f"x = {gold}")
    if gold.lstrip("-").isdigit():
        forms.append(f"{gold}.0")
    return forms


def _wrong_answers(gold: str, rng: np.random.Generator, pool: list[str]) -> list[str]:
    """A few popular wrong answers for one problem."""
    if gold.lstrip("-").isdigit():
        value = int(gold)
        return [str(value + 1), str(value - 1), str(2 * value + 3), str(-value - 2)]
    wrong = [_perturb(gold, rng) for _ in range(3)] + [pool[int(rng.integers(len(pool)))]]
    return [w for w in wrong if w != gold] or ["\\text{no}"]


def _perturb(gold: str, rng: np.random.Generator) -> str:
    """A one-off wrong answer: one digit changed (or a random integer when the gold has none)."""
    digits = [i for i, ch in enumerate(gold) if ch.isdigit()]
    if not digits:
        return str(int(rng.integers(2, 10_000)))
    i = digits[int(rng.integers(len(digits)))]
    digit = str((int(gold[i]) + int(rng.integers(1, 10))) % 10)
    return gold[:i] + digit + gold[i + 1 :] + ("" if rng.random() < 0.5 else str(int(rng.integers(10))))


def realistic_math(problems: int, samples: int, rng: np.random.Generator, source: str = MATH, rows=None):
    rows = rows if rows is not None else load("math/test.jsonl")
    chosen = [rows[i] for i in sorted(rng.choice(len(rows), size=min(problems, len(rows)), replace=False))]
    answers = [r["answer"].strip() for r in rows if r["answer"].strip()]
    out = []
    for row in chosen:
        gold = str(row["answer"]).strip()
        body = _strip_final_box(row.get("solution") or row["problem"])
        forms, wrong = _math_forms(gold), _wrong_answers(gold, rng, answers)
        for _ in range(samples):
            kind = rng.random()
            if kind < 0.55:
                form = forms[0] if rng.random() < 0.6 else forms[int(rng.integers(len(forms)))]
                final = f"The final answer is $\\boxed{{{form}}}$."
            elif kind < 0.90:  # wrong: half a popular wrong answer, half a one-off (a long tail, as at T = 1)
                answer = wrong[int(rng.integers(len(wrong)))] if rng.random() < 0.5 else _perturb(gold, rng)
                final = f"The final answer is $\\boxed{{{answer}}}$."
            elif kind < 0.95:  # an early box, then a corrected final one
                final = f"So $\\boxed{{{wrong[0]}}}$? Checking again, the answer is $\\boxed{{{forms[0]}}}$."
            else:  # cut off by the length limit: no final answer
                body, final = body[: int(len(body) * 0.7)], ""
            out.append((source, body + final, gold))
    return out


def realistic_gsm8k(problems: int, samples: int, rng: np.random.Generator):
    rows = load("gsm8k/test.jsonl")
    chosen = [rows[i] for i in sorted(rng.choice(len(rows), size=min(problems, len(rows)), replace=False))]
    out = []
    for row in chosen:
        body, _, tail = row["answer"].rpartition("####")
        gold = tail.strip().replace(",", "")
        value = int(gold)
        forms = [f"#### {gold}", f"#### ${value:,}", f"#### {gold}.00", f"The answer is $\\boxed{{{gold}}}$."]
        wrong = [f"#### {value + 1}", f"#### {value * 2}", f"#### {max(value - 3, 0)}",
                 f"#### {int(rng.integers(1, 2 * value + 10))}"]
        for _ in range(samples):
            kind = rng.random()
            if kind < 0.6:
                final = forms[0] if rng.random() < 0.7 else forms[int(rng.integers(len(forms)))]
            elif kind < 0.93:
                final = wrong[int(rng.integers(len(wrong)))]
            else:
                final = ""
            out.append((GSM8K, body + final, gold))
    return out


def realistic_aime(samples: int, rng: np.random.Generator):
    rows = [{"answer": r["answer"], "solution": r["solution"], "problem": r["problem"]}
            for r in load("aime24/test.jsonl")]
    out = []
    for row in rows:
        gold = row["answer"]
        body = _strip_final_box(row["solution"])
        wrong = [f"{(int(gold) + d) % 1000:03d}" for d in (1, 17, 250, 511)]
        for _ in range(samples):
            kind = rng.random()
            if kind < 0.3:
                final = f"$\\boxed{{{gold if rng.random() < 0.5 else int(gold)}}}$"
            elif kind < 0.92:
                popular = rng.random() < 0.5
                answer = wrong[int(rng.integers(len(wrong)))] if popular else f"{int(rng.integers(1000)):03d}"
                final = f"$\\boxed{{{answer}}}$"
            else:
                final = ""
            out.append((AIME, body + final, gold))
    return out


def all_distinct(count: int, rng: np.random.Generator):
    """Worst case: every response a different radical, nothing to deduplicate and no exact fast path."""
    out, seen = [], set()
    while len(out) < count:
        a, b = int(rng.integers(1, 5000)), int(rng.integers(2, 5000))
        if (a, b) in seen:
            continue
        seen.add((a, b))
        response = f"... so the answer is $\\boxed{{\\frac{{{a}\\sqrt{{2}}}}{{{b}}}}}$."
        out.append((MATH, response, "\\frac{3\\sqrt{2}}{7}"))
    return out


# --------------------------------------------------------------------------- measurement


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pids) -> float:
    """user+system CPU seconds of running processes (Linux /proc), to report load-independent cost."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _worker_pids(pool) -> list[int]:
    return [w.process.pid for w in pool._pool._pool] if pool is not None else []


def _time(fn, pool=None) -> tuple[float, float, np.ndarray]:
    """(wall seconds, CPU seconds of this process + the pool's workers, scores) with cold caches."""
    from sympy.core.cache import clear_cache

    verify.clear_caches()
    clear_cache()  # sympy's own memo: otherwise later methods reuse work done by earlier ones
    workers_before = _cpu_seconds(_worker_pids(pool))
    cpu_started, started = time.process_time(), time.perf_counter()
    scores = fn()
    wall = time.perf_counter() - started
    # this process exactly, workers from /proc (10 ms ticks; workers started inside fn count from zero)
    cpu = time.process_time() - cpu_started + _cpu_seconds(_worker_pids(pool)) - workers_before
    return wall, cpu, np.asarray(scores, dtype=np.float64)


def _uncached(batch) -> list[float]:
    """Upstream-style baseline: every response's answer goes through Math-Verify, nothing is reused."""
    scores = []
    for source, response, truth in batch:
        answer = verify.extract_answer(source, response)
        if answer is None:
            scores.append(0.0)
        elif verify.family(source) == verify.GSM8K:
            scores.append(verify.score_answer(source, answer, truth))
        else:
            compare._parse_boxed.cache_clear()
            key = (compare.BOXED, verify.normalize_answer(truth), answer, verify.DEFAULT_TIMEOUT_S)
            scores.append(compare.run_key(key))
    return scores


METHODS = ("baseline", "score_loop", "batch_inprocess", "new_pool", "warm_pool")


def _method_label(method: str, workers: int) -> str:
    return {
        "baseline": "baseline: Math-Verify per response, no reuse",
        "score_loop": "score() loop (fast paths + cache)",
        "batch_inprocess": "score_batch, in-process",
        "new_pool": f"score_batch, new pool of {workers} (incl. start)",
        "warm_pool": f"score_batch, warm pool of {workers}",
    }[method]


def _run_method(method: str, batch, warm_batch, workers: int, results) -> None:
    """One method in a fresh process: parser caches warmed the same way for every method."""
    sources, responses, truths = (list(x) for x in zip(*batch))
    verify.warm_up()
    verify.score_batch(*zip(*warm_batch), workers=1)  # warm LaTeX parser + sympy on other problems
    pool = None
    if method == "new_pool":  # what a one-off score_batch(workers=N) pays: start and cold workers
        pool = verify.VerifierPool(workers=workers)
    elif method == "warm_pool":
        pool = verify.VerifierPool(workers=workers)
        verify.clear_caches()  # else the warm batch is answered from this process's cache, never reaching the pool
        pool.score_batch(*zip(*warm_batch))  # start and warm the workers (GSM8K never needs them)
    runners = {
        "baseline": lambda: _uncached(batch),
        "score_loop": lambda: [verify.score(s, r, g) for s, r, g in batch],
        "batch_inprocess": lambda: verify.score_batch(sources, responses, truths, workers=1),
        "new_pool": lambda: pool.score_batch(sources, responses, truths),
        "warm_pool": lambda: pool.score_batch(sources, responses, truths),
    }
    try:
        wall, cpu, scores = _time(runners[method], pool=pool)
    finally:
        if pool is not None:
            pool.close()
    results.put((wall, cpu, scores.tolist()))


def measure(name: str, batch, warm_batch, workers: int) -> list[dict]:
    """Every method on the same responses, each in a fresh, identically warmed process; result caches cold."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    timings = {}
    for method in METHODS:
        results = ctx.Queue()
        process = ctx.Process(target=_run_method, args=(method, batch, warm_batch, workers, results))
        process.start()
        while True:
            try:
                wall, cpu, scores = results.get(timeout=5)
                break
            except queue.Empty:
                if not process.is_alive():
                    raise SystemExit(f"{name} / {method}: the measuring process died "
                                     f"(exit code {process.exitcode})") from None
        process.join()
        timings[_method_label(method, workers)] = (wall, cpu, np.asarray(scores))
    expected = np.asarray([verify.score(s, r, g) for s, r, g in batch])
    base_wall, base_cpu, _ = timings[_method_label("baseline", workers)]
    distinct = len({(s, verify.extract_answer(s, r), g) for s, r, g in batch})
    rows = []
    for method, (wall, cpu, scores) in timings.items():
        if not np.array_equal(scores, expected):
            raise SystemExit(f"{name} / {method}: scores differ from score()")
        rows.append({"set": name, "method": method, "seconds": wall, "cpu": cpu, "n": len(batch),
                     "rate": len(batch) / wall, "cpu_rate": len(batch) / max(cpu, 1e-9),
                     "ratio": base_wall / wall, "cpu_ratio": base_cpu / max(cpu, 1e-9),
                     "accuracy": float(expected.mean()), "distinct": distinct})
    return rows


def throughput(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    math_rows = load("math/test.jsonl")
    order = rng.permutation(len(math_rows))
    measured_math = [math_rows[i] for i in order[: args.problems]]
    warm_rows = [math_rows[i] for i in order[args.problems : args.problems + args.warm_problems]]
    sets = {
        f"MATH test ({args.problems}x{args.samples})": (
            realistic_math(args.problems, args.samples, rng, rows=measured_math),
            realistic_math(args.warm_problems, 8, rng, rows=warm_rows),
        ),
        f"GSM8K test ({args.problems}x{args.samples})": (
            realistic_gsm8k(args.problems, args.samples, rng), realistic_gsm8k(20, 8, rng),
        ),
        f"AIME 2024 (30x{args.samples})": (realistic_aime(args.samples, rng), realistic_aime(4, rng)),
        f"worst case: {args.distinct} distinct answers": (
            all_distinct(args.distinct, rng),
            all_distinct(200, np.random.default_rng(args.seed + 1))
            + realistic_math(args.warm_problems, 8, rng, rows=warm_rows),
        ),
    }
    load_before = os.getloadavg()
    rows = []
    for name, (batch, warm_batch) in sets.items():
        rows += measure(name, batch, warm_batch, args.workers)
        print(f"measured {name}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(f"\nmachine: {os.cpu_count()} CPUs (affinity {verify.default_workers()}), load average "
          f"{load_before[0]:.1f} before / {load_after[0]:.1f} after; pool workers: {args.workers}\n")
    print("| responses | n | distinct (gold, answer) | accuracy | method | wall s | responses/s | vs baseline (wall) "
          "| CPU s | responses/CPU-s | vs baseline (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['n']} | {r['distinct']} | {r['accuracy']:.2f} | {r['method']} | {r['seconds']:.2f} "
              f"| {r['rate']:,.0f} | {r['ratio']:.2f}x | {r['cpu']:.2f} | {r['cpu_rate']:,.0f} "
              f"| {r['cpu_ratio']:.2f}x |")
    print("\nprojected verifier cost of the paper sweep's test evaluation "
          f"({SAMPLES} samples x {EVALS_PER_TASK} evaluations per task): CPU-hours (load-independent), "
          f"and wall hours on {args.workers} idle cores with the pool (CPU-hours / {args.workers}):")
    print("| task | problems | responses | baseline CPU-h | score_batch CPU-h (warm pool) | wall h, pool of "
          f"{args.workers} |")
    print("|---|---|---|---|---|---|")
    base = {r["set"].split(" (")[0]: r["cpu_rate"] for r in rows if r["method"].startswith("baseline")}
    warm = {r["set"].split(" (")[0]: r["cpu_rate"] for r in rows if "warm pool" in r["method"]}
    totals = [0.0, 0.0]
    for task, key in (("math", "MATH test"), ("gsm8k", "GSM8K test"), ("aime24", "AIME 2024")):
        responses = SWEEP[task] * SAMPLES * EVALS_PER_TASK
        base_h, pool_h = responses / base[key] / 3600, responses / warm[key] / 3600
        totals[0] += base_h
        totals[1] += pool_h
        print(f"| {task} | {SWEEP[task]} | {responses:,} | {base_h:.2f} | {pool_h:.2f} | {pool_h / args.workers:.2f} |")
    print(f"| total | | | {totals[0]:.2f} | {totals[1]:.2f} | {totals[1] / args.workers:.2f} |")


# --------------------------------------------------------------------------- agreement


def agreement(args: argparse.Namespace) -> None:
    def gsm8k(rows):
        return [(i, r["answer"], r["answer"].split("####")[-1].strip().replace(",", "")) for i, r in enumerate(rows)]

    sets = [
        ("MATH train", MATH, [(r["unique_id"], r["solution"], r["answer"]) for r in load("math/train.jsonl")]),
        ("MATH test", MATH, [(r["unique_id"], r["solution"], r["answer"]) for r in load("math/test.jsonl")]),
        ("MATH-500", "HuggingFaceH4/MATH-500",
         [(r["unique_id"], r["solution"], r["answer"]) for r in load("math500/test.jsonl")]),
        ("GSM8K train", GSM8K, gsm8k(load("gsm8k/train.jsonl"))),
        ("GSM8K test", GSM8K, gsm8k(load("gsm8k/test.jsonl"))),
        ("AIME 2024", AIME, [(r["id"], r["solution"], r["answer"]) for r in load("aime24/test.jsonl")]),
    ]
    print("| dataset | rows | score() agrees | Math-Verify alone agrees | seconds (MV alone) | failures |")
    print("|---|---|---|---|---|---|")
    for name, source, rows in sets:
        prod_fail, mv_fail = Counter(), Counter()
        started = time.perf_counter()
        for row_id, solution, truth in rows:
            if not truth.strip():
                prod_fail[f"{row_id}: empty gold"] += 1
                mv_fail[f"{row_id}: empty gold"] += 1
                continue
            if verify.score(source, solution, truth) != 1.0:
                prod_fail[f"{row_id}: {verify.extract_answer(source, solution)!r} vs {truth!r}"] += 1
            if verify.family(source) == verify.MATH:
                answer = verify.extract_answer(source, solution)
                key = (compare.BOXED, verify.normalize_answer(truth), answer, verify.DEFAULT_TIMEOUT_S)
                if answer is None or compare.run_key(key) != 1.0:
                    mv_fail[f"{row_id}: {answer!r}"] += 1
        seconds = time.perf_counter() - started
        n = len(rows)
        mv = "n/a (no Math-Verify)"
        if verify.family(source) == verify.MATH:
            mv = f"{100 * (1 - sum(mv_fail.values()) / n):.2f}%"
        failures = "; ".join(sorted(set(prod_fail) | set(mv_fail))) or "-"
        accuracy = 100 * (1 - sum(prod_fail.values()) / n)
        print(f"| {name} | {n} | {accuracy:.2f}% | {mv} | {seconds:.1f} | {failures} |", flush=True)


# --------------------------------------------------------------------------- A/B against a revision

_AB_CHILD = """
import json, pickle, sys, time
sys.path.insert(0, sys.argv[1])
from sympy.core.cache import clear_cache
from repexp import verify
batch, warm = pickle.load(open(sys.argv[2], "rb"))
verify.warm_up()
verify.score_batch(*zip(*warm), workers=1)
verify.clear_caches()
clear_cache()
sources, responses, truths = (list(x) for x in zip(*batch))
started = time.process_time()
scores = verify.score_batch(sources, responses, truths, workers=1)
print(json.dumps({"cpu": time.process_time() - started, "accuracy": float(sum(scores)) / len(scores)}))
"""


def compare_revision(args: argparse.Namespace) -> None:
    import pickle
    import subprocess
    import tempfile

    rng = np.random.default_rng(args.seed)
    rows = load("math/test.jsonl")
    order = rng.permutation(len(rows))
    batch = realistic_math(args.problems, args.samples, rng, rows=[rows[i] for i in order[: args.problems]])
    warm_rows = [rows[i] for i in order[args.problems : args.problems + args.warm_problems]]
    warm = realistic_math(args.warm_problems, 8, rng, rows=warm_rows)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev, "repexp"], check=True,
                                 capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        data = Path(tmp) / "batch.pkl"
        data.write_bytes(pickle.dumps((batch, warm)))
        runs: dict[str, list[dict]] = {args.rev: [], "this checkout": []}
        for _ in range(args.repeats):
            for name, root in ((args.rev, old), ("this checkout", ROOT)):
                out = subprocess.run([sys.executable, "-c", _AB_CHILD, str(root), str(data)], check=True,
                                     capture_output=True, text=True)
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load_now = os.getloadavg()[0]
    print(f"MATH test ({args.problems}x{args.samples}) = {len(batch)} responses, score_batch in-process, caches cold, "
          f"{args.repeats} alternating runs each; load average {load_now:.1f}\n")
    print("| code | responses/CPU-s per run | median | accuracy |")
    print("|---|---|---|---|")
    medians = {}
    for name, results in runs.items():
        rates = sorted(len(batch) / r["cpu"] for r in results)
        medians[name] = rates[len(rates) // 2]
        print(f"| {name} | {', '.join(f'{x:,.0f}' for x in rates)} | {medians[name]:,.0f} | "
              f"{results[0]['accuracy']:.4f} |")
    print(f"\nratio (this checkout / {args.rev}, medians): {medians['this checkout'] / medians[args.rev]:.2f}x")


# --------------------------------------------------------------------------- agreement study


CORPUS = ROOT / "tests" / "data" / "agreement_corpus.jsonl"
TASK_NAMES = {"math": "MATH", "gsm8k": "GSM8K", "aime": "AIME 2024"}


def study(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    sources, responses, truths = ([r[key] for r in rows] for key in ("data_source", "response", "ground_truth"))
    graders = {
        "repexp": verify.score_batch(sources, responses, truths, workers=1),
        "paper": verify.score_batch(sources, responses, truths, workers=1, grader="paper"),
        "Math-Verify": np.array([compare.run_key((compare.WHOLE, t, r, verify.DEFAULT_TIMEOUT_S))
                                 for r, t in zip(responses, truths)]),
    }
    labels = np.array([r["label"] for r in rows])
    clear = np.array([r["clear"] for r in rows])
    print(f"{len(rows)} labelled responses ({int(clear.sum())} clear-cut)\n")
    print("| task | clear-cut items | " + " | ".join(f"{g} accuracy" for g in graders) + " |")
    print("|---|---|" + "---|" * len(graders))
    for task, name in list(TASK_NAMES.items()) + [(None, "all")]:
        mask = clear & (np.array([r["task"] == task for r in rows]) if task else True)
        cells = []
        for g in graders:
            right = graders[g][mask] == labels[mask]
            cells.append(f"{right.mean():.4f} ({int((~right).sum())} wrong)")
        print(f"| {name} | {int(mask.sum())} | " + " | ".join(cells) + " |")
    unclear = ~clear
    print(f"\nnot clear-cut ({int(unclear.sum())}): scored correct by " + ", ".join(
        f"{g} {int(graders[g][unclear].sum())}" for g in graders) + " (all are labelled correct)")
    print("\ndisagreements with the labels on clear-cut items, by construction rule:\n")
    print("| grader | task | rule | label | items |")
    print("|---|---|---|---|---|")
    for g, scores in graders.items():
        classes = Counter((r["task"], r["rule"], r["label"]) for r, s, c in zip(rows, scores, clear)
                          if c and s != r["label"])
        for (task, rule, label), count in sorted(classes.items()):
            print(f"| {g} | {TASK_NAMES[task]} | {rule} | {label} | {count} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--problems", type=int, default=40)
    t.add_argument("--samples", type=int, default=256)
    t.add_argument("--warm-problems", type=int, default=100)
    t.add_argument("--distinct", type=int, default=1500)
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--seed", type=int, default=0)
    sub.add_parser("agreement")
    sub.add_parser("study")
    c = sub.add_parser("compare")
    c.add_argument("--rev", required=True, help="git revision whose repexp package is the baseline")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--problems", type=int, default=40)
    c.add_argument("--samples", type=int, default=256)
    c.add_argument("--warm-problems", type=int, default=100)
    c.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    {"throughput": throughput, "agreement": agreement, "study": study, "compare": compare_revision}[args.mode](args)


if __name__ == "__main__":
    main()
