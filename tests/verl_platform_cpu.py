"""A CPU "accelerator" for verl 0.9.1, so verl's own FSDP engine, worker and checkpoint code run in CPU tests.

verl resolves its device platform once per process (`verl.plugin.platform.get_platform`) and
its FSDP engine module caches the device name at import; `cpu_platform()` registers and selects this
platform and patches that cached name, plus one accelerator-only detail (pinned memory for
forward-only FSDP2 offload). Both helpers are context managers that undo themselves, so a test
module using them leaves the rest of the process as it found it. Nothing here is used on GPU
machines, nor by the pipeline: tests/test_verl_runtime.py and the ``--cpu`` smoke run of
benchmarks/verl_engine_check.py import it (tests/ on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import socket
from types import ModuleType
from typing import Any, Optional

import torch

from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_base import PlatformBase

_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"


class _NoCudaDeviceModule:
    """`torch.cpu` plus the no-op memory statistics verl logs after every engine call."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def max_memory_allocated(*args: Any, **kwargs: Any) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(*args: Any, **kwargs: Any) -> int:
        return 0

    @staticmethod
    def memory_allocated(*args: Any, **kwargs: Any) -> int:
        return 0

    @staticmethod
    def memory_reserved(*args: Any, **kwargs: Any) -> int:
        return 0

    @staticmethod
    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def get_device_name(*args: Any, **kwargs: Any) -> str:  # verl's MFU estimate after an actor update
        return "CPU"

    @staticmethod
    def reset_peak_memory_stats(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def set_device(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def get_rng_state() -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor) -> None:
        # verl's checkpoint manager restores the "cpu" entry again through the device module
        torch.set_rng_state(state)


class CPUPlatform(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _NoCudaDeviceModule()  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        # FSDP and `module.to(get_device_id())` accept the string "cpu"
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


@contextlib.contextmanager
def cpu_platform():
    """verl's platform is this CPU platform inside the block; the previous state is restored after."""
    import importlib

    from torch.distributed.fsdp import CPUOffloadPolicy

    previous = platform_manager._current_platform
    platform_manager.PlatformRegistry.register(platform="cpu")(CPUPlatform)
    platform = CPUPlatform()
    platform_manager.set_platform(platform)
    engine_module = importlib.import_module(_ENGINE_MODULE)
    saved = engine_module.device_name, engine_module.CPUOffloadPolicy
    engine_module.device_name = platform.device_name  # cached at import by verl

    def unpinned_cpu_offload_policy(pin_memory: bool = True) -> CPUOffloadPolicy:
        # verl gives forward-only FSDP2 engines CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator
        return CPUOffloadPolicy(pin_memory=False)

    engine_module.CPUOffloadPolicy = unpinned_cpu_offload_policy
    try:
        yield platform
    finally:
        engine_module.device_name, engine_module.CPUOffloadPolicy = saved
        platform_manager._current_platform = previous


_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def single_process_group():
    """A one-rank gloo process group plus the env verl's `Worker` reads; both undone after the block.

    It makes verl's `initialize_global_process_group_ray` a no-op (its default backend string
    would name gloo twice on the CPU platform)."""
    if torch.distributed.is_initialized():
        raise RuntimeError("a torch.distributed process group already exists in this process")
    saved = {key: os.environ.get(key) for key in _DIST_ENV}
    port = _free_port()
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
