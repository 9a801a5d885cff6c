"""The fourth design's registered analysis (repexp.aggregate.prereg; docs/pilot.md, "Fourth design:
pre-registration"): every statistic on small inputs computed by hand, the verdicts and the positive control,
and the aggregate writing it, pooling the parts of a sweep split by `sweep.part`."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from test_aggregate import log_linear, write_eval

from repexp import aggregate, cli
from repexp import config as C
from repexp import metrics as M
from repexp.aggregate import prereg
from repexp.methods import label

# --------------------------------------------------------------------------- the t distribution


@pytest.mark.parametrize("x", [-3.0, -1.0, 0.0, 0.5, 2.0, 12.7])
def test_t_cdf_equals_the_closed_forms_of_one_two_and_three_degrees_of_freedom(x):
    assert prereg.t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-12)  # Cauchy
    assert prereg.t_cdf(x, 2) == pytest.approx(0.5 + x / (2 * math.sqrt(2 + x * x)), abs=1e-12)
    s = x / math.sqrt(3)
    assert prereg.t_cdf(x, 3) == pytest.approx(0.5 + (s / (1 + s * s) + math.atan(s)) / math.pi, abs=1e-12)


def test_t_quantiles_are_the_tables():
    assert prereg.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)  # 12.706
    assert prereg.t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), rel=1e-9)  # 4.303
    assert prereg.t_quantile(0.95, 28) == pytest.approx(1.7011, abs=1e-4)  # the seed count's t(0.95, 2n − 2)
    assert prereg.t_quantile(0.975, 28) == pytest.approx(2.0484, abs=1e-4)
    assert prereg.t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------- the comparison


def test_compare_by_hand():
    # method 0.5, 0.7 (mean 0.6, s² 0.02); GRPO three times 0.4 (s² 0): SE = sqrt(0.02/2) = 0.1, df = 3, t = 2
    out = prereg.compare([0.5, 0.7], [0.4, 0.4, 0.4], margin=0.03)
    assert out["d"] == pytest.approx(0.2) and out["se"] == pytest.approx(0.1) and out["df"] == 3
    s = 2 / math.sqrt(3)
    cdf = 0.5 + (s / (1 + s * s) + math.atan(s)) / math.pi
    assert out["p_difference"] == pytest.approx(2 * (1 - cdf), abs=1e-12)  # 0.139
    half = prereg.t_quantile(0.975, 3) * 0.1
    assert (out["t_lo"], out["t_hi"]) == pytest.approx((0.2 - half, 0.2 + half))
    # far outside the margin: TOST's upper test cannot reject
    assert out["p_equivalence"] > 0.5


def test_tost_is_the_larger_one_sided_p():
    # d = 0.02, SE = sqrt(0.0002/2) = 0.01, df = 2, margin 0.03: t(lower) = 5, t(upper) = −1
    out = prereg.compare([0.01, 0.03], [0.0, 0.0], margin=0.03)
    p_lower = 1 - (0.5 + 5 / (2 * math.sqrt(27)))  # 0.0189
    p_upper = 0.5 - 1 / (2 * math.sqrt(3))  # 0.2113
    assert out["p_equivalence"] == pytest.approx(max(p_lower, p_upper), abs=1e-12)
    # the same difference measured ten times as precisely is equivalent
    tight = prereg.compare([0.019, 0.021], [-0.001, 0.001], margin=0.03)
    assert tight["p_equivalence"] < 0.05 and tight["d"] == pytest.approx(0.02)
    # one seed in an arm: nothing to test
    assert math.isnan(prereg.compare([0.5], [0.4, 0.5], margin=0.03)["p_equivalence"])


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → non-decreasing: 0.04 → 0.06
    assert prereg.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = prereg.holm([math.nan, 0.02, 0.04])  # NaN does not count: m = 2
    assert math.isnan(adjusted[0]) and adjusted[1:] == pytest.approx([0.04, 0.04])
    assert prereg.holm([0.6, 0.9]) == [1.0, 1.0]  # capped at 1


def test_seed_bootstrap_interval_by_hand():
    # equal seeds within each arm: every replicate is the difference itself
    assert prereg.seed_bootstrap_interval([0.6, 0.6], [0.5, 0.5]) == pytest.approx((0.1, 0.1))
    # method seeds 0 and 1: its resampled mean is 0, 0.5, 1 with probability 1/4, 1/2, 1/4 → [0, 1]
    assert prereg.seed_bootstrap_interval([0.0, 1.0], [0.0, 0.0]) == pytest.approx((0.0, 1.0))
    # both arms 0 and 1, resampled independently: a difference of −1 has probability 1/16 > 2.5 %
    assert prereg.seed_bootstrap_interval([0.0, 1.0], [0.0, 1.0]) == pytest.approx((-1.0, 1.0))
    lo, hi = prereg.seed_bootstrap_interval([0.5], [0.4, 0.6])
    assert math.isnan(lo) and math.isnan(hi)


def test_the_seed_bootstrap_is_narrower_than_the_t_interval_as_documented():
    """Half-width about z · sqrt((n − 1)/n) · SE: 0.925 of the t interval's at 15 seeds per arm, 0.58 at 3."""
    rng = np.random.default_rng(3)
    for n, expected in ((15, math.sqrt(14 / 15) * 1.95996 / prereg.t_quantile(0.975, 28)),
                        (3, math.sqrt(2 / 3) * 1.95996 / prereg.t_quantile(0.975, 4))):
        ratios = []
        for _ in range(20):
            a, b = rng.normal(0.9, 0.033, n), rng.normal(0.9, 0.020, n)
            lo, hi = prereg.seed_bootstrap_interval(a, b, replicates=4000)
            out = prereg.compare(a, b)
            ratios.append((hi - lo) / (out["t_hi"] - out["t_lo"]))
        assert np.mean(ratios) == pytest.approx(expected, abs=0.06), n
    assert 0.92 <= math.sqrt(14 / 15) * 1.95996 / prereg.t_quantile(0.975, 28) <= 0.93


