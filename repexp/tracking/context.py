"""Git tags of the repexp checkout, as an MLflow run context provider.

MLflow resolves the tags of a new run from its registered context providers
(`mlflow.tracking.context.registry.resolve_tags`). Its own git provider looks at the repository
of the entry script (`sys.argv[0]`): for `repexp` that is the virtual environment's `bin/`,
which may belong to another checkout or to none. `GitContext` reports the checkout this
package is imported from instead; it is registered through the `mlflow.run_context_provider`
entry point (pyproject.toml), so any run created with MLflow where repexp is installed gets
the commit. Node runs resolve their tags with it and ignore MLflow's git provider.

`git_tags()` is also called without MLflow (a node's record is prepared before MLflow is
imported), so it lives apart from the provider class.
"""

from __future__ import annotations

from mlflow.tracking.context.abstract_context import RunContextProvider

from repexp.tracking.gitinfo import git_tags


def resolve_run_tags(tags: dict[str, str]) -> dict[str, str]:
    """MLflow's context tags (user, source, ...) with repexp's git tags, then `tags` on top.

    Works whether or not the entry point is registered (a checkout that was not reinstalled)."""
    from mlflow.tracking.context.git_context import GitRunContext
    from mlflow.tracking.context.registry import resolve_tags

    return resolve_tags({**git_tags(), **tags}, ignore=[GitRunContext])


class GitContext(RunContextProvider):
    """The `mlflow.run_context_provider` entry point: git tags of the repexp checkout."""

    def in_context(self) -> bool:
        return bool(git_tags())

    def tags(self) -> dict[str, str]:
        return dict(git_tags())
