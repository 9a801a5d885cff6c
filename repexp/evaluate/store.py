"""The sample store of one evaluation: `samples/meta.json` plus one Parquet file per shard.

A shard file is written atomically, so a file that is there was complete when written; one
damaged later (a truncated copy, a full disk on a restore, bit rot in its footer) is found when the
store is opened: it must read back with the rows its shard should hold, else it is moved to
`samples/corrupt/` (kept for inspection, never read again) and counts as missing, so the run
regenerates it. `meta.json` records everything that determines the samples; resuming under
different settings is refused rather than mixing samples from two configurations.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from repexp import layout
from repexp.evaluate.core import STORE_FORMAT, shard_plan
from repexp.io import atomic_path, read_json, write_json_atomic

# column → pyarrow type; `answer` is the extracted answer (null = none), used for maj@k
SHARD_TYPES = {"problem_id": "string", "sample_index": "int32", "response": "string", "num_tokens": "int32",
               "finish_reason": "string", "score": "float64", "answer": "string", "data_source": "string",
               "ground_truth": "string"}
# Read back when a store is opened: everything eval.json is assembled from (the responses are not needed)
CHECKED_COLUMNS = ("problem_id", "sample_index", "num_tokens", "finish_reason", "score", "answer")
SHARD_SUFFIX = "parquet"
# meta.json keys a resumed run must match; engine options that do not change the samples
# (memory, parallelism, eager mode) and file locations may differ.
RESUME_KEYS = ("format", "generation", "num_shards")  # problem ids are covered by data_hash


class SampleStore:
    def __init__(self, out_dir: str | Path):
        self.dir = layout.samples_dir(out_dir)
        self.meta_path = self.dir / layout.SAMPLES_META

    def shard_path(self, index: int) -> Path:
        return self.dir / layout.shard_name(index, SHARD_SUFFIX)

    # -- metadata -------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any] | None:
        return read_json(self.meta_path) if self.meta_path.exists() else None

    def read_complete(self, missing: str, unfinished: str = "") -> tuple[dict[str, Any], list]:
        """(meta, shard plan) of a finished store: every shard present (`missing`: what to do without a store)."""
        meta = self.read_meta()
        if meta is None:
            raise FileNotFoundError(f"{self.meta_path}: no sample store ({missing})")
        if meta.get("format") != STORE_FORMAT:
            raise ValueError(f"{self.meta_path}: store format {meta.get('format')} is not {STORE_FORMAT}")
        gen = meta["generation"]
        plan = shard_plan(gen["num_problems"], gen["shard_size"], gen["sampling"]["seed"])
        absent = [i for i in range(len(plan)) if not self.shard_path(i).exists()]
        if absent:
            raise ValueError(f"{self.dir}: shards {absent[:10]} are missing{unfinished}")
        return meta, plan

    def open(self, meta: dict[str, Any], *, overwrite: bool, shard_rows: Sequence[int]) -> list[int]:
        """Start or resume the store for `meta`; returns the indices of complete shards.

        On resume the stored meta must equal `meta` on the RESUME_KEYS; otherwise the store is refused,
        or with `overwrite` discarded and started afresh. Matching samples are always kept, so `overwrite` never
        costs a resumable run its work. Kept shards are read back first and one without its `shard_rows` rows
        is set aside instead of being counted complete.
        """
        existing = self.read_meta()
        if existing is not None:
            diffs = _diff({k: existing.get(k) for k in RESUME_KEYS}, {k: meta.get(k) for k in RESUME_KEYS})
            if not diffs:
                self.set_aside_damaged(shard_rows)
                return self.complete_shards()
            if not overwrite:
                raise ValueError(f"{self.meta_path}: the stored samples were generated with different settings "
                                 f"({'; '.join(diffs)}); use another --out or pass --overwrite to discard them")
            shutil.rmtree(self.dir)
        elif self.dir.exists() and any(self.dir.glob(layout.shard_glob(SHARD_SUFFIX))):
            if not overwrite:
                raise ValueError(f"{self.dir}: shard files without {layout.SAMPLES_META}; "
                                 "pass --overwrite to start afresh")
            shutil.rmtree(self.dir)
        write_json_atomic(self.meta_path, meta)
        return []

    def complete_shards(self) -> list[int]:
        if not self.dir.exists():
            return []
        indices = (layout.shard_index(p.name, SHARD_SUFFIX) for p in self.dir.iterdir())
        return sorted(i for i in indices if i is not None)

    def set_aside_damaged(self, shard_rows: Sequence[int]) -> None:
        """Check every present shard against its expected row count; move the damaged ones to samples/corrupt/
        (with a timestamp), so that they are regenerated."""
        import pyarrow.parquet as pq

        for index in self.complete_shards():
            path, why = self.shard_path(index), "not in the shard plan"
            if index < len(shard_rows):
                try:
                    rows = pq.read_table(path, columns=list(CHECKED_COLUMNS)).num_rows
                    why = None if rows == shard_rows[index] else f"{rows} rows, expected {shard_rows[index]}"
                except Exception as err:  # noqa: BLE001 - any reader error means the file is damaged
                    why = f"unreadable ({type(err).__name__}: {str(err)[:200]})"
            if why:
                target = self.dir / layout.CORRUPT_DIR / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}"
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
                print(f"eval: {path} is damaged ({why}); moved to {target}, it will be regenerated", file=sys.stderr)

    # -- shards ---------------------------------------------------------------------------
    def write_shard(self, index: int, rows: dict[str, Sequence[Any]]) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([(c, getattr(pa, t)()) for c, t in SHARD_TYPES.items()])
        table = pa.Table.from_pydict({c: list(rows[c]) for c in SHARD_TYPES}, schema=schema)
        path = self.shard_path(index)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        return path

    def read_shard(self, index: int, columns: Iterable[str] | None = None) -> dict[str, list]:
        import pyarrow.parquet as pq

        # callers read shards they found complete (complete_shards, read_complete)
        return pq.read_table(self.shard_path(index), columns=list(columns) if columns else None).to_pydict()

    # -- timings (kept apart so that shard files are byte-identical across reruns) --------
    def timing_path(self, index: int) -> Path:
        return self.dir / layout.SAMPLES_TIMING_DIR / layout.shard_name(index, "json")


def _diff(stored: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _diff(a, b, f"{prefix}{key}.")
        elif json.dumps(a) != json.dumps(b):
            diffs.append(f"{prefix}{key}: stored {a!r}, now {b!r}")
    return diffs