# --------------------------------------------------------------------------- units, verdicts, the control


def test_training_measures_by_hand():
    rows = [{"step": 0, "dev/pass_at_1": 0.1}]  # a validation record is not a training step
    entropy = [2.0, 1.0, 0.5, 0.3, 0.2, 0.1, 0.1, 0.05]
    for step, e in enumerate(entropy, start=1):
        row = {"step": step, M.POLICY_ENTROPY: e, M.DISTINCT_ANSWERS: float(step)}
        if step in (2, 5):  # logged only where a group was all correct
            row[M.ALL_CORRECT_IDENTICAL_FRACTION] = 0.25 if step == 2 else 0.75
        rows.append(row)
    out = prereg.training_measures(rows)
    assert out["entropy"] == pytest.approx((0.3 + 0.2 + 0.1 + 0.1 + 0.05) / 5)
    assert out["distinct_answers"] == pytest.approx((4 + 5 + 6 + 7 + 8) / 5)
    assert out["all_correct_identical"] == pytest.approx(0.5)
    assert math.isnan(prereg.training_measures([{"step": 1}])["entropy"])


def _unit_table(shift: dict[str, float], n: int = 15, sd: float = 0.02, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    points = {"grpo": ("grpo", "GRPO"), "repexp": ("repexp_k32_b0.01", "RepExp"), "passk": ("passk_k4", "pass@k"),
              "outcome": ("outcome_historical_c1", "Outcome"), "cov": ("kl_cov_r0.002", "KL-Cov")}
    rows = []
    for method, (point, name) in points.items():
        for s in range(n):
            value = 0.9 + shift.get(method, 0.0) + rng.normal(0, sd)
            rows.append({"task": "arith-mid", "backend": "trl", "method": method, "point": point, "label": name,
                         "seed": 101 + s, "run": f"trl_{point}_s{101 + s}", "pass_at_256": value,
                         "pass_at_1": value - 0.15, "testtime_log2_ratio": rng.normal(0, 1),
                         "testtime_log2_ratio_no_center": rng.normal(0.5 if method == "repexp" else 0, 0.1),
                         "distinct_answers": 1.5, "entropy": 0.05 + 0.01 * rng.random(),
                         "all_correct_identical": 0.6 - (0.2 if method == "repexp" else 0.0) + rng.normal(0, 0.01)})
    rows.append({"task": "arith-mid", "backend": None, "method": "base", "point": "base", "label": "Base model",
                 "seed": None, "run": "base", "pass_at_256": 0.83, "pass_at_1": 0.02})
    return pd.DataFrame(rows)


def test_the_analysis_decides_each_comparison_and_the_positive_control():
    result = prereg.analyse(_unit_table({"passk": 0.05, "cov": -0.06}), replicates=2000)
    (stratum,) = result["strata"]
    rows = {r["method"]: r for r in stratum["measures"]["pass_at_256"]["comparisons"]}
    assert set(rows) == {"repexp", "passk", "outcome", "cov"}
    assert rows["passk"]["verdict"] == "higher than GRPO"
    assert rows["cov"]["verdict"] == "lower than GRPO"
    assert rows["repexp"]["verdict"] == "equivalent to GRPO within ±0.03"
    # Holm: the adjusted p is at least the raw one and the family has four members
    for row in rows.values():
        assert row["p_difference_holm"] >= row["p_difference"] and row["p_equivalence_holm"] >= row["p_equivalence"]
    smallest = min(rows.values(), key=lambda r: r["p_difference"])
    assert smallest["p_difference_holm"] == pytest.approx(min(1.0, 4 * smallest["p_difference"]))
    assert stratum["positive_control"]["sensitive"] is True
    assert "can show a coverage gain" in stratum["positive_control"]["statement"]
    # secondary: the identical share compares RepExp only; the others every method, with no margin
    identical = stratum["measures"]["all_correct_identical"]["comparisons"]
    assert [r["method"] for r in identical] == ["repexp"] and identical[0]["verdict"] == "lower than GRPO"
    assert math.isnan(identical[0]["p_equivalence"])
    assert len(stratum["measures"]["entropy"]["comparisons"]) == 4
    no_center = {r["method"]: r["verdict"] for r in stratum["measures"]["testtime_log2_ratio_no_center"]["comparisons"]}
    assert no_center == {"repexp": "higher than GRPO", "passk": "no difference shown", "outcome": "no difference shown",
                         "cov": "no difference shown"}
    # a variant the test-time stage did not compute: every comparison says so
    assert {r["verdict"] for r in stratum["measures"]["testtime_log2_ratio_random_first"]["comparisons"]} == {
        "not computed (fewer than 2 seeds with a value in an arm)"}
    assert stratum["grpo_collapse"] == {**stratum["grpo_collapse"], "below": 15, "seeds": 15}
    assert result["base"] == [{"task": "arith-mid", "pass_at_256": 0.83, "pass_at_1": 0.02}]
    text = prereg.render_markdown(result)
    assert f"**Positive control.** {label('passk')} beat GRPO at pass@256" in text
    assert "| RepExp | 15 |" in text and "equivalent to GRPO within ±0.03" in text
    json.loads(prereg.render_json(result))  # strict JSON (NaN as null)


def test_a_positive_control_that_does_not_beat_grpo_makes_repexps_result_no_evidence():
    result = prereg.analyse(_unit_table({}), replicates=500)
    control = result["strata"][0]["positive_control"]
    assert control["sensitive"] is False
    assert "no demonstrated sensitivity" in control["statement"]
    assert "RepExp's result is not evidence either way" in control["statement"]
    assert "not evidence either way" in prereg.render_markdown(result)


# --------------------------------------------------------------------------- the aggregate writes it; parts pool


def _parts_config(tmp_path, part):
    config = tmp_path / f"cfg{part}.yaml"
    config.write_text(f"results_dir: {tmp_path}\nsweep: {{tasks: [math], backends: [verl], methods: {{grpo: {{}}, "
                      f"passk: {{passk_k: [4]}}}}, seeds: [1, 2, 3, 4], parts: 2, part: {part}}}\n")
    return config


def test_each_part_of_a_split_sweep_pools_every_part_found_in_the_results_directory(tmp_path, capsys):
    evals = tmp_path / "eval"
    cfg = C.load(_parts_config(tmp_path, 2))
    assert C.seed_parts(cfg) == [[1, 2], [3, 4]]
    assert [s.name for s in C.part_runs(cfg)] == ["verl_grpo_s3", "verl_passk_k4_s3", "verl_grpo_s4",
                                                   "verl_passk_k4_s4"]
    assert "base" in [s.name for s in C.part_runs(C.load(_parts_config(tmp_path, 1)))]
    for spec in C.part_runs(cfg):  # part 2 has run; part 1 has not yet
        write_eval(evals, "math", spec.name, log_linear(0.5 + (0.05 if spec.method == "passk" else 0)))
    train = tmp_path / "train" / "math" / "verl_passk_k4_s3"
    train.mkdir(parents=True)
    train.joinpath("metrics.jsonl").write_text("\n".join(json.dumps({"step": s, M.POLICY_ENTROPY: 0.5})
                                                         for s in range(1, 4)))
    inputs = [str(evals / "math" / s.name / "eval.json") for s in C.part_runs(cfg)]
    out = tmp_path / "aggregate"
    assert cli.main(["aggregate", "--inputs", *inputs, "--out-dir", str(out), "--config",
                     str(_parts_config(tmp_path, 2))]) == 0
    err = capsys.readouterr().err
    assert "pooled" not in err and "missing run (no eval.json): math/verl_grpo_s1" in err
    md = (out / "preregistered.md").read_text()
    assert md.startswith("# The registered analysis") and "**Incomplete:" in md
    data = json.loads((out / "preregistered.json").read_text())
    assert data["strata"][0]["measures"]["entropy"]["comparisons"][0]["per_seed"]["3"] == 0.5
    # part 1 runs next: its aggregate pools part 2's evaluations from the results directory
    cfg1 = C.load(_parts_config(tmp_path, 1))
    for spec in C.part_runs(cfg1):
        write_eval(evals, "math", spec.name, log_linear(0.4 if spec.method == "base" else 0.5))
    inputs = [str(evals / "math" / s.name / "eval.json") for s in C.part_runs(cfg1)]
    assert cli.main(["aggregate", "--inputs", *inputs, "--out-dir", str(out), "--config",
                     str(_parts_config(tmp_path, 1))]) == 0
    err = capsys.readouterr().err
    assert "sweep.part 1 of 2: pooled 4 runs of the other parts" in err and "missing run" not in err
    assert set(pd.read_csv(out / "pass_at_k.csv").run) == {s.name for s in C.sweep_runs(cfg1)}
    data = json.loads((out / "preregistered.json").read_text())
    assert data["missing"] == [] and data["strata"][0]["n_grpo"] == 4
    assert aggregate.pooled_parts(C.PipelineConfig(), []) == []  # no part: nothing pooled


def test_the_part_keys_are_checked_naming_the_key():
    with pytest.raises(C.ConfigError, match="sweep.part: 3 is not one of the sweep's parts 1..2"):
        C.load({"sweep": {"seeds": [1, 2], "parts": 2, "part": 3}})
    with pytest.raises(C.ConfigError, match="sweep.parts: 3 parts of 2 seeds"):
        C.load({"sweep": {"seeds": [1, 2], "parts": 3}})
    cfg = C.load({"sweep": {"seeds": list(range(1, 16)), "parts": 2}})
    assert [len(p) for p in C.seed_parts(cfg)] == [8, 7] and C.part_runs(cfg) == C.sweep_runs(cfg)
    assert [len(p) for p in C.seed_parts(C.load({"sweep": {"seeds": list(range(7)), "parts": 3}}))] == [3, 2, 2]
