"""Sharded, resumable generation + verification, `eval.json` assembly and rescoring.

Grading: every sample is scored when its shard is generated, under the run's grader
(the job's `grader`, the config's top-level `grader`); the shard's `score`/`answer` columns hold that
grader's result and `samples/meta.json` records which grader it was (`grader`). A resumed run
under another grader first re-grades the complete shards (no generation). When `eval.json` is
assembled, every stored response is also scored under the *other* grader (no generation), so each
eval.json carries both curves (`graders`) and how often the two graders agree (`grader_agreement`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from repexp import layout
from repexp.evaluate import core
from repexp.evaluate.core import SamplingSettings
from repexp.evaluate.engines import EngineOptions
from repexp.evaluate.problems import Problems, load_problems
from repexp.evaluate.store import SampleStore
from repexp.io import read_json, write_json_atomic
from repexp.verify.routing import DEFAULT_GRADER, GRADERS, check_grader

EVAL_JSON = layout.EVAL_JSON


@dataclasses.dataclass(frozen=True)
class EvalRun:
    """One evaluation as the sampler runs it: its job (repexp.jobs.EvalJob: the eval section, paths, seed,
    grader, a hand run's limits) and what is resolved from the job once, before any store or engine exists."""

    job: Any
    model_path: str
    checkpoint_step: int | None
    engine: str  # resolved: "hf" | "vllm"
    settings: SamplingSettings
    options: EngineOptions

    @classmethod
    def of(cls, job) -> EvalRun:
        from repexp.evaluate.engines import resolve_engine

        if job.data is None:
            raise ValueError("--data is required (unless --rescore)")
        ev = job.config
        model_path, step = resolve_model(job.model, job.model_pointer)
        settings = SamplingSettings(n=ev.n_samples, temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k,
                                    max_new_tokens=ev.max_new_tokens, seed=job.seed)
        options = EngineOptions(
            batch_size=ev.batch_size, dtype=ev.dtype, tensor_parallel_size=ev.tensor_parallel_size,
            gpu_memory_utilization=ev.gpu_memory_utilization, kv_cache_gib=ev.kv_cache_gib,
            max_model_len=ev.max_model_len, enforce_eager=ev.enforce_eager, enable_prefix_caching=ev.prefix_caching,
            max_num_seqs=ev.max_num_seqs, max_num_batched_tokens=ev.max_num_batched_tokens,
            enable_chunked_prefill=ev.chunked_prefill)
        return cls(job=job, model_path=model_path, checkpoint_step=step if job.checkpoint_step is None
                   else job.checkpoint_step, engine=resolve_engine(ev.engine), settings=settings, options=options)

    @property
    def grader(self) -> str:
        return self.job.grader or DEFAULT_GRADER


def resolve_model(model: str | None, pointer: str | Path | None) -> tuple[str, int | None]:
    """(model path or hub id, checkpoint step) from --model or a model pointer JSON."""
    if (model is None) == (pointer is None):
        raise ValueError("give exactly one of --model and --model-pointer")
    step = None
    if pointer is not None:
        data = read_json(pointer)
        if not isinstance(data, dict) or "model_path" not in data:
            raise ValueError(f"{pointer}: a model pointer needs the key 'model_path'")
        model = str(data["model_path"])
        step = data.get("checkpoint_step")
        if not Path(model).exists():
            hint = " (run `repexp merge` first)" if data.get("needs_merge") else ""
            raise FileNotFoundError(f"{pointer}: model_path {model} does not exist{hint}")
    assert model is not None
    path = Path(model)
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a Hugging Face model directory (no config.json)")
        model = str(path.resolve())
    elif model.startswith((".", "/")) or model.count("/") != 1:
        raise FileNotFoundError(f"{model}: model directory not found (and not a hub id like org/name)")
    if step is None:
        step = layout.step_in_path(model)  # `…/global_step_<N>/…` → N; None for a base model
    return model, None if step is None else int(step)


def evaluate(cfg: EvalRun) -> dict[str, Any] | None:
    """Generate the missing shards, then write `eval.json`. Returns it, or None if stopped early."""
    job, ev, data_path = cfg.job, cfg.job.config, Path(cfg.job.data)
    problems = load_problems(data_path, limit=job.limit)
    plan = core.shard_plan(len(problems), ev.shard_size, cfg.settings.seed)
    store = SampleStore(job.out)
    meta = {
        "format": core.STORE_FORMAT,
        "generation": {  # what determines the samples: a resumed run must match it exactly
            "model_path": cfg.model_path,
            "checkpoint_step": cfg.checkpoint_step,
            "data_hash": problems.data_hash,
            "num_problems": len(problems),
            "sampling": dataclasses.asdict(cfg.settings),
            "shard_size": ev.shard_size,
            "engine": cfg.engine,
            # hf samples depend on how sequences share a generate call
            **({"batch_size": cfg.options.batch_size} if cfg.engine == "hf" else {}),
        },
        "num_shards": len(plan),
        "task": job.task or data_path.parent.name,
        "split": job.split or data_path.stem,
        "data_path": str(data_path),
        "engine_options": dataclasses.asdict(cfg.options),
        "problem_ids": problems.problem_ids,
        "grader": cfg.grader,
    }
    done = set(store.open(meta, overwrite=job.overwrite, shard_rows=[len(idx) * cfg.settings.n for idx in plan]))
    eval_path = Path(job.out) / EVAL_JSON
    eval_path.unlink(missing_ok=True)  # rewritten below only when every shard reads back: never a stale one
    if done:
        regrade(store, sorted(done), cfg.grader, ev.verifier_workers)
    todo = [i for i in range(len(plan)) if i not in done]
    if job.max_shards is not None:
        todo = todo[: max(0, job.max_shards - len(done))]
    if todo:
        print(f"eval: {len(done)}/{len(plan)} shards complete; generating {len(todo)} with the {cfg.engine} engine",
              file=sys.stderr)
        if ev.data_parallel_size > 1:
            _generate_data_parallel(cfg, problems, plan, todo)
        else:
            generate_shards(cfg, problems, plan, todo)
    complete = store.complete_shards()
    if len(complete) < len(plan):
        print(f"eval: stopped with {len(complete)}/{len(plan)} shards complete; rerun to resume", file=sys.stderr)
        return None
    result = _assemble(store, problems.problem_ids, plan, _metadata(meta), ks=ev.ks, maj_draws=ev.maj_draws,
                       grader=cfg.grader, workers=ev.verifier_workers)
    write_json_atomic(eval_path, result)
    timings = [read_json(p) if (p := store.timing_path(i)).exists() else {} for i in range(len(plan))]
    seconds = sum(float(t.get("generation_seconds", 0)) for t in timings)
    samples = sum(float(t.get("num_samples", 0)) for t in timings)
    if seconds > 0:
        print(f"eval: {int(samples)} samples, {seconds:.1f} s generation, {samples / seconds:.2f} samples/s",
              file=sys.stderr)
    return result


def _metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """eval.json's run keys, from a store's meta.json (a fresh run's or a rescored one's)."""
    from importlib import metadata

    try:
        math_verify = metadata.version("math-verify")
    except metadata.PackageNotFoundError:
        math_verify = None
    gen = meta["generation"]
    return {
        **{key: gen[key] for key in ("model_path", "checkpoint_step", "engine")},
        "sampling": gen["sampling"] | {"shard_size": gen["shard_size"]}
        | ({"batch_size": gen["batch_size"]} if "batch_size" in gen else {}),
        "seed": gen["sampling"]["seed"],
        "data_hash": gen["data_hash"],
        **{key: meta.get(key) for key in ("data_path", "task", "split")},
        "verifier": {"module": "repexp.verify", "math_verify": math_verify},
    }


def _score(data_sources, responses, ground_truths, workers, grader: str) -> tuple[list[float], list[str | None]]:
    """Scores and maj@k voting keys of stored or fresh responses under `grader`."""
    from repexp import verify

    scores = verify.score_batch(data_sources, responses, ground_truths, workers=workers, grader=grader)
    answers = [verify.extract_answer(src, text, grader=grader) for src, text in zip(data_sources, responses)]
    return [float(s) for s in scores], answers


def other_grader(grader: str) -> str:
    """The grader whose pass@k eval.json reports beside the run's own."""
    return next(g for g in GRADERS if g != check_grader(grader))


def stored_grader(meta: dict[str, Any]) -> str:
    """The grader of a store's `score` column (stores written before graders existed: repexp)."""
    return meta.get("grader") or DEFAULT_GRADER


def regrade(store: SampleStore, shards, grader: str, workers: int | None, *, always: bool = False) -> None:
    """Re-score complete shards under `grader` (no generation) when the store holds another grader's scores,
    or `always` (rescore). `meta.json` names the new grader only after every shard is rewritten, so an
    interrupted re-grade is redone in full on the next run."""
    meta = store.read_meta() or {}
    if not always:
        if stored_grader(meta) == grader:
            return
        print(f"eval: re-grading {len(shards)} stored shards from {stored_grader(meta)} to {grader}", file=sys.stderr)
    (store.dir.parent / EVAL_JSON).unlink(missing_ok=True)  # never beside scores of another grader
    for i in shards:
        rows = store.read_shard(i)
        rows["score"], rows["answer"] = _score(rows["data_source"], rows["response"], rows["ground_truth"], workers,
                                               grader)
        store.write_shard(i, rows)
    if stored_grader(meta) != grader:
        write_json_atomic(store.meta_path, {**meta, "grader": grader})


def generate_shards(cfg: EvalRun, problems: Problems, plan, shard_indices: list[int], rank: int = 0,
                    devices: list[str] | None = None) -> None:
    """Generate, verify and store the given shards of `plan` (one engine, this process: a data-parallel worker's
    on its `devices`)."""
    if devices is not None:  # before torch/vllm are imported in this fresh (spawned) process
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    from tqdm.auto import tqdm

    from repexp.evaluate.engines import encode_prompts, generate_samples, load_engine

    store, seed, ev = SampleStore(cfg.job.out), cfg.settings.seed, cfg.job.config
    total = sum(len(plan[i]) for i in shard_indices) * cfg.settings.n
    engine = load_engine(cfg.engine, cfg.model_path, cfg.options, seed=cfg.settings.seed)
    try:
        bar = tqdm(total=total, unit="sample", desc=f"eval[{rank}]" if ev.data_parallel_size > 1 else "eval",
                   position=rank, disable=cfg.job.no_progress, dynamic_ncols=True, mininterval=1.0)
        for i in shard_indices:
            idx = [int(j) for j in plan[i]]
            started = time.perf_counter()
            prompt_ids = encode_prompts(engine.tokenizer, [problems.prompts[j] for j in idx])
            completions = generate_samples(engine, prompt_ids, cfg.settings, shard_seed=core.derived_seed(seed, i),
                                           prompt_seeds=[core.derived_seed(seed, i, j) for j in range(len(idx))],
                                           progress=bar.update)
            generation_seconds = time.perf_counter() - started
            samples = [(problems.problem_ids[j], s, c.text, c.num_tokens, c.finish_reason, problems.data_sources[j],
                        problems.ground_truths[j]) for j, row in zip(idx, completions) for s, c in enumerate(row)]
            rows = dict(zip(("problem_id", "sample_index", "response", "num_tokens", "finish_reason", "data_source",
                             "ground_truth"), map(list, zip(*samples))))
            scoring_started = time.perf_counter()
            rows["score"], rows["answer"] = _score(rows["data_source"], rows["response"], rows["ground_truth"],
                                                   ev.verifier_workers, cfg.grader)
            store.write_shard(i, rows)
            scoring_seconds = time.perf_counter() - scoring_started
            write_json_atomic(store.timing_path(i), {"engine": engine.name, "num_samples": len(rows["response"]),
                                                     "generation_seconds": round(generation_seconds, 3),
                                                     "scoring_seconds": round(scoring_seconds, 3)})
            bar.set_postfix(shard=i, refresh=False)
        bar.close()
    finally:
        engine.close()


def _generate_data_parallel(cfg: EvalRun, problems: Problems, plan, todo: list[int]) -> None:
    """One engine per process, each on its own `tensor_parallel_size` GPUs, shards dealt round-robin."""
    import multiprocessing

    import torch

    dp, tp = cfg.job.config.data_parallel_size, cfg.options.tensor_parallel_size
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if gpus and len(gpus) < dp * tp:
        raise ValueError(f"data_parallel_size {dp} × tensor_parallel_size {tp} needs {dp * tp} GPUs; "
                         f"{len(gpus)} visible")
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=generate_shards, name=f"repexp-eval-{rank}",
                           args=(cfg, problems, plan, todo[rank::dp], rank, gpus[rank * tp : (rank + 1) * tp] or None))
               for rank in range(min(dp, len(todo)))]  # a rank without shards gets no process
    for proc in workers:
        proc.start()
    for proc in workers:
        proc.join()
    failed = [f"{proc.name} (exit {proc.exitcode})" for proc in workers if proc.exitcode != 0]
    if failed:
        raise RuntimeError(f"data-parallel generation failed in {', '.join(failed)}; completed shards are kept")


