"""Build `tests/data/agreement_corpus.jsonl`: labelled model-like responses for the grader agreement study.

    PYTHONPATH=$PWD .venv/bin/python tests/data/make_agreement_corpus.py   # rewrites the corpus (deterministic)

Every item is a reference solution from the shipped data (MATH test, GSM8K test, AIME 2024)
whose final answer is replaced by a *constructed* final answer, so its label is known by
construction, not by any grader. Labelling rules (also in docs/data.md, "Agreement study"):

- `label` 1: the final answer is mathematically equal to the gold, in a form that answers the
  question (equivalent LaTeX, spacing, `\\dfrac`, exact decimals, `x = …`, `…°` for `…^\\circ`,
  a matrix in another environment, a GSM8K number with `$`, commas, `.00` or a unit word);
  `label` 0: a different value, or no final answer at all (truncated, unclosed box).
- The final answer is the last marked one: the last `\\boxed{}` (MATH, AIME), the last `####`
  line that states a number, else the last box (GSM8K); a later marked answer overrides an
  earlier one, a markdown heading (`#### Step 2: …`, `#### Note:`) is not an answer.
- `clear` true: the response marks its final answer with `\\boxed{}` or `####` and the label
  follows from the rules above without judgement. `clear` false: answers given only in prose,
  answers whose correctness depends on a reading of the question (a percent given without `%`,
  a rounded decimal for a fraction) — graders may legitimately differ there.
- Wrong answers are constructed to differ in value from the gold (another problem's gold, one
  digit changed, the sign flipped, an interval endpoint opened, a matrix entry changed). Every
  item on which any grader disagreed with its label was read by hand (docs/data.md lists the
  classes); `note` says why where the construction alone is not obviously decisive.

Fields: id, task (math | gsm8k | aime), data_source, problem_id, ground_truth, response, label,
clear, rule (the construction), note.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from repexp.verify.extract import closing_brace

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".." / "shared" / "data"
OUT = Path(__file__).resolve().parent / "agreement_corpus.jsonl"
SEED = 16
MATH_SOURCE, GSM8K_SOURCE, AIME_SOURCE = "DigitalLearningGmbH/MATH-lighteval", "openai/gsm8k", "aime24"


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def last_box_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the last `\\boxed{…}` in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    end = closing_brace(text, start) if start >= 0 else None
    return None if end is None else (start, end + 1)


def with_final(solution: str, final: str) -> str:
    """The solution with its last box replaced by `final` (or `final` appended as a closing sentence)."""
    span = last_box_span(solution)
    if span is None:
        return solution.rstrip() + f"\n\nTherefore, the final answer is ${final}$."
    return solution[: span[0]] + final + solution[span[1] :]


def truncated(solution: str) -> str:
    """The first 60% of the solution before its first box (some AIME solutions box several methods' answers)."""
    boxes = [k for k in (solution.find(cmd) for cmd in ("\\boxed", "\\fbox", "\\framebox")) if k >= 0]
    body = solution[: min(boxes)] if boxes else solution
    return body[: max(20, int(len(body) * 0.6))]


# --------------------------------------------------------------------------- answer forms

_INT = re.compile(r"-?\d+")
_SIMPLE_FRAC = re.compile(r"(-?)\\frac\{(\d+)\}\{(\d+)\}")


def terminating_decimal(gold: str) -> str | None:
    m = _SIMPLE_FRAC.fullmatch(gold)
    if not m:
        return None
    num, den = int(m.group(2)), int(m.group(3))
    d = den
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1 or den == 1:
        return None
    text = f"{num / den:.10f}".rstrip("0").rstrip(".")
    return m.group(1) + text


def spaced(gold: str) -> str:
    """Spaces around `+`, `=` and list commas (not thousands commas: `58 , 500` would read as a list)."""
    return re.sub(r"\s*([+=]|(?<!\d),|,(?!\s*\\?!?\d{3}))\s*", r" \1 ", gold).strip()


def compact(gold: str) -> str:
    return re.sub(r"(?<![a-zA-Z])\s+|\s+(?=[^a-zA-Z])", "", gold)


def perturb_digit(gold: str, rng: np.random.Generator) -> str | None:
    """One digit changed (a different value: the digit is not inside an exponent of 1 or 0)."""
    positions = [i for i, ch in enumerate(gold) if ch.isdigit() and gold[max(0, i - 1)] not in "^_"]
    if not positions:
        return None
    i = positions[int(rng.integers(len(positions)))]
    new = str((int(gold[i]) + int(rng.integers(1, 9))) % 10)
    if i == 0 and new == "0" and len(gold) > 1 and gold[1].isdigit():
        new = "9"  # no leading zero: "05" would equal "5"
    return gold[:i] + new + gold[i + 1 :]


def matrix_rows(gold: str) -> list[list[str]]:
    body = gold.split("\\begin{pmatrix}", 1)[1].split("\\end{pmatrix}", 1)[0]
    return [[cell.strip() for cell in row.split("&")] for row in body.split("\\\\") if row.strip()]


def matrix(rows: list[list[str]], env: str = "pmatrix", sep: str = " \\\\ ", cell_sep: str = " & ") -> str:
    return f"\\begin{{{env}}}" + sep.join(cell_sep.join(row) for row in rows) + f"\\end{{{env}}}"


# --------------------------------------------------------------------------- MATH


def math_items(rng: np.random.Generator) -> list[dict]:
    rows = load("math/test.jsonl")
    golds = [r["answer"].strip() for r in rows]
    by_kind: dict[str, list[int]] = {"matrix": [], "degree": [], "text": [], "choice": [], "unit": [], "list": [],
                                     "interval": [], "frac": [], "other": []}
    for i, gold in enumerate(golds):
        if re.fullmatch(r"\\text\{\([A-E]\)\}", gold):
            by_kind["choice"].append(i)
        elif re.fullmatch(r"-?\d+(?:\.\d+)?\s*\\text\{ [a-z ]+\}", gold):
            by_kind["unit"].append(i)
        elif ("separated by commas" in rows[i]["problem"] and "," in gold and not gold.startswith(("(", "["))
              and re.fullmatch(r"[-\d, ]+", gold)):
            by_kind["list"].append(i)
        elif "pmatrix" in gold:
            by_kind["matrix"].append(i)
        elif "\\circ" in gold:
            by_kind["degree"].append(i)
        elif gold.startswith("\\text{") and gold.endswith("}") and gold.count("{") == 1:
            by_kind["text"].append(i)
        elif re.fullmatch(r"[\[(].*,.*[\])]", gold) and "\\infty" in gold:
            by_kind["interval"].append(i)
        elif _SIMPLE_FRAC.fullmatch(gold):
            by_kind["frac"].append(i)
        elif gold:
            by_kind["other"].append(i)
    quota = {"matrix": 12, "degree": 10, "text": 8, "choice": 8, "unit": 10, "list": 10, "interval": 10, "frac": 12,
             "other": 36}
    items = []
    for kind, count in quota.items():
        chosen = sorted(rng.choice(by_kind[kind], size=count, replace=False))
        for i in chosen:
            items += math_variants(kind, rows[int(i)], golds, rng)
    return items


def item(task: str, source: str, pid: str, gold: str, response: str, label: int, clear: bool, rule: str,
         note: str = "") -> dict:
    return {"task": task, "data_source": source, "problem_id": pid, "ground_truth": gold, "response": response,
            "label": label, "clear": clear, "rule": rule, "note": note}


def math_variants(kind: str, row: dict, golds: list[str], rng: np.random.Generator) -> list[dict]:
    gold, solution, pid = row["answer"].strip(), row["solution"], f"math/test/{row['hf_index']}"

    def add(answer: str, label: int, rule: str, clear: bool = True, note: str = "") -> None:
        out.append(item("math", MATH_SOURCE, pid, gold, with_final(solution, f"\\boxed{{{answer}}}"), label, clear,
                        rule, note))

    out: list[dict] = []
    add(gold, 1, "exact")
    span = last_box_span(solution)
    body = solution[: span[0]] if span else solution
    closing = f"\n\nThus, the final answer is:\n\\[\n\\boxed{{{gold}}}\n\\]"
    out.append(item("math", MATH_SOURCE, pid, gold, body.rstrip() + closing, 1, True, "display-math closing"))
    if kind == "matrix":
        rows = matrix_rows(gold)
        add(matrix(rows, sep="\\\\", cell_sep="&"), 1, "matrix compact")
        add(matrix(rows, env="bmatrix"), 1, "matrix as bmatrix")
        add("\n" + matrix(rows, sep=" \\\\\n", cell_sep=" & ") + "\n", 1, "matrix multi-line")
        add("\\left(\\begin{array}{" + "c" * len(rows[0]) + "}" + " \\\\ ".join(" & ".join(r) for r in rows)
            + "\\end{array}\\right)", 1, "matrix as array in parentheses")
        wrong = [list(r) for r in rows]
        wrong[0][0] = perturb_digit(wrong[0][0], rng) or wrong[0][0] + "1"
        add(matrix(wrong), 0, "matrix entry changed")
        if len(rows) > 1 and rows[0] != rows[-1]:
            add(matrix(rows[::-1]), 0, "matrix rows reversed")
        return out
    if kind == "degree":
        value = re.sub(r"\^\{?\\circ\}?", "", gold).strip()
        add(value + "°", 1, "Unicode degree sign")
        add(value + "^{\\circ}", 1, "degrees braced")
        add(value, 1, "degrees dropped")
        if _INT.fullmatch(value):
            add(f"{int(value) + 5}°", 0, "other angle")
        return out
    if kind == "text":
        inner = gold[len("\\text{") : -1]
        add(f"\\text{{{inner}.}}", 1, "period inside \\text{}")
        add(f"\\text{{ {inner} }}", 1, "spaces inside \\text{}")
        other = next(g for g in golds if g.startswith("\\text{") and g != gold and g.lower() != gold.lower()
                     and g.count("{") == 1)
        add(other, 0, "another problem's text answer")
        return out
    if kind == "choice":
        letter = gold[len("\\text{(") : -2]
        add(f"({letter})", 1, "choice letter in parentheses")
        add(f"\\textbf{{({letter})}}", 1, "choice letter in bold")
        add(letter, 1, "bare choice letter")
        other = "ABCDE"[("ABCDE".index(letter) + 2) % 5]
        add(f"\\text{{({other})}}", 0, "another choice")
        return out
    if kind == "unit":
        number = gold.split("\\text", 1)[0].strip()
        add(number, 1, "unit dropped")
        add(gold.replace("\\text{ ", "\\ \\text{"), 1, "unit with a spacing command")
        wrong = perturb_digit(number, rng)
        if wrong:
            add(wrong + gold[len(number):], 0, "one digit changed, unit kept")
        return out
    if kind == "list":
        parts = [p.strip() for p in gold.split(",")]
        add(", ".join(parts[::-1]), 1, "list in another order")
        add(",".join(parts), 1, "list without spaces")
        add(", ".join(parts[:-1]), 0, "list missing an element")
        return out
    if kind == "interval":
        add(spaced(gold).replace("(", "\\left(").replace(")", "\\right)"), 1, "interval with \\left/\\right")
        flipped = gold.replace("[", "(") if "[" in gold else gold.replace("(", "[", 1)
        if flipped.startswith("[-\\infty"):
            flipped = gold[:-1] + "]" if gold.endswith(")") and not gold.endswith("\\infty)") else None
        if flipped and flipped != gold:
            add(flipped, 0, "interval endpoint opened/closed")
        return out
    if kind == "frac":
        add(gold.replace("\\frac", "\\dfrac"), 1, "\\dfrac")
        decimal = terminating_decimal(gold)
        if decimal:
            add(decimal, 1, "exact decimal")
        wrong = perturb_digit(gold, rng)
        if wrong:
            add(wrong, 0, "one digit changed")
        add(f"x = {gold}", 1, "assignment x = …")
        m = _SIMPLE_FRAC.fullmatch(gold)
        add(f"{m.group(1)}{m.group(2)}/{m.group(3)}", 1, "slash fraction")
        if not decimal:
            rounded = f"{int(m.group(2)) / int(m.group(3)):.3f}"
            add(("-" if m.group(1) else "") + rounded, 0, "rounded decimal (3 places)",
                note="a different value; the question asks for an exact answer")
        return out
    # other golds: spacing forms, near misses, two boxes, truncation, prose
    if gold != spaced(gold):
        add(spaced(gold), 1, "spaced")
    elif gold != compact(gold) and "\\text" not in gold:
        add(compact(gold), 1, "compact")
    if _INT.fullmatch(gold) and "=" not in gold:
        add(f"n = {gold}", 1, "assignment n = …")
        if int(gold) > 0:
            add(f"-{gold}", 0, "sign flipped")
    wrong = perturb_digit(gold, rng)
    if wrong and wrong != gold:
        add(wrong, 0, "one digit changed")
    other = golds[int(rng.integers(len(golds)))]
    if other.strip() and other.replace(" ", "") != gold.replace(" ", ""):
        add(other, 0, "another problem's answer")
    roll = rng.random()
    if roll < 0.25 and wrong:
        body = with_final(solution, f"\\boxed{{{wrong}}}")
        out.append(item("math", MATH_SOURCE, pid, gold, body + f"\n\nWait, let me recheck. Correcting the slip, the "
                        f"answer is $\\boxed{{{gold}}}$.", 1, True, "wrong box corrected by a final box"))
    elif roll < 0.5 and wrong:
        body = with_final(solution, f"\\boxed{{{gold}}}")
        out.append(item("math", MATH_SOURCE, pid, gold, body + f"\n\nOn second thought, the answer is "
                        f"$\\boxed{{{wrong}}}$.", 0, True, "right box overridden by a wrong final box"))
    elif roll < 0.65:
        out.append(item("math", MATH_SOURCE, pid, gold, truncated(solution), 0, True, "truncated, no answer"))
    elif roll < 0.75:
        out.append(item("math", MATH_SOURCE, pid, gold, truncated(solution) + f"\n\\boxed{{{gold}", 0, True,
                        "unclosed final box"))
    elif roll < 0.9:
        span = last_box_span(solution)
        body = solution[: span[0]] if span else solution
        out.append(item("math", MATH_SOURCE, pid, gold, body.rstrip() + f"\n\nThe final answer is ${gold}$.", 1,
                        False, "answer in prose, no box"))
    return out


# --------------------------------------------------------------------------- GSM8K


def gsm8k_body(solution: str) -> str:
    body = solution.rpartition("####")[0]
    return re.sub(r"<<[^>]*>>", "", body).strip()


def steps_with_headings(body: str) -> str:
    lines = [line for line in body.splitlines() if line.strip()]
    return "\n".join(f"#### Step {k}: {line.split('.')[0][:40].strip()}\n{line}" for k, line in enumerate(lines, 1))


def gsm8k_items(rng: np.random.Generator, count: int = 48) -> list[dict]:
    rows = load("gsm8k/test.jsonl")
    chosen = sorted(rng.choice(len(rows), size=count, replace=False))
    golds = [r["answer"].rpartition("####")[2].strip().replace(",", "") for r in rows]
    items = []
    for n, i in enumerate(chosen):
        gold = golds[int(i)]
        value = int(gold)
        body = gsm8k_body(rows[int(i)]["answer"])
        pid = f"gsm8k/test/{int(i)}"

        def add(response: str, label: int, rule: str, clear: bool = True, note: str = "") -> None:
            items.append(item("gsm8k", GSM8K_SOURCE, pid, gold, response, label, clear, rule, note))

        add(f"{body}\n#### {gold}", 1, "#### N")
        correct_forms = [
            (f"{body}\n#### ${value:,}", "#### $N with comma"),
            (f"{body}\n#### {value}.00", "#### N.00"),
            (f"{body}\n#### {value} dollars.", "#### N unit"),
            (f"{body}\n#### **{value}**", "#### **N**"),
            (f"{body}\nThe answer is $\\boxed{{{value}}}$.", "box only"),
            (f"{body}\n#### {value}\n\n#### Note:\nThe numbers above were rounded nowhere.", "#### N then #### Note:"),
            (f"{steps_with_headings(body)}\n\nSo the answer is $\\boxed{{{value}}}$.", "#### Step headings then a box"),
            (f"{body}\n#### {value} = {value // 2} + {value - value // 2}", "#### N = derivation"),
            (f"{body}\n#### Answer: {value}", "#### Answer: N"),
            (f"{body}\n#### {value:,}".replace(",", " "), "#### N with space thousands"),
            (f"{body}\n#### {value - 1}\nWait, I dropped one.\n#### {value}", "#### wrong then #### right"),
            (f"{body}\n####{value}", "####N without a space"),
            (f"{body}\n\n**Final Answer**\n#### {value}", "bold heading then #### N"),
            (f"{body}\n#### The total is {value}.", "#### The total is N."),
            (f"{body}\n#### \\({value}\\)", "#### \\(N\\)"),
            (f"{body}\n#### {value} (that is, {value // 2} + {value - value // 2})", "#### N (explanation)"),
        ]
        for k in rng.choice(len(correct_forms), size=4, replace=False):
            response, rule = correct_forms[int(k)]
            add(response, 1, rule)
        wrong_forms = [
            (f"{body}\n#### {value + 1}", "#### N+1"),
            (f"{body}\n#### {2 * value}", "#### 2N"),
            (f"{body}\n#### {golds[int(chosen[(n + 7) % len(chosen)])]}", "#### another problem's answer"),
            (f"{body}\n#### {value}\nHmm, recount.\n#### {value + 2}", "#### right then #### wrong"),
            (f"{body}\nSo the answer is $\\boxed{{{value + 3}}}$.", "wrong box only"),
            (f"{body[: max(15, len(body) // 2)]}", "truncated, no answer"),
            (f"{body}\n#### {value}.5", "#### N.5"),
            (f"{body}\n#### {value} dollars and 50 cents", "#### N dollars and 50 cents"),
        ]
        for k in rng.choice(len(wrong_forms), size=2, replace=False):
            response, rule = wrong_forms[int(k)]
            if rule == "#### another problem's answer" and response.endswith(f"#### {value}"):
                continue
            add(response, 0, rule)
        if n % 6 == 0:
            add(f"{body}\nSo the final answer is {value}.", 1, "answer in prose, no marker", clear=False)
    return items


# --------------------------------------------------------------------------- AIME


def aime_items(rng: np.random.Generator) -> list[dict]:
    rows = load("aime24/test.jsonl")
    items = []
    answers = [str(int(r["answer"])) for r in rows]
    for n, row in enumerate(rows):
        gold = str(row["answer"]).strip()
        value = int(gold)
        pid = f"aime24/{row['id']}"

        def add(final: str, label: int, rule: str, clear: bool = True, response: str | None = None) -> None:
            text = response if response is not None else with_final(row["solution"], final)
            items.append(item("aime", AIME_SOURCE, pid, gold, text, label, clear, rule))

        add(f"\\boxed{{{value}}}", 1, "exact")
        add(f"\\boxed{{{value:03d}}}", 1, "zero-padded")
        forms = [(f"\\boxed{{{value} = m+n}}", "value = expression"),
                 (f"\\boxed{{m+n = {value}}}", "expression = value"),
                 (f"\\boxed{{\\textbf{{({value:03d})}}}}", "\\textbf{(NNN)}"),
                 (f"\\boxed{{{value}.}}", "trailing period")]
        final, rule = forms[n % len(forms)]
        add(final, 1, rule)
        add(f"\\boxed{{{(value + 1) % 1000}}}", 0, "off by one")
        other = answers[(n + 11) % len(answers)]
        if other != str(value):
            add(f"\\boxed{{{other}}}", 0, "another problem's answer")
        if n % 3 == 0:
            add("", 1, "answer in prose, no box", clear=False,
                response=truncated(row["solution"]) + f"\n\nThe final answer is {value}.")
        if n % 3 == 1:
            add("", 0, "truncated, no answer", response=truncated(row["solution"]))
    return items


def main() -> None:
    rng = np.random.default_rng(SEED)
    items = math_items(rng) + gsm8k_items(rng) + aime_items(rng)
    with OUT.open("w", encoding="utf-8") as handle:
        for k, entry in enumerate(items):
            handle.write(json.dumps({"id": k, **entry}, ensure_ascii=False) + "\n")
    counts = {task: sum(1 for e in items if e["task"] == task) for task in ("math", "gsm8k", "aime")}
    print(f"wrote {OUT} ({len(items)} items: {counts}; clear {sum(e['clear'] for e in items)})")


if __name__ == "__main__":
    main()
