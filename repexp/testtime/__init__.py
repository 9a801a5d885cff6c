"""`repexp testtime`: the paper's inference-time exploration on an evaluation's stored samples.

    repexp testtime --eval-dir results/eval/gsm8k/base --model results/models/smollm2 \\
        --out results/testtime/gsm8k/base [--set testtime.sparse_dim=32 bonus.lamb=0.5]
    repexp testtime --config CFG --task gsm8k --run base   # one run of a config, as its testtime rule runs it

Every problem's n samples are put in RepExp order (`repexp.elliptical_order.greedy_order` on the
`features` of the frozen `--model`, with the training bonus's λ and centring); `testtime.json`
compares that order with a random one (`core`). Outputs in `--out`, each written atomically:
`features/` (cached per eval shard: an interrupted run resumes), `order.parquet` (each problem's
order and the bonus of each sample when taken) and `testtime.json` (last: its presence means
complete). See docs/evaluation.md, "Test-time RepExp".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from repexp import layout

__all__ = ["configure_parser", "run"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import config_options

    io = parser.add_argument_group("inputs and outputs (with --task and --run: the workflow's, unless given)")
    io.add_argument("--eval-dir", type=Path,
                    help="an evaluation's output directory (samples/ and eval.json of `repexp eval`)")
    io.add_argument("--model", help="the frozen feature model (the initial policy): HF directory or hub id")
    io.add_argument("--out", type=Path, help="output directory (testtime.json, order, features)")
    io.add_argument("--data", type=Path, help="the evaluated split (default: the path recorded in samples/meta.json)")
    io.add_argument("--task", help="with --run: the run's task")
    io.add_argument("--run", help="a run of --config: order its evaluation as the workflow's testtime rule does")
    config_options(parser, "testtime.sparse_dim=32 bonus.lamb=0.5 bonus.center=false")


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    def build(cfg, **given):
        return jobs.TesttimeJob(config=cfg.testtime, lamb=cfg.bonus.lamb, center=cfg.bonus.center,
                                **{"eval_dir": None, "model": None, "out": None, **given})

    try:
        job = jobs.hand_job("testtime", args, build, eval_dir=args.eval_dir, model=args.model, out=args.out,
                            data=args.data, task=args.task)
        missing = [f"--{name.replace('_', '-')}" for name in ("eval_dir", "model", "out") if getattr(job, name) is None]
        if missing:
            raise ValueError(f"{', '.join(missing)} required (or --task and --run of a config)")
    except ValueError as err:  # a ConfigError names the key
        print(f"testtime: {err}", file=sys.stderr)
        return 2
    return run_job(job).code


def run_job(job):
    """Order one evaluation's samples (`repexp.jobs.TesttimeJob`: the workflow's and `repexp testtime`'s);
    its node logs the `testtime/*` metrics and both orders' pass@k at step = k."""
    from repexp.metrics import testtime_curves, testtime_metrics
    from repexp.stage import StageResult

    try:
        result = testtime(job)
    except (FileNotFoundError, ValueError) as err:
        print(f"testtime: {err}", file=sys.stderr)
        return StageResult(code=2)
    stc = result["samples_to_correct"]
    eff = result["efficiency"]
    shown = ", ".join(f"k={k}: {r:.2f}x" for k, r in zip(eff["reference_k"], eff["ratio"]) if r is not None)
    ratio = "undefined (nothing solved)" if stc["ratio"] is None else f"{stc['ratio']:.3f}"
    print(f"testtime: {result['num_problems']} problems; samples-to-correct random/RepExp = {ratio}; "
          f"efficiency {shown or 'undefined'}; wrote {Path(job.out) / layout.TESTTIME_JSON}", file=sys.stderr)
    return StageResult(metrics=testtime_metrics(result), curves=testtime_curves(result))


def _load_evaluation(eval_dir: Path, data: Path | None):
    """(store, meta, problems, plan) of a complete evaluation, checked against its data file."""
    from repexp.evaluate.problems import load_problems
    from repexp.evaluate.store import SampleStore

    store = SampleStore(eval_dir)
    if store.read_meta() is not None and not (eval_dir / layout.EVAL_JSON).is_file():
        raise FileNotFoundError(f"{eval_dir / layout.EVAL_JSON}: the evaluation is not complete "
                                f"(no {layout.EVAL_JSON})")
    meta, plan = store.read_complete("run `repexp eval` first")
    data_path = Path(data or meta.get("data_path") or "")
    problems = load_problems(data_path, limit=meta["generation"]["num_problems"])
    if problems.data_hash != meta["generation"]["data_hash"] or problems.problem_ids != meta["problem_ids"]:
        raise ValueError(f"{data_path}: its problems differ from the ones {eval_dir} evaluated (data hash mismatch)")
    return store, meta, problems, plan


