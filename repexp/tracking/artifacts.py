"""Artifact locations that survive a move of the results directory.

Runs record where their artifacts live. An absolute `file:///<results>/mlflow/artifacts/<run>` breaks
when the results directory is copied or moved (between cluster scratch and home, say): the UI then
finds nothing. So a SQLite store's experiment keeps its artifacts under `mlflow-artifacts:/`, MLflow's
own scheme for artifacts a tracking server serves: `mlflow-artifacts:/<run id>/artifacts` means that
path below the server's `--artifacts-destination`, which `repexp mlflow serve | ui` set to the
results directory's `mlflow/artifacts` wherever it is now.

Nodes log to the SQLite store without a server (offline). MLflow's own client resolves
`mlflow-artifacts:` only against an HTTP tracking URI; `register` makes it resolve, for a SQLite
tracking URI, to the same directory beside the database (`<results>/mlflow/artifacts/<path>`), the
place the server serves it from. Any other tracking URI keeps MLflow's own repository. It is MLflow's
`mlflow.artifact_repository` entry point of the package (pyproject.toml), so any MLflow client where repexp
is installed reads a SQLite store's artifacts; `Store` also registers it (an install whose metadata
predates the entry point).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Optional

from repexp.tracking.names import ARTIFACTS_DIR

SCHEME = "mlflow-artifacts"
ROOT = f"{SCHEME}:/"  # a SQLite store's experiment location: runs at mlflow-artifacts:/<run id>/artifacts


def local_path(tracking_uri: str, artifact_uri: str) -> Path:
    """The directory an `mlflow-artifacts:` URI names for a SQLite store: below `artifacts/` beside the database."""
    database = Path(tracking_uri[len("sqlite:///"):]).resolve()
    return database.parent / ARTIFACTS_DIR / urllib.parse.urlparse(artifact_uri).path.lstrip("/")


def repository(artifact_uri: str, tracking_uri: Optional[str] = None, registry_uri: Optional[str] = None):
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
    from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository
    from mlflow.tracking._tracking_service.utils import get_tracking_uri

    uri = tracking_uri or get_tracking_uri()
    if uri.startswith("sqlite:///"):
        return LocalArtifactRepository(local_path(uri, artifact_uri).as_uri(), tracking_uri=uri,
                                       registry_uri=registry_uri)
    return MlflowArtifactsRepository(artifact_uri, tracking_uri=tracking_uri, registry_uri=registry_uri)


def register() -> None:
    """Resolve `mlflow-artifacts:` for SQLite tracking URIs in this process (MLflow's repository otherwise)."""
    from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry

    _artifact_repository_registry.register(SCHEME, repository)
