"""`trl.rollout_engine` (issue 43): its rules, its mapping onto TRL's real `GRPOConfig`, the vLLM memory
arithmetic tied to `gpu_share: auto`, and the errors on a machine without CUDA or vLLM (this one: the CPU tests
run where vLLM cannot). The vLLM path itself runs on a GPU only (benchmarks/trl_step.py --engines hf vllm).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from pathlib import Path

import pytest
import yaml

from repexp import config as C
from repexp import gpus as G
from repexp import pipeline as P
from repexp.trl import settings as S

REPO = Path(__file__).resolve().parents[1]
PILOT = REPO / "configs" / "pilot.yaml"
H100 = "0, GPU-h100-a, NVIDIA H100 80GB HBM3, 81559\n"
H200 = "0, GPU-h200-a, NVIDIA H200, 143771\n"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
# SmolLM2-135M-Instruct's attention (its config.json): 30 layers, 9 heads of 64, 3 key-value heads
SMOLLM2 = types.SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
STOP_IDS = [2]
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
            "num_generations", "seed", "generation_batch_size", "steps_per_generation", "per_device_train_batch_size")


def pilot_raw(**sections) -> dict:
    raw = yaml.safe_load(PILOT.read_text())
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def pilot_run(engine: str, gpus: str = H100, **sections) -> C.RunConfig:
    """A pilot training job's resolved config, as the workflow on a host with `gpus` composes it."""
    cfg = C.load(pilot_raw(trl={"rollout_engine": engine, **sections.pop("trl", {})}, **sections),
                 gpus=G.parse_table(gpus))
    spec = next(spec for spec in C.sweep_runs(cfg) if spec.method == "repexp")
    return C.compose(cfg, spec)


# --------------------------------------------------------------------------- mapping onto GRPOConfig


def test_hf_is_the_default_and_its_grpo_config_is_unchanged():
    assert C.TrlConfig().rollout_engine == "hf"
    rc = pilot_run("hf")
    plan = S.plan_steps(rc, num_train_prompts=1000)
    kwargs = S.grpo_config_kwargs(rc, plan, output_dir="out", use_cpu=True)
    assert kwargs["use_vllm"] is False
    assert not any(key.startswith("vllm_") for key in kwargs) and "generation_kwargs" not in kwargs
    from trl import GRPOConfig

    args = GRPOConfig(**kwargs)
    assert not args.use_vllm and args.generation_kwargs is None


def test_vllm_maps_onto_trls_colocate_mode_with_the_same_sampling():
    from trl import GRPOConfig

    hf, vllm = pilot_run("hf"), pilot_run("vllm")
    plan = S.plan_steps(vllm, num_train_prompts=1000)
    hf_args = GRPOConfig(**S.grpo_config_kwargs(hf, plan, output_dir="out", use_cpu=True))
    kwargs = S.grpo_config_kwargs(vllm, plan, output_dir="out", use_cpu=True, stop_token_ids=STOP_IDS)
    args = GRPOConfig(**kwargs)  # the real TRL config: its own __post_init__ checks run
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size == 1
    assert args.vllm_gpu_memory_utilization == pytest.approx(0.03)  # a quarter of the 12 % an H100 share gives
    assert args.vllm_max_model_length == 128 + 16  # the pilot's longest kept prompt plus its response
    assert not args.vllm_importance_sampling_correction and not args.vllm_enable_sleep_mode
    assert args.generation_kwargs == {"stop_token_ids": STOP_IDS}
    for name in SAMPLING:  # temperature, top_p, top_k off, tokens, n per prompt, seed, batch geometry
        assert getattr(args, name) == getattr(hf_args, name), name
    assert (args.temperature, args.top_p, args.top_k, args.max_completion_length, args.num_generations) == (
        1.0, 1.0, 0, 16, 8)
    # everything else in the two configs is the same too
    differ = {f.name for f in dataclasses.fields(args) if getattr(args, f.name) != getattr(hf_args, f.name)}
    assert differ == {"use_vllm", "vllm_gpu_memory_utilization", "vllm_max_model_length",
                      "vllm_importance_sampling_correction", "generation_kwargs"}
    with pytest.raises(ValueError, match="stop token"):
        S.grpo_config_kwargs(vllm, plan, output_dir="out", use_cpu=True)
    sleepy = pilot_run("vllm", trl={"vllm_sleep_mode": True})
    assert GRPOConfig(**S.grpo_config_kwargs(sleepy, plan, output_dir="o", use_cpu=True,
                                             stop_token_ids=STOP_IDS)).vllm_enable_sleep_mode


