"""Seeded, overlap-checked train/dev/test splits (pure: lists and numpy's RNG only).

Every random choice draws from its own stream, `np.random.default_rng([seed, <32 bits
of sha256(name)>])`, so the GSM8K dev split does not move when a train limit
is added, and the same seed always gives the same indices. Selected indices are
returned sorted, so outputs keep the source's row order.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

# Paper / upstream split sizes.
GSM8K_DEV_SIZE = 512
DAPO_TRAIN_SIZE = 4096


class SplitError(ValueError):
    """A split that would violate the data contract (overlap, missing dev ids, too few rows)."""


def rng(seed: int, stream: str) -> np.random.Generator:
    """The stream's generator: a stable id of its name (Python's hash() is salted per process); numpy
    refuses a negative seed."""
    return np.random.default_rng([int(seed), int.from_bytes(hashlib.sha256(stream.encode()).digest()[:4], "little")])


def seeded_subset(n: int, size: Optional[int], seed: int, stream: str) -> list[int]:
    """`size` distinct indices of range(n), sorted; all of them when size is None or >= n."""
    if size is None or size >= n:
        return list(range(n))
    chosen = rng(seed, stream).choice(n, size=size, replace=False)
    return sorted(int(i) for i in chosen)


def limit(indices: Sequence[int], size: Optional[int], seed: int, stream: str) -> list[int]:
    """A seeded subset of `indices` (order kept), for tiny CPU runs; all when size is None."""
    return [indices[i] for i in seeded_subset(len(indices), size, seed, stream)]


def split_by_membership(keys: Sequence[str], members: Iterable[str], *, what: str) -> tuple[list[int], list[int]]:
    """(positions whose key is in `members`, the other positions); every member must occur once.

    MATH: keys are the test rows' `unique_id`s (or problem texts), members the MATH-500 ones.
    """
    members = list(members)
    wanted = set(members)
    if len(wanted) != len(members):
        raise SplitError(f"{what}: the dev list has {len(members) - len(wanted)} duplicate keys")
    positions: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in wanted:
            if key in positions:
                raise SplitError(f"{what}: dev key {key!r} matches rows {positions[key]} and {i}")
            positions[key] = i
    missing = [k for k in members if k not in positions]
    if missing:
        raise SplitError(f"{what}: {len(missing)} dev keys not found in the test rows, e.g. {missing[:3]}")
    chosen = set(positions.values())
    return sorted(chosen), [i for i in range(len(keys)) if i not in chosen]


def seeded_dev_test(n: int, dev_size: int, seed: int, stream: str = "gsm8k/dev") -> tuple[list[int], list[int]]:
    """GSM8K: `dev_size` test rows chosen with the seed form dev, the rest test (both sorted)."""
    if not 0 < dev_size < n:
        raise SplitError(f"dev size {dev_size} must be between 1 and {n - 1} (the test set has {n} rows)")
    dev = seeded_subset(n, dev_size, seed, stream)
    return dev, sorted(set(range(n)) - set(dev))


def train_subset(n: int, size: int, seed: int, stream: str = "dapo/train") -> list[int]:
    """DAPO: a seeded `size`-row subset of the training pool (sorted); all rows must suffice."""
    if size < 1:
        raise SplitError(f"train subset size must be >= 1, got {size}")
    if n < size:
        raise SplitError(f"the training pool has {n} rows, fewer than the {size} to draw")
    return seeded_subset(n, size, seed, stream)


_WS = re.compile(r"\s+")
_MATH_DELIMITERS = re.compile(r"\\[()\[\]]|\$")
_LATEX_SPACING = re.compile(r"\\(?:[,;:! ]|(?:quad|qquad|left|right|displaystyle|textstyle)(?![a-z]))")
_SINGLE_BRACED = re.compile(r"\{(\\?[a-z0-9])\}")
# sentence punctuation; a '.' or ',' between two digits is part of a number (3.5, 1,000) and stays
_PUNCTUATION = re.compile(r"(?<!\d)[.,]|[.,](?!\d)|[;:!?]")


def normalize_text(text: str) -> str:
    """The problem-text identity used by overlap checks, blind to how the same problem is typeset.

    Case, whitespace, math delimiters (`$`, `\\(`, `\\[`), spacing and sizing commands (`\\,`,
    `\\left`), `\\dfrac`/`\\tfrac`, braces around one character (`x^{2}` = `x^2`) and sentence
    punctuation (`12.$` = `12$.`) do not count; digits, letters, operators and the decimal point or
    thousands comma inside a number do. Catches MATH test/311, 1038, 3023 = train/1598, 1414, 750.
    """
    s = text.casefold()
    s = _MATH_DELIMITERS.sub(" ", s)
    s = _LATEX_SPACING.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _WS.sub("", s)
    previous = None
    while previous != s:  # {{x}} → {x} → x
        previous, s = s, _SINGLE_BRACED.sub(r"\1", s)
    return _PUNCTUATION.sub("", s)


def drop_overlapping(candidates: Sequence[str], held_out: Iterable[str]) -> tuple[list[int], list[int]]:
    """(positions of `candidates` whose text is not in `held_out`, positions that are).

    Used to remove training problems that also appear in dev/test (MATH has four: the same
    equilateral-triangle problem is train/geometry/6032 and test/precalculus/24307, and three
    more differ only in typesetting, docs/data.md).
    """
    blocked = {normalize_text(t) for t in held_out}
    keep, dropped = [], []
    for i, text in enumerate(candidates):
        (dropped if normalize_text(text) in blocked else keep).append(i)
    return keep, dropped


@dataclass
class SplitRow:
    """What the overlap check needs to know about one output row."""

    problem_id: str
    text: str


def check_disjoint(splits: dict[str, Sequence[SplitRow]], *, may_share: Iterable[tuple[str, str]] = ()) -> None:
    """Raise SplitError if two splits share a problem (by problem_id or normalised text).

    `may_share` lists split pairs allowed to share problems by design (AIME: dev = test).
    Within one split, problem_ids must be unique.
    """
    allowed = {frozenset(pair) for pair in may_share}
    ids: dict[str, set[str]] = {}
    texts: dict[str, dict[str, str]] = {}
    for name, rows in splits.items():
        seen: set[str] = set()
        for row in rows:
            if row.problem_id in seen:
                raise SplitError(f"split {name}: problem_id {row.problem_id!r} occurs twice")
            seen.add(row.problem_id)
        ids[name] = seen
        texts[name] = {normalize_text(row.text): row.problem_id for row in rows}
    problems = []
    for a, b in itertools.combinations(splits, 2):
        if frozenset((a, b)) in allowed:
            continue
        shared_ids = ids[a] & ids[b]
        shared_texts = texts[a].keys() & texts[b].keys()
        if shared_ids or shared_texts:
            examples = sorted(shared_ids)[:3] + [f"{texts[a][t]} = {texts[b][t]}" for t in sorted(shared_texts)[:3]]
            problems.append(f"{a}/{b}: {len(shared_ids)} shared problem_ids, {len(shared_texts)} shared problem "
                            f"texts (e.g. {examples})")
    if problems:
        raise SplitError("splits overlap: " + "; ".join(problems))