def testtime(job) -> dict:
    """The test-time ordering of `job` (a `repexp.jobs.TesttimeJob`); writes testtime.json last."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from repexp.elliptical_order import greedy_order, pad_pools
    from repexp.evaluate.engines import resolve_dtype
    from repexp.evaluate.runner import resolve_model
    from repexp.io import atomic_path, write_json_atomic
    from repexp.testtime.features import FeatureSettings, resolve_device, shard_features

    tt = job.config
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / layout.TESTTIME_JSON).unlink(missing_ok=True)  # never a testtime.json that does not match what follows
    model, _ = resolve_model(job.model, None)  # a local directory (checked) or a hub id, as for `repexp eval`
    store, meta, problems, plan = _load_evaluation(Path(job.eval_dir), job.data and Path(job.data))
    device = resolve_device(tt.device)
    settings = FeatureSettings(model=model, sparse_dim=tt.sparse_dim, projection_seed=tt.projection_seed,
                               batch_size=tt.batch_size, dtype=resolve_dtype(tt.dtype, device), device=device)
    started = time.perf_counter()
    per_problem = shard_features(store, problems, plan, settings, out, meta["generation"])
    feature_seconds = time.perf_counter() - started
    # eval.json's assembly checked the samples, but shards may have changed since: name the problem, not a KeyError
    broken = [pid for pid in problems.problem_ids
              if pid not in per_problem or per_problem[pid]["index"] != list(range(len(per_problem[pid]["index"])))]
    if broken:
        raise ValueError(f"{store.dir}: samples of problem {broken[0]!r} are missing or incomplete")
    entries = [per_problem[pid] for pid in problems.problem_ids]

    started = time.perf_counter()
    padded, sizes = pad_pools([e["features"] for e in entries], device=device)
    ordered = greedy_order(padded, sizes, lamb=job.lamb, center=job.center)
    orders = pool_orders(ordered, sizes)
    taken_bonus = [ordered.bonus[g, : int(s)].tolist() for g, s in enumerate(sizes.cpu())]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    order_seconds = time.perf_counter() - started

    table = pa.table({"problem_id": pa.array(problems.problem_ids, pa.string()),
                      "order": pa.array(orders, pa.list_(pa.int32())),
                      "bonus": pa.array(taken_bonus, pa.list_(pa.float64()))})
    with atomic_path(out / layout.ORDER_FILE) as tmp:
        pq.write_table(table, tmp)
    gen = meta["generation"]
    metadata = {
        "task": meta.get("task"), "split": meta.get("split"), "eval_dir": str(job.eval_dir),
        "model_path": gen.get("model_path"), "checkpoint_step": gen.get("checkpoint_step"),
        "data_hash": gen.get("data_hash"), "sampling": gen.get("sampling"),
        "settings": {"feature_model": settings.model, "sparse_dim": settings.sparse_dim,
                     "projection_seed": settings.projection_seed, "lamb": float(job.lamb),
                     "center": job.center, "dtype": settings.dtype, "device": device,
                     "order": "greedy elliptical (repexp.elliptical_order)"},
        "timing_s": {"features": round(feature_seconds, 3), "order": round(order_seconds, 3)},
    }
    result = scored_orders(tt, problems.problem_ids, [e["score"] for e in entries], orders, metadata=metadata)
    if job.config.variants:
        result["variants"] = variant_orders(job, entries, problems, (store, plan, settings, out, gen), padded, sizes)
    write_json_atomic(out / layout.TESTTIME_JSON, result)
    return result


def pool_orders(ordered, sizes) -> list[list[int]]:
    """Each pool's order from `greedy_order`, cut to the pool's size."""
    return [ordered.order[g, : int(s)].tolist() for g, s in enumerate(sizes.cpu())]


def scored_orders(tt, problem_ids, scores, orders, metadata=None) -> dict:
    """`core.testtime_result` of some orders under the job's testtime settings (the main order and each variant)."""
    from repexp.testtime import core

    return core.testtime_result(problem_ids=problem_ids, scores=scores, orders=orders,
                                reference_ks=tt.reference_ks and tuple(tt.reference_ks), bootstrap=tt.bootstrap,
                                bootstrap_seed=tt.bootstrap_seed, metadata=metadata)


VARIANT_KEYS = ("samples_to_correct", "efficiency", "pass_at_k_repexp")  # what testtime.json keeps of a variant


def variant_orders(job, entries, problems, feature_inputs, padded, sizes) -> dict:
    """The further orders of `job.config.variants` (config testtime.variants), each scored as the main one
    (`core.testtime_result`; its samples-to-correct, efficiency and pass@k kept): `random_first`: the first
    sample of each problem drawn at random (`numpy.random.default_rng(projection_seed)`), the rest greedy;
    `no_center`: the features not centred; `own_features`: the evaluated model's features (the eval's
    model_path; cached under `own_features/` beside the main ones), with the job's centring."""
    import dataclasses as dc

    import numpy as np

    from repexp.elliptical_order import greedy_order, pad_pools
    from repexp.testtime.features import shard_features

    store, plan, settings, out, gen = feature_inputs
    scores = [e["score"] for e in entries]
    found = {}
    tt = job.config
    for name in tt.variants:
        features, center, first, model = padded, job.center, None, settings.model
        if name == "random_first":
            rng = np.random.default_rng(tt.projection_seed)
            first = [int(rng.integers(0, int(s))) if int(s) else 0 for s in sizes.cpu()]
        elif name == "no_center":
            center = False
        elif name == "own_features":
            model = gen.get("model_path") or settings.model
            if Path(model).resolve() != Path(settings.model).resolve():  # the base model: its own features
                own = shard_features(store, problems, plan, dc.replace(settings, model=model),
                                     out / "own_features", gen)
                features, _ = pad_pools([own[pid]["features"] for pid in problems.problem_ids],
                                        device=settings.device)
        else:
            raise ValueError(f"testtime variant {name!r}: not one of random_first, no_center, own_features")
        ordered = greedy_order(features, sizes, lamb=job.lamb, center=center, first=first)
        scored = scored_orders(tt, problems.problem_ids, scores, pool_orders(ordered, sizes))
        found[name] = {"feature_model": model, "center": center, "random_first": first is not None,
                       **{key: scored[key] for key in VARIANT_KEYS}}
    return found