def test_the_engine_is_part_of_the_training_identity_and_its_memory_settings_are_not():
    base = C.training_hash(pilot_run("hf"))
    assert C.training_hash(pilot_run("vllm")) != base  # other draws: an hf run's results are not reused
    vllm = C.training_hash(pilot_run("vllm"))
    for trl in ({"vllm_kv_cache_gib": 2}, {"vllm_gpu_memory_utilization": 0.02}, {"vllm_enforce_eager": False},
                {"vllm_sleep_mode": True}):
        assert C.training_hash(pilot_run("vllm", trl=trl)) == vllm, trl


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("gpus, cap, utilization", [(H100, 0.12, 0.03), (H200, 0.07, 0.0175), ("", None, 0.25)])
def test_the_engines_memory_is_a_part_of_the_trainings_auto_share(gpus, cap, utilization):
    """vLLM's gpu_memory_utilization is a fraction of the WHOLE GPU: a quarter of the training's own cap, which
    `gpu_share: auto` sets (12 % of an H100, 7 % of an H200); without a cap, a quarter of the GPU."""
    rc = pilot_run("vllm", gpus)
    assert rc.trl.gpu_memory_fraction == cap
    assert C.trl_vllm_memory_utilization(rc.trl) == pytest.approx(utilization)
    given = pilot_run("vllm", gpus, trl={"vllm_gpu_memory_utilization": 0.02})
    assert C.trl_vllm_memory_utilization(given.trl) == 0.02


def test_the_kv_cache_holds_one_steps_rollouts_and_fits_the_engines_part():
    rc = pilot_run("vllm")
    per_token = S.kv_bytes_per_token(SMOLLM2, 2)
    assert per_token == 2 * 30 * 3 * 64 * 2 == 23040
    kv = S.vllm_kv_cache_bytes(rc, SMOLLM2)  # 32 prompts × 8 rollouts, (128 + 16) tokens = 9 blocks + 1
    assert kv == 256 * 10 * 16 * per_token and 0.87 < kv / 2**30 < 0.88
    assert S.vllm_kv_cache_bytes(dataclasses.replace(rc, trl=dataclasses.replace(rc.trl, dtype="float32")),
                                 SMOLLM2) == 2 * kv
    assert S.vllm_kv_cache_bytes(pilot_run("vllm", trl={"vllm_kv_cache_gib": 0.5}), SMOLLM2) == 2**29
    h100 = 81559 * 2**20
    weights = 134_515_008 * 2  # SmolLM2-135M in bfloat16
    S.check_vllm_memory(rc, weights_bytes=weights, kv_cache_bytes=kv, gpu_total_bytes=h100)  # 1.1 of 2.4 GiB
    with pytest.raises(C.ConfigError, match=r"^trl\.vllm_kv_cache_gib: the rollout engine needs 4\.2"):
        big = pilot_run("vllm", trl={"vllm_kv_cache_gib": 4})
        S.check_vllm_memory(big, weights_bytes=weights, kv_cache_bytes=S.vllm_kv_cache_bytes(big, SMOLLM2),
                            gpu_total_bytes=h100)
    with pytest.raises(C.ConfigError, match=r"^trl\.vllm_gpu_memory_utilization: the rollout engine needs"):
        S.check_vllm_memory(pilot_run("vllm", trl={"vllm_gpu_memory_utilization": 0.005}), weights_bytes=weights,
                            kv_cache_bytes=kv, gpu_total_bytes=h100)
    assert S.vllm_engine_kwargs(rc, kv) == {"dtype": "bfloat16", "kv_cache_memory_bytes": kv, "enforce_eager": True,
                                            "seed": rc.seed}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("sections, key", [
    ({"trl": {"device": "cpu"}}, r"trl\.rollout_engine: 'vllm' generates on a GPU, but trl\.device is 'cpu'"),
    ({"resources": {"train": {"gpu": 0}}}, r"trl\.rollout_engine: 'vllm' generates on a GPU, but resources\.train"),
    ({"trl": {"vllm_gpu_memory_utilization": 0.2}}, r"trl\.vllm_gpu_memory_utilization: 0\.2 of the GPU.*0\.12"),
    ({"trl": {"rollout_engine": "sglang"}}, r"trl\.rollout_engine: 'sglang' is not one of hf, vllm"),
    ({"task_overrides": {"arith-mid": {"trl": {"device": "cpu"}}}}, r"task_overrides\.arith-mid\.trl\.device"),
])
def test_the_pipeline_refuses_a_vllm_engine_it_cannot_run_naming_the_key(sections, key):
    trl = {"rollout_engine": "vllm", **sections.pop("trl", {})}
    with pytest.raises(C.ConfigError, match=key):
        C.load(pilot_raw(trl=trl, **sections), gpus=G.parse_table(H100))


