"""Shared test set-up.

pytest runs with ``--import-mode=importlib``, which does not put tests/ on ``sys.path``; it is
added here so test modules import their helpers (``import _reliability_fixtures``) under one
name, shared by every module that uses them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def one_torch_thread():
    """The tiny model is overhead-bound; on a shared 2-core machine two OpenMP threads stall each
    other whenever the other core is busy (15-60x slower per step, docs/performance.md)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
