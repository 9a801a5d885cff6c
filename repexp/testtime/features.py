"""Features of an evaluation's stored samples: the frozen model's mean last hidden state, projected.

The feature of a sample is the training bonus's (docs/bonus.md): `repexp.features.completion_features`
(response tokens pooled, the first EOS included, the prompt in context) times a seeded
`repexp.elliptical.sparse_projection`. Prompts are rendered exactly as `repexp eval` rendered them; the
stored response text is re-tokenised and, as special tokens were skipped when it was decoded, EOS is
appended to responses that stopped. Projected features are cached per eval shard under `<out>/features/`
(`shard-<i>.pt` + `meta.json` with what determines them): an interrupted run resumes from the shards it
has, a rerun with other settings recomputes instead of mixing.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from repexp import layout
from repexp.io import atomic_path, read_json, write_json_atomic

FEATURES_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class FeatureSettings:
    model: str
    sparse_dim: int
    projection_seed: int
    batch_size: int
    dtype: str  # resolved: float32 | bfloat16 | float16
    device: str  # resolved: cpu | cuda[:i]

    def cache_key(self, generation: dict[str, Any]) -> dict[str, Any]:
        """What the cached features depend on (batching and device do not change them beyond rounding)."""
        return {"format": FEATURES_FORMAT, "model": self.model, "sparse_dim": self.sparse_dim,
                "projection_seed": self.projection_seed, "dtype": self.dtype, "generation": generation}


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return device


def _open_cache(cache_dir: Path, key: dict[str, Any]) -> None:
    meta = cache_dir / layout.SAMPLES_META
    if meta.exists():
        if read_json(meta) == key:
            return
        print(f"testtime: {cache_dir} holds features made with other settings; recomputing them", file=sys.stderr)
        for stale in cache_dir.glob(layout.shard_glob("pt")):
            stale.unlink()
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(meta, key)


def shard_features(store, problems, plan, settings: FeatureSettings, out_dir: Path,
                   generation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per problem id: {"index": sample indices, "score": scores, "features": [n, sparse_dim] float32 CPU}.

    Shards already cached under `out_dir/features/` with the same key are loaded, the rest computed.
    """
    import torch

    from repexp.elliptical import sparse_projection
    from repexp.evaluate.engines import encode_prompts, load_tokenizer
    from repexp.features import completion_features, load_backbone

    cache_dir = out_dir / layout.FEATURES_DIR
    _open_cache(cache_dir, settings.cache_key(generation))
    prompt_of = dict(zip(problems.problem_ids, problems.prompts))
    tokenizer = backbone = projection = None
    samples: dict[str, list[tuple]] = {}  # problem id → (sample index, score, shard, row) of its samples
    shard_tensors = []
    computed, started = 0, time.perf_counter()
    for i in range(len(plan)):
        shard = store.read_shard(i, ["problem_id", "sample_index", "response", "finish_reason", "score"])
        cached = cache_dir / layout.shard_name(i, "pt")
        if cached.exists():
            features = torch.load(cached, weights_only=True)
        else:
            if backbone is None:
                tokenizer = load_tokenizer(settings.model)
                backbone = load_backbone(settings.model, dtype=getattr(torch, settings.dtype),
                                         device=torch.device(settings.device), key="--model")
                projection = sparse_projection(backbone.config.hidden_size, settings.sparse_dim,
                                               seed=settings.projection_seed, device=settings.device)
            ids = sorted(set(shard["problem_id"]))
            prompt_ids = dict(zip(ids, encode_prompts(tokenizer, [prompt_of[pid] for pid in ids])))
            # the stored text skipped special tokens: re-append EOS to responses that stopped
            eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
            encoded = tokenizer(shard["response"], add_special_tokens=False)["input_ids"] if shard["response"] else []
            pooled = completion_features(
                backbone, [prompt_ids[pid] for pid in shard["problem_id"]],
                [list(r) + (eos if finish == "stop" else []) for r, finish in zip(encoded, shard["finish_reason"])],
                pad_token_id=tokenizer.pad_token_id, micro_batch_size=settings.batch_size,
            )
            features = (pooled @ projection).float().cpu()
            with atomic_path(cached) as tmp:
                torch.save(features, tmp)
            computed += len(features)
        if features.shape[0] != len(shard["problem_id"]):
            raise ValueError(f"{cached}: {features.shape[0]} feature rows for {len(shard['problem_id'])} samples")
        shard_tensors.append(features)
        for row, (pid, index, score) in enumerate(zip(shard["problem_id"], shard["sample_index"], shard["score"])):
            samples.setdefault(pid, []).append((int(index), float(score), i, row))
    if computed:
        seconds = time.perf_counter() - started
        print(f"testtime: features of {computed} samples in {seconds:.1f} s ({computed / seconds:.1f} samples/s)",
              file=sys.stderr)
    per_problem = {}
    for pid, taken in samples.items():  # in sample-index order
        index, score, shards, rows = zip(*sorted(taken))
        per_problem[pid] = {"index": list(index), "score": list(score),
                            "features": shard_tensors[shards[0]][torch.tensor(rows, dtype=torch.long)]}
    return per_problem