def test_before_any_job_the_host_must_have_cuda_and_vllm():
    """`repexp.pipeline.check_host` (the workflow's onstart, on the host that runs the jobs): this CPU machine has
    no vllm; with no GPU table it has no CUDA either."""
    raw = pilot_raw(trl={"rollout_engine": "vllm"})
    no_gpu = P.setup(C.parse(raw), REPO, REPO, gpus=[])
    with pytest.raises(C.ConfigError, match=r"^trl\.rollout_engine: 'vllm' generates on a CUDA GPU, but this host"):
        P.check_host(no_gpu, {"train", "eval"})
    P.check_host(no_gpu, {"eval", "aggregate"})  # trainings done: nothing to generate with
    hf = P.setup(C.parse(pilot_raw(trl={"rollout_engine": "hf"})), REPO, REPO, gpus=[])
    P.check_host(hf, {"train"})
    with_gpu = P.setup(C.parse(raw), REPO, REPO, gpus=G.parse_table(H100))
    assert any("vLLM rollouts 0.03 of the GPU" in line for line in with_gpu.gpu_lines())
    if HAS_VLLM:
        P.check_host(with_gpu, {"train"})
    else:
        with pytest.raises(C.ConfigError, match=r"^trl\.rollout_engine: 'vllm' needs the vllm package"):
            P.check_host(with_gpu, {"train"})


def test_the_trainer_refuses_vllm_without_cuda_before_loading_anything(tmp_path, capsys):
    import torch

    from repexp.trl.train import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = pilot_run("vllm", gpus="", trl={"device": "auto"})
    rc = dataclasses.replace(rc, run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "nowhere"),
                             model=str(tmp_path / "no-model"))
    job = tmp_path / "job.yaml"
    job.write_text(C.dump_yaml(rc))
    assert main(["--config", str(job)]) == 2
    err = capsys.readouterr().err
    assert "trl.rollout_engine: 'vllm' generates on a CUDA GPU, but this job's machine has none" in err
    if not HAS_VLLM:
        with pytest.raises(C.ConfigError, match=r"trl\.rollout_engine: 'vllm' needs the vllm package, which here"):
            S.check_rollout_host(rc, cuda=True, where="here")
    with pytest.raises(C.ConfigError, match=r"^trl\.rollout_engine: 'vllm' generates on a GPU, but trl\.device"):
        S.check_run_config(dataclasses.replace(rc, trl=dataclasses.replace(rc.trl, device="cpu")))


# --------------------------------------------------------------------------- the same sequences


def test_completions_must_end_as_the_generate_paths_do():
    S.check_completions([[5, 6, 2], [5, 6, 7, 8], [2]], STOP_IDS, max_tokens=4)  # stop kept; cut at max; stop only
    for bad, match in (([[5, 2, 6]], "stop token 2 before its end"), ([[5, 6]], "without a final stop token"),
                       ([[5, 6, 7, 8, 9]], "more than max_completion_length 4")):
        with pytest.raises(RuntimeError, match=match):
            S.check_completions(bad, STOP_IDS, max_tokens=4)