def _read_samples(store: SampleStore, plan, other: str, workers: int | None) -> dict[str, dict[str, list]]:
    """Per problem id: its samples' scores, answers, token counts, truncation flags (checked complete), and
    their scores under the `other` grader, computed here from the stored responses."""
    from repexp import verify

    per_problem: dict[str, dict[str, list]] = {}
    with verify.VerifierPool(workers) as pool:  # its processes start on first use: only for big Math-Verify shards
        for i in range(len(plan)):
            shard = store.read_shard(i)  # every column
            big = len(shard["response"]) >= verify.MIN_POOL_ITEMS
            others = verify.score_batch(shard["data_source"], shard["response"], shard["ground_truth"],
                                        pool=pool if big else None, workers=1, grader=other)
            keys = ("index", "score", "answer", "tokens", "truncated", "other")
            for pid, *values in zip(shard["problem_id"], shard["sample_index"], shard["score"], shard["answer"],
                                    shard["num_tokens"], [f == "length" for f in shard["finish_reason"]],
                                    map(float, others)):
                entry = per_problem.setdefault(pid, {"shard": i, **{key: [] for key in keys}})
                for key, value in zip(keys, values):
                    entry[key].append(value)
    return per_problem


def _grader_keys(ordered: list[dict[str, list]], grader: str, ks) -> dict[str, Any]:
    """eval.json's `grader`, `graders` (both curves) and `grader_agreement` (per-sample agreement)."""
    from repexp import passk

    other = other_grader(grader)
    n = [len(e["score"]) for e in ordered]
    ks = [int(k) for k in ks] if ks is not None else passk.power_of_two_ks(min(n))
    own = [sum(e["score"]) for e in ordered]
    theirs = [sum(e["other"]) for e in ordered]
    pairs = [(a, b) for e in ordered for a, b in zip(e["score"], e["other"])]  # 0/1 scores
    mine_only, other_only = sum(int(a > b) for a, b in pairs), sum(int(a < b) for a, b in pairs)
    return {
        "grader": grader,
        "graders": {grader: core.grader_curve(n, own, ks), other: core.grader_curve(n, theirs, ks)},
        "grader_agreement": {
            "samples": len(pairs),
            "agree_fraction": (len(pairs) - mine_only - other_only) / len(pairs),
            f"{grader}_only_correct": mine_only,
            f"{other}_only_correct": other_only,
        },
    }


