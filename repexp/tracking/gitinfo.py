"""The repexp checkout's git commit and branch (one `git` call per process, no MLflow import).

Node runs carry them as tags; `repexp.tracking.context.GitContext` hands them to MLflow.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def git_tags() -> dict[str, str]:
    """{git.commit, git.branch, mlflow.source.git.commit, mlflow.source.git.branch} of the checkout
    (one `git` call, cached per process); {} outside a git checkout."""
    if not (REPO_ROOT / ".git").exists():
        return {}
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD", "--abbrev-ref", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = out.stdout.split()
    if out.returncode != 0 or not lines:
        return {}
    tags = {"git.commit": lines[0], "mlflow.source.git.commit": lines[0]}
    if len(lines) > 1 and lines[1] != "HEAD":  # detached HEAD has no branch
        tags.update({"git.branch": lines[1], "mlflow.source.git.branch": lines[1]})
    return tags
