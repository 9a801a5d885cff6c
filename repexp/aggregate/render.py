"""The Markdown and HTML views of `repexp aggregate`'s tables (`pass_at_k.md`, `pass_at_k.html`): seed means
under both graders, k-efficiency, test-time efficiency, per-run values, the definitions and the missing runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from repexp.aggregate.load import TesttimeRun, run_sort_key
from repexp.aggregate.tables import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    HEADLINE_K,
    POINT_KEYS,
    isna,
    point_label,
)
from repexp.verify.routing import DEFAULT_GRADER, GRADERS

K_EFFICIENCY_NOTE = (
    "k-efficiency: each method point (every method but GRPO, with its parameters) vs GRPO of the same task and "
    "backend, on pass@k curves averaged over seeds. "
    "The k grid holds the ks evaluated by every seed of the method point and of GRPO; the reference k "
    f"is the largest grid k ≤ {HEADLINE_K}. Target = GRPO's mean pass@reference_k. "
    "k*_evaluated = the smallest grid k at which the method's mean pass@k ≥ target; k* interpolates linearly "
    "in log2 k between that grid point and the previous one (an upper bound when it is the first grid "
    "point). k_grpo = the same crossing on GRPO's own curve (the reference k unless GRPO saturates earlier). "
    "efficiency = k_grpo / k* (the paper's reference_k / k* when GRPO is not saturated). "
    "\"not reached\": the method's mean pass@reference_k < target; \"undefined\": the target is 0. "
    f"[lo, hi]: {BOOTSTRAP_LEVEL:.0%} percentile interval of a paired bootstrap ({BOOTSTRAP_REPLICATES} replicates, "
    f"seed {BOOTSTRAP_SEED}) that resamples the test problems (the same ones for both methods) and, per method "
    "with ≥ 2 seeds, the seeds; a replicate in which the method misses the target counts as efficiency 0 (its share "
    "is \"missed\"). Δpass@k = method − GRPO (seed means) with the same bootstrap's interval."
)
SEM_NOTE = (
    "pass@k: the unbiased estimator over n samples per problem, averaged over problems. "
    "In seed summaries ± is the standard error of the mean over seeds (ddof 1), shown only with ≥ 2 seeds; "
    "the tidy CSV's `sem` column is the per-run standard error over problems."
)
TESTTIME_NOTE = (
    "Test-time RepExp: each run's stored samples are handed to the verifier in RepExp order (greedy elliptical "
    "bonus w.r.t. the samples already taken, features of the frozen initial policy). samples-to-correct = mean "
    "position of the first correct sample over solved problems (random: (n+1)/(c+1)); ratio = random / RepExp "
    "(> 1: fewer verifier calls), 95% bootstrap interval over problems. eff@k = k / (the smallest k' at which "
    "RepExp-order pass@k' reaches random-order pass@k)."
)


def _fmt(value: Any, digits: int = 3) -> str:
    if isna(value):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_wide(table, value: str = "pass_at_k"):
    """One row per method point (its label names the method and its parameters): the mean over seeds of
    `value` per k as 'mean ± sem' strings (sem: the standard error over seeds, ddof 1, only with ≥ 2 seeds)."""
    import pandas as pd

    ks = sorted(table["k"].unique())
    rows = []
    for key, group in table.groupby(list(POINT_KEYS), dropna=False, sort=False):
        point = dict(zip(POINT_KEYS, key))
        seeds = sorted({int(s) for s in group["seed"].dropna()})
        row = {"task": point["task"], "method": group["label"].iloc[0], "backend": point["backend"] or "–",
               "seeds": ", ".join(map(str, seeds)) or "–", "#seeds": int(group.groupby("k").size().max())}
        for k in ks:
            values = group.loc[group["k"] == k, value].to_numpy(dtype=float)
            n = len(values)
            row[f"pass@{k}"] = ("–" if n == 0 or math.isnan(values.mean()) else f"{values.mean():.3f}"
                                + (f" ± {values.std(ddof=1) / math.sqrt(n):.3f}" if n >= 2 else ""))
        rows.append(row)
    return pd.DataFrame(rows)


def _stc_text(tt: TesttimeRun | None) -> str:
    if tt is None:
        return "–"
    ratio, ci = tt.stc.get("ratio"), tt.stc.get("ratio_ci95")
    if ratio is None:
        return "undefined"
    return f"{ratio:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def per_run_wide(table, testtime: dict[tuple[str, str], TesttimeRun] | None = None):
    import pandas as pd

    ks = sorted(table["k"].unique())
    rows = []
    for run_key, group in table.groupby(["task", "run"], sort=False):
        first = group.iloc[0]
        row = {"task": run_key[0], "run": run_key[1], "method": first["label"],
               "checkpoint": _fmt(first["checkpoint_step"]),
               "n": int(first["n_samples"]), "problems": int(first["num_problems"])}
        if testtime:
            row["test-time efficiency"] = _stc_text(testtime.get(tuple(run_key)))
        by_k = dict(zip(group["k"].astype(int), group["pass_at_k"]))
        rows.append({**row, **{f"pass@{k}": _fmt(by_k.get(int(k))) for k in ks}})
    return pd.DataFrame(rows)


def k_efficiency_display(keff):
    import pandas as pd

    return pd.DataFrame([{
            "task": r.task, "backend": r.backend, "method": r.label,
            "seeds (method/GRPO)": f"{r.n_method_seeds}/{r.n_grpo_seeds}",
            "reference k": _fmt(r.reference_k), "GRPO pass@ref": _fmt(r.grpo_pass_at_ref),
            "method pass@ref": _fmt(r.method_pass_at_ref), "k GRPO": _fmt(r.k_grpo, 1), "k*": _fmt(r.k_star, 1),
            "k* (evaluated)": _fmt(r.k_star_evaluated),
            f"efficiency [{BOOTSTRAP_LEVEL:.0%} CI]": _efficiency_text(r),
            f"Δpass@1 [{BOOTSTRAP_LEVEL:.0%} CI]": _interval_text(r.diff_pass_at_1, r.diff_pass_at_1_lo,
                                                                  r.diff_pass_at_1_hi),
            f"Δpass@ref [{BOOTSTRAP_LEVEL:.0%} CI]": _interval_text(r.diff_pass_at_ref, r.diff_pass_at_ref_lo,
                                                                    r.diff_pass_at_ref_hi),
            "status": r.status + (f" ({r.note})" if r.note else ""),
        } for r in keff.itertuples(index=False)])


def _interval_text(value, lo, hi) -> str:
    """'+0.050 [+0.010, +0.090]'; the interval is left out when there is none."""
    if isna(value):
        return "–"
    return f"{value:+.3f}" + ("" if isna(lo) or isna(hi) else f" [{lo:+.3f}, {hi:+.3f}]")


def _efficiency_text(r) -> str:
    """'2.26 [1.80, 2.90]', with the share of bootstrap replicates in which the method misses the target."""
    text = "–" if isna(r.efficiency) else f"{r.efficiency:.2f}"
    if not (isna(r.efficiency_lo) or isna(r.efficiency_hi)):
        text += f" [{r.efficiency_lo:.2f}, {r.efficiency_hi:.2f}]"
        if r.bootstrap_not_reached and r.bootstrap_not_reached > 0:
            text += f" (missed {r.bootstrap_not_reached:.1%})"
    return text


def testtime_display(testtime: dict[tuple[str, str], TesttimeRun]):
    """Per run: samples-to-correct of both orders, their ratio with its interval, eff@k at the reference ks."""
    import pandas as pd

    rows = []
    for (task, run), tt in sorted(testtime.items(), key=lambda kv: run_sort_key(kv[1].spec)):
        row = {"task": task, "run": run, "method": point_label(tt.spec.method, tt.spec.param_dict),
               "solved": tt.stc.get("num_solved"),
               "samples-to-correct random": _fmt(tt.stc.get("random"), 2),
               "samples-to-correct RepExp": _fmt(tt.stc.get("repexp"), 2), "ratio [95% CI]": _stc_text(tt)}
        for k, ratio in tt.efficiency.items():
            row[f"eff@{k}"] = "–" if ratio is None else f"{ratio:.2f}×"
        rows.append(row)
    return pd.DataFrame(rows)


def markdown_table(df) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""
    if df.empty:
        return "_(none)_\n"
    header = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines) + "\n"


def _graders(table) -> tuple[str, str]:
    """(the grader of the table's pass_at_k, the other one)."""
    grader = str(table["grader"].iloc[0]) if len(table) else DEFAULT_GRADER
    return grader, next(g for g in GRADERS if g != grader)


GRADER_NOTE = (
    "Graders: repexp = this project's verifier; paper = the recipe's scorers (verl's strict GSM8K `####`, "
    "Hendrycks string equivalence for MATH, Math-Verify for AIME), comparable to the paper's numbers. "
    "Both are computed from the same stored samples (docs/data.md)."
)


def _sections(table, keff, testtime, mean: str = "Mean") -> list[tuple[str, Any, str | None]]:
    """(heading, table, note) of every table of both views, in order (`mean` opens the seed-mean headings)."""
    grader, other = _graders(table)
    sections = [(f"{mean} over seeds ({grader} grader)", summary_wide(table), None),
                (f"{mean} over seeds ({other} grader, same samples)", summary_wide(table, f"pass_at_k_{other}"), None),
                ("k-efficiency (each method vs GRPO)", k_efficiency_display(keff), K_EFFICIENCY_NOTE)]
    if testtime:
        sections.append(("Test-time RepExp (verifier efficiency)", testtime_display(testtime), TESTTIME_NOTE))
    return sections + [("Per run", per_run_wide(table, testtime), None)]


def render_markdown(table, keff, *, missing: Sequence[str], ignored: Sequence[str],
                    testtime: dict[tuple[str, str], TesttimeRun] | None = None) -> str:
    parts = ["# pass@k", "", f"{table['run'].nunique()} evaluated runs over tasks "
             f"{', '.join(dict.fromkeys(table['task']))}, graded by **{_graders(table)[0]}**. {SEM_NOTE}", "",
             GRADER_NOTE, ""]
    if missing:
        parts += [f"**Missing runs** (expected by the config, no eval.json): {len(missing)}", ""]
        parts += [f"- {m}" for m in missing] + [""]
    if ignored:
        parts += [f"Ignored (not part of the config): {', '.join(ignored)}", ""]
    for heading, df, note in _sections(table, keff, testtime):
        parts += [f"## {heading}", "", markdown_table(df)] + ([f"_{note}_", ""] if note else [])
    return "\n".join(parts)


_HTML_STYLE = """
body { font-family: sans-serif; font-size: 13px; margin: 1em; }
table { border-collapse: collapse; margin-bottom: 1.2em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; }
td:first-child, td:nth-child(2) { text-align: left; }
p.note { max-width: 60em; color: #444; }
.missing { color: #a00; }
"""


def render_html(table, keff, *, missing: Sequence[str], ignored: Sequence[str],
                testtime: dict[tuple[str, str], TesttimeRun] | None = None) -> str:
    import html

    def frame(df) -> str:
        return df.to_html(index=False, border=0, na_rep="–", escape=True) if not df.empty else "<p>(none)</p>"

    intro = f"<p class='note'>{html.escape(SEM_NOTE)}</p><p class='note'>{html.escape(GRADER_NOTE)}</p>"
    if missing:
        items = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
        intro += ('<p class="missing"><b>Missing runs</b> (expected by the config, no eval.json):</p>'
                  f'<ul class="missing">{items}</ul>')
    if ignored:
        intro += f"<p>Ignored (not part of the config): {html.escape(', '.join(ignored))}</p>"
    body = ""
    for i, (heading, df, note) in enumerate(_sections(table, keff, testtime, mean="pass@k: mean")):
        body += (f"<h2>{heading}</h2>" + (intro if i == 0 else "") + frame(df)
                 + (f"<p class='note'>{html.escape(note)}</p>" if note else ""))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>pass@k</title>"
            f"<style>{_HTML_STYLE}</style></head><body>{body}</body></html>\n")