def _assemble(store, problem_ids, plan, metadata, *, ks, maj_draws, grader, workers) -> dict[str, Any]:
    per_problem = _read_samples(store, plan, other_grader(grader), workers)
    expected = {problem_ids[int(j)]: i for i, idx in enumerate(plan) for j in idx}
    for pid, shard in expected.items():
        entry = per_problem.get(pid)
        if entry is None or entry["shard"] != shard or sorted(entry["index"]) != list(range(metadata["sampling"]["n"])):
            raise ValueError(f"{store.shard_path(shard)}: samples of problem {pid!r} are missing or incomplete")
    extra = set(per_problem) - set(expected)
    if extra:
        raise ValueError(f"{store.dir}: samples of unknown problems {sorted(extra)[:5]}")
    ordered = [per_problem[pid] for pid in problem_ids]
    return core.eval_result(problem_ids=problem_ids, scores=[e["score"] for e in ordered],
                            answers=[e["answer"] for e in ordered], num_tokens=[e["tokens"] for e in ordered],
                            truncated=[e["truncated"] for e in ordered], ks=ks, maj_draws=maj_draws,
                            metadata={**metadata, **_grader_keys(ordered, grader, ks)})


def rescore(out_dir: str | Path, *, ks=None, maj_draws: int = 1000, verifier_workers: int | None = None,
            grader: str | None = None) -> dict[str, Any]:
    """Re-verify every stored sample with the current verifier and rewrite the shards' scores and `eval.json`.

    `grader`: the grader of the rewritten `score` column (default: the one the store was graded with).
    """
    store = SampleStore(out_dir)
    meta, plan = store.read_complete("nothing to rescore", "; finish the evaluation before rescoring")
    grader = check_grader(grader) if grader is not None else stored_grader(meta)
    regrade(store, range(len(plan)), grader, verifier_workers, always=True)
    result = _assemble(store, meta["problem_ids"], plan, _metadata(meta), ks=ks, maj_draws=maj_draws, grader=grader,
                       workers=verifier_workers)
    write_json_atomic(Path(out_dir) / EVAL_JSON, result)
    return result
