"""Shared look of every figure: constants (colours, fonts, the paper's points) and the scaffolding
(fixed-size figure with a footer for legend and notes, empty panels, limits, log2 axis, saving)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

from repexp import layout
from repexp import metrics as M
from repexp.io import atomic_path

DPI = 200
TASK_TITLES = {"math": "MATH", "gsm8k": "GSM8K", "aime24": "AIME 2024", "dapo-with-aime24": "AIME 2024 (DAPO train)",
               "arith": "Arithmetic (built-in)"}
# A method's colour and first marker are its `repexp.methods` entry's (`color`, `marker`); several points of
# one method in a figure take shades of its colour (dark to light) and further markers, so they stay apart
POINT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
SHADE_DARKEST = 0.35  # the first of several points: the method's colour this far towards black
SHADE_LIGHTEST = 0.45  # the last: this far towards white
BACKEND_LINESTYLES = ("-", "--", ":")
# the paper's main setting (upstream §14): β = 0.01, sparse_dim 32 (MATH, GSM8K) or 128 (AIME via DAPO)
PAPER_POINTS = {"math": (32, 0.01), "gsm8k": (32, 0.01), "aime24": (128, 0.01), "dapo-with-aime24": (128, 0.01)}
MAX_REPEXP_LINES = 4  # points of one method (and backend) drawn in the pass@k figure before only one is kept
TRAINING_METRICS = (M.DEV_SELECTION, M.statistic(M.BONUS_RAW, "mean"), M.statistic(M.BONUS_SCALED, "mean"),
                    M.REWARD_VERIFIER_MEAN, M.REWARD_SHAPED_MEAN,
                    M.BONUS_TURNED_OFF)  # not a panel: marks the steps where the bonus was switched off
DYNAMICS_METRICS = (M.POLICY_ENTROPY, M.DISTINCT_FRACTION)  # the training-dynamics figure
CURVE_METRICS = TRAINING_METRICS + DYNAMICS_METRICS  # what is read from metrics.jsonl / MLflow
LINE_STYLE = dict(marker="o", linewidth=1.275, markersize=6, markeredgewidth=0.9, markeredgecolor="#F7F7FF")
FONT = {"label": 10, "title": 11, "tick": 8, "legend": 8, "note": 7}




def method_color(method: str) -> str:
    """The method's colour from the method table (the base model's too)."""
    from repexp.methods import color

    return color(method)


def method_marker(method: str) -> str:
    from repexp.methods import BASE, METHODS

    return "o" if method == BASE else METHODS[method].marker


def shade(color: str, i: int, n: int) -> str:
    """Point i of n of one method: its colour itself when n = 1, else from darker (i = 0) to lighter."""
    import matplotlib.colors as mcolors

    if n <= 1:
        return color
    t = i / (n - 1)
    rgb = mcolors.to_rgb(color)
    if t <= SHADE_DARKEST / (SHADE_DARKEST + SHADE_LIGHTEST):  # towards black
        f = SHADE_DARKEST - t * (SHADE_DARKEST + SHADE_LIGHTEST)
        mixed = tuple(c * (1 - f) for c in rgb)
    else:  # towards white
        f = t * (SHADE_DARKEST + SHADE_LIGHTEST) - SHADE_DARKEST
        mixed = tuple(c + (1 - c) * f for c in rgb)
    return mcolors.to_hex(mixed)


def point_marker(method: str, i: int) -> str:
    """Point i of one method: the method's own marker first, then the others of POINT_MARKERS."""
    first = method_marker(method)
    markers = (first, *(m for m in POINT_MARKERS if m != first))
    return markers[i % len(markers)]


# --------------------------------------------------------------------------- figure scaffolding


def _style():
    """seaborn whitegrid + upstream font sizes, scoped to a `with` block."""
    import contextlib

    import matplotlib.pyplot as plt
    import seaborn as sns

    stack = contextlib.ExitStack()
    stack.enter_context(sns.axes_style("whitegrid"))
    stack.enter_context(plt.rc_context({
        "axes.labelsize": FONT["label"], "axes.titlesize": FONT["title"], "xtick.labelsize": FONT["tick"],
        "ytick.labelsize": FONT["tick"], "legend.fontsize": FONT["legend"], "pdf.fonttype": 42,
        "font.family": "DejaVu Sans",
    }))
    return stack


def _figure_with_footer(width: float, plot_height: float, *, legend_rows: int, notes: Sequence[str], ncols: int = 1,
                        nrows: int = 1):
    """A figure of fixed size: a plot area on top, legend and wrapped notes below (never over the data)."""
    import matplotlib.pyplot as plt

    chars = max(30, int((width - 0.3) * 72 / (FONT["note"] * 0.56)))  # that fit the figure's width
    note_lines = [line for note in notes for line in textwrap.wrap(note, chars) or [""]]
    footer = 0.12 + 0.2 * legend_rows + 0.13 * len(note_lines)
    fig = plt.figure(figsize=(width, plot_height + footer), dpi=DPI, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[plot_height, footer], hspace=0.0)
    axes = top.subplots(nrows, ncols, squeeze=False)
    if note_lines:
        bottom.text(0.5, 0.02, "\n".join(note_lines), ha="center", va="bottom", fontsize=FONT["note"],
                    color="#444444", linespacing=1.25)
    return fig, axes, bottom