def test_trls_llm_gets_the_engine_settings_only_while_the_trainer_builds_it(monkeypatch):
    """TRL 1.16 builds `vllm.LLM(...)` itself without dtype, KV cache, enforce_eager or the run's seed: the trainer
    adds them for that call (here vLLM's `LLM` is a stand-in recording its arguments; this machine has no vLLM)."""
    from trl.generation import vllm_generation

    from repexp.trl.train import _vllm_engine_args

    calls = []
    stand_in = lambda **kwargs: calls.append(kwargs)  # noqa: E731
    monkeypatch.setattr(vllm_generation, "LLM", stand_in, raising=False)
    extra = {"dtype": "bfloat16", "kv_cache_memory_bytes": 123, "enforce_eager": True, "seed": 7}
    with _vllm_engine_args(extra):
        vllm_generation.LLM(model="m", seed=0, gpu_memory_utilization=0.03)
    assert calls == [{"model": "m", "seed": 7, "gpu_memory_utilization": 0.03, "dtype": "bfloat16",
                      "kv_cache_memory_bytes": 123, "enforce_eager": True}]
    assert vllm_generation.LLM is stand_in
    with _vllm_engine_args(None):
        assert vllm_generation.LLM is stand_in
    monkeypatch.delattr(vllm_generation, "LLM")
    with pytest.raises(C.ConfigError, match="trl.rollout_engine"), _vllm_engine_args(extra):
        pass


def test_the_stop_tokens_are_trls_eos_token_ids(tmp_path):
    """The engine stops on `policy_stop_token_ids` (read without the weights), which must equal what TRL's trainer
    computes for the generate path (`GRPOTrainer.eos_token_ids`), on the offline tiny model."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from repexp.models import build_tiny_qwen2
    from repexp.trl.train import _trainer_class, policy_stop_token_ids

    model = build_tiny_qwen2(tmp_path / "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=4, report_to="none")
    trainer = _trainer_class()(
        model=AutoModelForCausalLM.from_pretrained(model), args=args, processing_class=tokenizer,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * 2))
    assert policy_stop_token_ids(str(model), tokenizer) == list(trainer.eos_token_ids)


def test_each_training_gets_its_own_rendezvous_port():
    """Trainings started side by side must not share TRL's first-choice port 29500 (EADDRINUSE on the GPU)."""
    import socket

    from repexp.trl.train import own_rendezvous_port

    ports = []
    for _ in range(3):
        env: dict = {}
        ports.append(own_rendezvous_port(env))
        assert env["MASTER_PORT"] == str(ports[-1]) and env["MASTER_ADDR"] == "127.0.0.1"
        assert ports[-1] not in (29500, 23456, 12355, 12345)
    with socket.socket() as probe:  # the chosen port is free to listen on, on every interface (TCPStore's)
        probe.bind(("", ports[-1]))
    env = {"MASTER_PORT": "31234", "MASTER_ADDR": "10.0.0.7"}
    assert own_rendezvous_port(env) == 31234 and env == {"MASTER_PORT": "31234", "MASTER_ADDR": "10.0.0.7"}  # kept
    for asked in ("auto", "0", " "):  # as TRL reads them: a free port is wanted
        for address in ("localhost", "127.0.0.1", socket.gethostname()):  # whatever MASTER_ADDR names
            env = {"MASTER_PORT": asked, "MASTER_ADDR": address}
            assert own_rendezvous_port(env) == int(env["MASTER_PORT"]) > 0 and env["MASTER_ADDR"] == address
    with socket.socket() as busy:  # a port in use is never handed out
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert all(own_rendezvous_port({}) != taken for _ in range(20))
    with pytest.raises(C.ConfigError, match="MASTER_PORT='x29500'"):
        own_rendezvous_port({"MASTER_PORT": "x29500"})
