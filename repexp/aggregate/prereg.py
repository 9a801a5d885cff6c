"""The registered analysis of the pilot's fourth design (docs/pilot.md, "Fourth design: pre-registration"),
computed by `repexp aggregate` into `preregistered.md` and `preregistered.json` beside the pass@k table.

The unit is the seed: one trained run gives one value of each measure. Within one task and backend, every
method point other than GRPO is compared with GRPO (the family of the multiple-comparison rule):

- primary, test pass@256 and pass@1 of the evaluated checkpoint: the difference of seed means
  d = mean(method) − mean(GRPO); a seed-bootstrap interval (`seed_bootstrap_interval`: each replicate draws
  each arm's seeds with replacement, the two arms independently); the two-sample t-test of d = 0 and the
  TOST of |d| < MARGIN (`compare`: SE² = s²_m/n_m + s²_g/n_g, df = n_m + n_g − 2, as the seed count's
  calculation assumed); Holm's step-down adjustment over the family (`holm`), per measure and per test;
- the positive control: pass@k training "beats GRPO at pass@256" when its Holm-adjusted difference test
  rejects at ALPHA with d > 0; otherwise the report says the testbed showed no sensitivity and RepExp's
  result is not evidence either way;
- secondary (`SECONDARY`): the same difference test, interval and Holm adjustment, no equivalence margin.

Pure: numpy and pandas (imported where used); the Student t distribution is computed here (no scipy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from repexp import metrics as M
from repexp.io import json_safe
from repexp.methods import BASE, label

MARGIN = 0.03  # the equivalence margin of the primary measures (docs/pilot.md, "Fourth design: seed count")
ALPHA = 0.05  # family-wise, per measure and test (Holm over the methods compared with GRPO)
LEVEL = 0.95  # the intervals
SEED_BOOTSTRAP_REPLICATES = 10_000
SEED_BOOTSTRAP_SEED = 0
LAST_STEPS = 5  # training measures: the mean over the last 5 logged steps (the earlier designs' collapse rule)
COLLAPSE_THRESHOLD = 0.1  # GRPO's entropy over the last 5 steps: the step count's target, checked per seed
BASELINE = "grpo"
POSITIVE_CONTROL = "passk"  # pass@k training: the method expected to beat GRPO at pass@256
PRIMARY = {"pass_at_256": "test pass@256", "pass_at_1": "test pass@1"}
PRIMARY_KS = {"pass_at_256": 256, "pass_at_1": 1}
# secondary measure -> (what it is, the methods compared with GRPO: None = every one)
TESTTIME_VARIANTS = {"random_first": "a random first pick", "no_center": "no centring",
                     "own_features": "the sampling model's own features"}  # config testtime.variants
SECONDARY = {
    "testtime_log2_ratio": ("test-time order: log2 of samples-to-correct, random order / RepExp order", None),
    **{f"testtime_log2_ratio_{name}": (f"test-time order with {what}: log2 of samples-to-correct, random order / "
                                       "that order", None) for name, what in TESTTIME_VARIANTS.items()},
    "distinct_answers": (f"distinct final answers per training group ({M.DISTINCT_ANSWERS}), mean of the last "
                         f"{LAST_STEPS} steps", None),
    "entropy": (f"policy entropy ({M.POLICY_ENTROPY}), mean of the last {LAST_STEPS} steps", None),
    "all_correct_identical": (f"share of all-correct groups whose rollouts are all identical "
                              f"({M.ALL_CORRECT_IDENTICAL_FRACTION}), mean over the steps that logged it",
                              ("repexp",)),
}
MEASURES = (*PRIMARY, *SECONDARY)
UNIT_COLUMNS = ("task", "backend", "method", "point", "label", "seed", "run")

# --------------------------------------------------------------------------- the t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError("incomplete beta: the continued fraction did not converge")


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(x: float, df: float) -> float:
    """P(T ≤ x) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on `t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- the statistics


def _values(x: Sequence[float]):
    import numpy as np

    values = np.asarray(x, dtype=np.float64).reshape(-1)
    return values[np.isfinite(values)]


def seed_bootstrap_interval(method: Sequence[float], grpo: Sequence[float], *,
                            replicates: int = SEED_BOOTSTRAP_REPLICATES, seed: int = SEED_BOOTSTRAP_SEED,
                            level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of mean(method*) − mean(GRPO*), each arm's seeds drawn with replacement (the two
    arms independently) from `numpy.random.default_rng(seed)`, the method's draws first. (NaN, NaN) when an
    arm has fewer than 2 seeds. Its half-width is about z · sqrt((n−1)/n) · SE: narrower than the t
    interval, by 7.5 % at 15 seeds per arm and 42 % at 3 (docs/pilot.md)."""
    import numpy as np

    a, b = _values(method), _values(grpo)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    boot_a = a[rng.integers(0, a.size, size=(replicates, a.size))].mean(axis=1)
    boot_b = b[rng.integers(0, b.size, size=(replicates, b.size))].mean(axis=1)
    lo, hi = np.quantile(boot_a - boot_b, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compare(method: Sequence[float], grpo: Sequence[float], margin: float | None = None, *,
            level: float = LEVEL) -> dict[str, Any]:
    """The seed-level comparison of one method with GRPO: d, SE (SE² = s²_m/n_m + s²_g/n_g), df = n_m + n_g − 2,
    the t interval at `level`, the two-sided p of d = 0 and, with `margin`, the TOST p of |d| < margin
    (the larger of the two one-sided p's: H0 d ≤ −margin, t = (d + margin)/SE; H0 d ≥ margin,
    t = (d − margin)/SE). NaN where an arm has fewer than 2 seeds."""
    a, b = _values(method), _values(grpo)
    out: dict[str, Any] = {"n_method": int(a.size), "n_grpo": int(b.size),
                           "mean_method": float(a.mean()) if a.size else math.nan,
                           "mean_grpo": float(b.mean()) if b.size else math.nan}
    out["d"] = out["mean_method"] - out["mean_grpo"]
    nan = dict.fromkeys(("se", "df", "t_lo", "t_hi", "p_difference", "p_equivalence"), math.nan)
    if a.size < 2 or b.size < 2:
        return {**out, **nan}
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    df = a.size + b.size - 2
    half = t_quantile((1 + level) / 2, df) * se
    out.update(se=se, df=df, t_lo=out["d"] - half, t_hi=out["d"] + half)
    if se == 0.0:  # every seed equal in both arms: the test is decided by d alone
        out["p_difference"] = 1.0 if out["d"] == 0 else 0.0
        out["p_equivalence"] = (0.0 if abs(out["d"]) < margin else 1.0) if margin is not None else math.nan
        return out
    out["p_difference"] = 2.0 * (1.0 - t_cdf(abs(out["d"]) / se, df))
    if margin is not None:
        p_lower = 1.0 - t_cdf((out["d"] + margin) / se, df)
        p_upper = t_cdf((out["d"] - margin) / se, df)
        out["p_equivalence"] = max(p_lower, p_upper)
    else:
        out["p_equivalence"] = math.nan
    return out


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the input order): sorted ascending, the i-th (from 0) of m is
    multiplied by m − i, made non-decreasing, capped at 1. NaN stays NaN and does not count in m."""
    indexed = [(p, i) for i, p in enumerate(pvalues) if not math.isnan(p)]
    indexed.sort()
    m = len(indexed)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(row: Mapping[str, Any], margin: float | None, alpha: float = ALPHA) -> str:
    """The decision of one comparison from its Holm-adjusted p's."""
    parts = []
    if row.get("p_difference_holm", math.nan) < alpha:
        parts.append("higher than GRPO" if row["d"] > 0 else "lower than GRPO")
    if margin is not None and row.get("p_equivalence_holm", math.nan) < alpha:
        parts.append(f"equivalent to GRPO within ±{margin:g}")
    if parts:
        return "; ".join(parts)
    if math.isnan(row.get("p_difference", math.nan)):
        return "not computed (fewer than 2 seeds with a value in an arm)"
    return "inconclusive" if margin is not None else "no difference shown"


# --------------------------------------------------------------------------- the per-seed units


def training_measures(rows: Sequence[Mapping[str, Any]], last: int = LAST_STEPS) -> dict[str, float]:
    """The training measures of one run from its metrics.jsonl records: entropy and distinct answers as the mean
    over the last `last` training steps that logged them, the identical share as the mean over every step that
    logged it (NaN where a metric was never logged)."""
    import numpy as np

    steps = sorted((r for r in rows if int(r.get("step", 0)) >= 1), key=lambda r: int(r["step"]))

    def series(name: str) -> list[float]:
        return [float(r[name]) for r in steps if r.get(name) is not None and math.isfinite(float(r[name]))]

    def tail_mean(name: str) -> float:
        values = series(name)
        return float(np.mean(values[-last:])) if values else math.nan

    identical = series(M.ALL_CORRECT_IDENTICAL_FRACTION)
    return {"entropy": tail_mean(M.POLICY_ENTROPY), "distinct_answers": tail_mean(M.DISTINCT_ANSWERS),
            "all_correct_identical": float(np.mean(identical)) if identical else math.nan}


def units(table, testtime: Mapping[tuple[str, str], Any] | None = None,
          training: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]] | None = None):
    """One row per run (the base model included, with no seed): `UNIT_COLUMNS` and every measure. `table`: the
    tidy pass@k table; `testtime`: {(task, run): TesttimeRun}; `training`: {(task, run): metrics.jsonl records}."""
    import pandas as pd

    out = []
    for (task, run), rows in table.groupby(["task", "run"], sort=False):
        first = rows.iloc[0]
        by_k = dict(zip(rows["k"].astype(int), rows["pass_at_k"].astype(float)))
        unit = {"task": task, "backend": first["backend"], "method": first["method"], "point": first["point"],
                "label": first["label"], "seed": None if pd.isna(first["seed"]) else int(first["seed"]), "run": run,
                **{name: by_k.get(k, math.nan) for name, k in PRIMARY_KS.items()}}
        tt = (testtime or {}).get((task, run))
        ratio = tt.stc.get("ratio") if tt is not None else None
        unit["testtime_log2_ratio"] = math.log2(ratio) if ratio else math.nan
        for name in TESTTIME_VARIANTS:  # NaN where the test-time stage did not compute the variant
            ratio = ((tt.variants.get(name) or {}).get("samples_to_correct") or {}).get("ratio") if tt else None
            unit[f"testtime_log2_ratio_{name}"] = math.log2(ratio) if ratio else math.nan
        unit.update(training_measures((training or {}).get((task, run), ())))
        out.append(unit)
    return pd.DataFrame(out, columns=[*UNIT_COLUMNS, *MEASURES])


# --------------------------------------------------------------------------- the analysis


def analyse(unit_table, *, margin: float = MARGIN, alpha: float = ALPHA, replicates: int = SEED_BOOTSTRAP_REPLICATES,
            seed: int = SEED_BOOTSTRAP_SEED) -> dict[str, Any]:
    """The registered analysis of a unit table (`units`): per task and backend, every comparison with GRPO, its
    Holm adjustment and verdict, the positive control's verdict, and GRPO's collapse check."""
    strata = []
    unit_table = unit_table.reindex(columns=[*UNIT_COLUMNS, *MEASURES])  # a measure not given: NaN
    trained = unit_table[unit_table["method"] != BASE]
    for (task, backend), rows in trained.groupby(["task", "backend"], sort=False):
        grpo = rows[rows["method"] == BASELINE]
        points = [(p, g) for p, g in rows[rows["method"] != BASELINE].groupby("point", sort=False)]
        stratum: dict[str, Any] = {"task": task, "backend": backend, "n_grpo": int(len(grpo)),
                                   "grpo_seeds": sorted(int(s) for s in grpo["seed"].dropna()), "measures": {}}
        for measure in MEASURES:
            is_primary = measure in PRIMARY
            compared = None if is_primary else SECONDARY[measure][1]
            entries = []
            for point, group in points:
                method = str(group["method"].iloc[0])
                if compared is not None and method not in compared:
                    continue
                row = compare(group[measure], grpo[measure], margin if is_primary else None)
                row["bootstrap_lo"], row["bootstrap_hi"] = seed_bootstrap_interval(
                    group[measure], grpo[measure], replicates=replicates, seed=seed)
                row.update(method=method, point=str(point), label=str(group["label"].iloc[0]),
                           seeds=sorted(int(s) for s in group["seed"].dropna()),
                           per_seed={int(s): json_safe(v) for s, v in zip(group["seed"], group[measure])})
                entries.append(row)
            for key in ("p_difference", "p_equivalence"):
                for row, adjusted in zip(entries, holm([r[key] for r in entries])):
                    row[f"{key}_holm"] = adjusted
            for row in entries:
                row["verdict"] = verdict(row, margin if is_primary else None, alpha)
            stratum["measures"][measure] = {
                "what": PRIMARY[measure] if is_primary else SECONDARY[measure][0], "primary": is_primary,
                "grpo_per_seed": {int(s): json_safe(v) for s, v in zip(grpo["seed"], grpo[measure])},
                "grpo_mean": json_safe(grpo[measure].mean()), "comparisons": entries}
        stratum["positive_control"] = positive_control(stratum, alpha)
        entropy = {int(s): json_safe(v) for s, v in zip(grpo["seed"], grpo["entropy"])}
        stratum["grpo_collapse"] = {
            "threshold": COLLAPSE_THRESHOLD, "per_seed": entropy,
            "below": sum(1 for v in entropy.values() if v is not None and v < COLLAPSE_THRESHOLD),
            "seeds": len(entropy)}
        strata.append(stratum)
    base = unit_table[unit_table["method"] == BASE]
    return {"margin": margin, "alpha": alpha, "level": LEVEL, "bootstrap_replicates": replicates,
            "bootstrap_seed": seed, "strata": strata,
            "base": [{"task": r.task, **{m: json_safe(getattr(r, m)) for m in PRIMARY}} for r in base.itertuples()]}


def positive_control(stratum: Mapping[str, Any], alpha: float = ALPHA) -> dict[str, Any]:
    """Whether pass@k training beat GRPO at pass@256 (Holm-adjusted difference test, d > 0), and what the report
    must then say about RepExp's result."""
    rows = [r for r in stratum["measures"]["pass_at_256"]["comparisons"] if r["method"] == POSITIVE_CONTROL]
    if not rows:
        return {"present": False, "sensitive": None,
                "statement": "no pass@k training run: the testbed's sensitivity was not tested"}
    row = rows[0]
    sensitive = bool(row["p_difference_holm"] < alpha and row["d"] > 0)
    statement = (f"{label(POSITIVE_CONTROL)} beat GRPO at pass@256 (d = {row['d']:+.3f}, Holm-adjusted p = "
                 f"{row['p_difference_holm']:.3g}): the testbed can show a coverage gain, and RepExp's result is "
                 "read against that" if sensitive else
                 f"{label(POSITIVE_CONTROL)} did not beat GRPO at pass@256 (d = {row['d']:+.3f}, Holm-adjusted p = "
                 f"{row['p_difference_holm']:.3g}): the testbed has no demonstrated sensitivity, and RepExp's "
                 "result is not evidence either way")
    return {"present": True, "sensitive": sensitive, "point": row["point"], "statement": statement}


# --------------------------------------------------------------------------- the report


def _num(value: Any, digits: int = 3, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _p(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3g}"


def render_markdown(result: Mapping[str, Any], *, missing: Sequence[str] = ()) -> str:
    """`preregistered.md`: the primary table, the positive control's verdict, the secondary measures."""
    lines = ["# The registered analysis (docs/pilot.md, \"Fourth design: pre-registration\")", ""]
    if missing:
        lines += [f"**Incomplete: {len(missing)} run(s) of the config have no evaluation** (e.g. "
                  f"{', '.join(missing[:3])}); the registered analysis is the one over every run.", ""]
    lines += [f"Unit: the seed. Intervals: seed bootstrap ({result['bootstrap_replicates']} replicates, seed "
              f"{result['bootstrap_seed']}, {result['level']:.0%} percentile) and t ({result['level']:.0%}). "
              f"Tests: two-sample t (d = 0) and TOST (|d| < {result['margin']:g}), Holm over the methods compared "
              f"with GRPO, α = {result['alpha']:g} per measure and test.", ""]
    for stratum in result["strata"]:
        lines += [f"## {stratum['task']} / {stratum['backend']} (GRPO seeds: {stratum['n_grpo']})", ""]
        lines += [f"**Positive control.** {stratum['positive_control']['statement']}.", ""]
        collapse = stratum["grpo_collapse"]
        lines += [f"GRPO's entropy over the last {LAST_STEPS} steps below {collapse['threshold']:g}: "
                  f"{collapse['below']} of {collapse['seeds']} seeds.", ""]
        for block in stratum["measures"].values():
            kind = "Primary" if block["primary"] else "Secondary"
            lines += [f"### {kind}: {block['what']}", "",
                      f"GRPO: mean {_num(block['grpo_mean'], 4)} over {stratum['n_grpo']} seeds.", ""]
            if not block["comparisons"]:
                lines += ["(nothing to compare)", ""]
                continue
            head = ["method", "n", "d (method − GRPO)", "seed bootstrap", "t interval", "p (d = 0)", "Holm"]
            if block["primary"]:
                head += ["p (TOST)", "Holm"]
            head += ["verdict"]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for r in block["comparisons"]:
                cells = [r["label"], str(r["n_method"]), _num(r["d"], sign=True),
                         f"[{_num(r['bootstrap_lo'], sign=True)}, {_num(r['bootstrap_hi'], sign=True)}]",
                         f"[{_num(r['t_lo'], sign=True)}, {_num(r['t_hi'], sign=True)}]",
                         _p(r["p_difference"]), _p(r["p_difference_holm"])]
                if block["primary"]:
                    cells += [_p(r["p_equivalence"]), _p(r["p_equivalence_holm"])]
                cells += [r["verdict"]]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
            per_seed = [f"GRPO {', '.join(_num(v) for v in block['grpo_per_seed'].values())}"]
            per_seed += [f"{r['label']} {', '.join(_num(v) for v in r['per_seed'].values())}"
                         for r in block["comparisons"]]
            lines += ["Per seed: " + "; ".join(per_seed) + ".", ""]
    if result["base"]:
        lines += ["## Base model", ""] + [f"- {b['task']}: pass@256 {_num(b['pass_at_256'])}, pass@1 "
                                          f"{_num(b['pass_at_1'])}" for b in result["base"]] + [""]
    return "\n".join(lines)


def render_json(result: Mapping[str, Any], *, missing: Sequence[str] = ()) -> str:
    """`preregistered.json`: the same numbers as `render_markdown`, unrounded (NaN as null)."""
    return json.dumps(json_safe({**result, "missing": list(missing)}), indent=1, allow_nan=False)