def _task_panels(tasks: Sequence[str], labels: Sequence[str], notes: Sequence[str], draw, extra=None):
    """The one-row figures (pass@k, test-time, k-efficiency): a titled panel per task, the legend of `labels`
    and the notes under them. `draw(ax, j, handles)` draws panel j, adds its legend handles and returns its
    record; `extra(ax, handles)` adds legend-only handles. Returns (figure, panel records)."""
    width = max(5.0, 3.2 * len(tasks))
    # as many legend columns (at most 4) as fit: about 0.065 in per character at FONT["legend"] plus the handle;
    # a row wider than the figure is cut at both edges, handles first
    ncol = max(1, min(len(labels), 4, int(width // (0.065 * max((len(label) for label in labels), default=1) + 0.6))))
    records: list[dict] = []
    handles: dict = {}
    with _style():
        fig, axes, footer = _figure_with_footer(width, 2.9, legend_rows=math.ceil(len(labels) / ncol), notes=notes,
                                                ncols=len(tasks))
        for j, task in enumerate(tasks):
            ax = axes[0][j]
            ax.set_title(TASK_TITLES.get(task, task))
            records.append({"task": task, "title": TASK_TITLES.get(task, task), **draw(ax, j, handles)})
        if extra is not None:
            extra(ax, handles)
        _legend(footer, handles, labels, ncol)
    return fig, records


def _legend(footer, handles: dict, labels: Sequence[str], ncol: int) -> None:
    """The legend under the plots: `labels` that have a handle, in that order (none without any)."""
    shown = [label for label in labels if label in handles]
    if shown:
        footer.legend([handles[label] for label in shown], shown, loc="upper center", ncol=ncol, frameon=False,
                      fontsize=FONT["legend"], bbox_to_anchor=(0.5, 1.0))


def _no_data(ax, message: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(message, 28)), ha="center", va="center", fontsize=FONT["legend"],
            color="#666666", transform=ax.transAxes)


def _adaptive_ylim(lows: Iterable[float], highs: Iterable[float], *, floor: float = 0.0, ceil: float = 1.0,
                   min_span: float = 0.05) -> tuple[float, float]:
    """Limits that contain every plotted value (band included) with a margin, never cropping data.

    Nearly flat data get at least `min_span` (so ticks stay readable); the limits stay within a
    small margin of [floor, ceil], the range of a probability.
    """
    lows = [v for v in lows if v is not None and math.isfinite(v)]
    highs = [v for v in highs if v is not None and math.isfinite(v)]
    if not lows:
        return floor, ceil
    lo, hi = min(lows), max(highs)
    pad = 0.08 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    if hi - lo < min_span:
        centre = (lo + hi) / 2
        lo, hi = centre - min_span / 2, centre + min_span / 2
    margin = 0.03 * (hi - lo)  # markers at exactly 0 or 1 must not be cut
    if lo < floor - margin:
        lo, hi = floor - margin, hi + (floor - margin - lo)
    if hi > ceil + margin:
        lo, hi = max(floor - margin, lo - (hi - ceil - margin)), ceil + margin
    return lo, hi


def _save(fig, out_dir: Path, stem: str) -> list[str]:
    import matplotlib.pyplot as plt

    files = layout.figure_names(stem)
    for name in files:
        with atomic_path(out_dir / name) as tmp:
            fig.savefig(tmp, format=Path(name).suffix[1:], dpi=DPI)
    plt.close(fig)
    return files


def _size_px(fig) -> list[int]:
    w, h = fig.get_size_inches()
    return [int(round(w * DPI)), int(round(h * DPI))]




def _finish_curve_panel(ax, *, plotted: bool, empty_message: str, k_max: int, lows, highs, xlabel: str,
                        first: bool) -> tuple[float, float] | None:
    """A pass@k-over-k panel's axes: log2 k, limits around every plotted value; a message when empty."""
    ylim = None
    if not plotted:
        _no_data(ax, empty_message)
    else:
        ax.set_xscale("log", base=2)
        top = max(0, math.floor(math.log2(max(1, k_max))))
        ax.set_xticks([2 ** i for i in range(top + 1)])
        ax.set_xticklabels([f"$2^{{{i}}}$" for i in range(top + 1)])
        ax.minorticks_off()
        ax.set_xlim(2 ** -0.2, 2 ** (math.log2(max(1, k_max)) + 0.2))
        ylim = _adaptive_ylim(lows, highs)
        ax.set_ylim(*ylim)
        ax.set_xlabel(xlabel)
        ax.tick_params(axis="both", labelsize=FONT["tick"])
    if first:
        ax.set_ylabel("pass@k")
    return ylim
