"""The GPUs of the host that runs the jobs, and the rule that shares them (`resources.<rule>.gpu_share: auto`).

    read_gpus()                -> this host's GPUs (nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES); [] without any
    auto_share(need_gib, gpus) -> the percent of one GPU a job takes: the smallest that holds its memory need
    memory_cap(share)          -> the job's memory cap as a fraction of its GPU (None: a whole GPU, no cap)
    place(index, gpus)         -> the GPU a job runs on: jobs are dealt round-robin over the GPUs

The workflow reads the table once, at its start on the host that runs the jobs (not under a cluster
executor, where every job gets whole GPUs); docs/pilot.md, "Sharing the GPU".

Pure: the standard library only (nvidia-smi is run as a subprocess; no torch import).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

QUERY = ("nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits")
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Gpu:
    index: int  # nvidia-smi's (PCI bus order): a job's CUDA_VISIBLE_DEVICES, with CUDA_DEVICE_ORDER=PCI_BUS_ID
    uuid: str  # a CUDA_VISIBLE_DEVICES entry may name it
    name: str
    memory_mib: int


def parse_table(text: str) -> list[Gpu]:
    """nvidia-smi's `index, uuid, name, memory.total` CSV rows (memory in MiB)."""
    gpus = []
    for line in text.splitlines():
        if line.strip():
            index, uuid, rest = line.split(",", 2)
            name, memory = rest.rsplit(",", 1)  # a name may hold a comma
            gpus.append(Gpu(int(index), uuid.strip(), name.strip(), int(float(memory))))
    return gpus


def visible(gpus: Sequence[Gpu], cuda_visible_devices: Optional[str]) -> list[Gpu]:
    """The GPUs a CUDA_VISIBLE_DEVICES value leaves (indices or UUIDs, in its order; unset: all)."""
    if cuda_visible_devices is None:
        return list(gpus)
    by_id = {key: gpu for gpu in gpus for key in (str(gpu.index), gpu.uuid)}
    return [by_id[item.strip()] for item in cuda_visible_devices.split(",") if item.strip() in by_id]


def read_gpus(env: Mapping[str, str] = os.environ) -> list[Gpu]:
    """This host's GPUs; [] where nvidia-smi is missing or fails (a CPU machine)."""
    if shutil.which(QUERY[0], path=env.get("PATH")) is None:
        return []
    try:
        proc = subprocess.run(QUERY, capture_output=True, text=True, timeout=30, env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return visible(parse_table(proc.stdout), env.get("CUDA_VISIBLE_DEVICES"))


def auto_share(need_gib: Optional[float], gpus: Sequence[Gpu]) -> int:
    """Percent of one GPU for a job that needs `need_gib` of its memory: the smallest share whose memory
    (share/100 of the smallest GPU) holds it, so as many jobs as fit run side by side. A whole GPU (100)
    when the need is not given or there is no GPU to measure; ValueError when one GPU cannot hold it."""
    if need_gib is None or not gpus:
        return 100
    memory_mib = min(gpu.memory_mib for gpu in gpus)
    share = math.ceil(100 * need_gib * MIB_PER_GIB / memory_mib - 1e-9)
    if share > 100:
        raise ValueError(f"{need_gib:g} GiB is more than the {memory_mib / MIB_PER_GIB:.1f} GiB of one GPU")
    return max(share, 1)


def memory_cap(share: int) -> Optional[float]:
    """A sharing job's memory cap, as a fraction of its GPU: its share (None for a whole GPU)."""
    return None if share >= 100 else share / 100


def place(index: int, gpus: Sequence[Gpu]) -> Gpu:
    """The GPU of the job with this index: round-robin, so each GPU gets every n-th job."""
    return gpus[index % len(gpus)]


def describe(gpus: Sequence[Gpu]) -> str:
    """'2 × NVIDIA H100 80GB HBM3 (81559 MiB)', or 'no GPU'."""
    if not gpus:
        return "no GPU"
    kinds: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        kinds[gpu.name, gpu.memory_mib] = kinds.get((gpu.name, gpu.memory_mib), 0) + 1
    return ", ".join(f"{count} × {name} ({memory} MiB)" for (name, memory), count in kinds.items())
