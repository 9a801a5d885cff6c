"""Read the problems of a prepared split (verl row format, see docs/architecture.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from repexp.evaluate.core import content_hash


@dataclasses.dataclass(frozen=True)
class Problems:
    problem_ids: list[str]
    data_sources: list[str]
    prompts: list[list[dict]]  # chat messages per problem
    ground_truths: list[str]

    def __len__(self) -> int:
        return len(self.problem_ids)

    @property
    def data_hash(self) -> str:
        """Content hash of what the evaluation uses (ids, sources, prompts, ground truths), in order."""
        return content_hash([list(row) for row in zip(self.problem_ids, self.data_sources, self.prompts,
                                                      self.ground_truths)])


def _field(row: dict, path: str, where: str):
    value = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value or value[key] is None:
            raise ValueError(f"{where}: missing field {path!r}")
        value = value[key]
    return value


def load_problems(path: str | Path, *, limit: int | None = None) -> Problems:
    """Problems of `path` in file order (the first `limit` rows if given), validated."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found")
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for non-parquet input
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    missing = {"data_source", "prompt", "reward_model", "extra_info"} - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}; expected verl's row format")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        table = table.slice(0, limit)
    rows = table.select(["data_source", "prompt", "reward_model", "extra_info"]).to_pylist()
    if not rows:
        raise ValueError(f"{path}: no rows")
    ids, sources, prompts, truths = [], [], [], []
    for i, row in enumerate(rows):
        where = f"{path} row {i}"
        prompt = _field(row, "prompt", where)
        if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        ):
            raise ValueError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
        ids.append(str(_field(row, "extra_info.problem_id", where)))
        sources.append(str(_field(row, "data_source", where)))
        prompts.append([{"role": m["role"], "content": m["content"]} for m in prompt])
        truths.append(str(_field(row, "reward_model.ground_truth", where)))
    seen: set[str] = set()
    for pid in ids:  # one pass: the first repeated id
        if pid in seen:
            raise ValueError(f"{path}: duplicate problem_id {pid!r}")
        seen.add(pid)
    return Problems(problem_ids=ids, data_sources=sources, prompts=prompts, ground_truths=truths)
