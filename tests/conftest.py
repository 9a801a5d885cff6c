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


@pytest.fixture(autouse=True, scope="session")
def _sqlite_artifacts_resolve():
    """Tests read SQLite stores' artifacts (`mlflow-artifacts:` URIs) with plain MLflow clients; the package's
    entry point makes them resolve (repexp.tracking.artifacts), which an install made before that entry point
    lacks: registered here too (once per test process: importing MLflow's registry costs 2-3 s)."""
    from repexp.tracking import artifacts

    artifacts.register()
    yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """The tiny model is overhead-bound; on a shared 2-core machine two OpenMP threads stall each
    other whenever the other core is busy (15-60x slower per step, docs/performance.md)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
