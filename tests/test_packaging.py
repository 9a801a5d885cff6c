"""Packaging stays consistent: extras, pins, environment.yml, README commands and CI."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = PYPROJECT["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in raw]


def test_pins_hold_in_the_installed_environment():
    """Every exact pin of the CPU environment is what is actually installed."""
    seen = set()
    for extra in [None, "hf", "verl", "trl", "workflow", "figures", "dev"]:
        for req in _requirements(extra):
            if req.name == "repexp" or req.name in seen:
                continue
            seen.add(req.name)
            version = metadata.version(req.name)
            assert req.specifier.contains(version, prereleases=True), f"{req.name} {version} violates {req}"
    assert metadata.version("verl") == "0.9.1"
    assert metadata.version("torch").startswith("2.13.0")


def test_cpu_extra_covers_every_cpu_extra_and_environment_yml_uses_real_extras():
    extras = PYPROJECT["project"]["optional-dependencies"]
    cpu = Requirement(extras["cpu"][0])
    assert cpu.name == "repexp" and set(cpu.extras) == {"hf", "verl", "trl", "workflow", "figures", "dev"}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    (line,) = [p for p in pip_lines if p.startswith("-e .")]
    used = set(re.search(r"\[(.*)\]", line).group(1).split(","))
    assert used <= set(extras), used - set(extras)
    assert "verl" in used and "workflow" in used


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["bash workflow/scripts/setup.sh run", "bash workflow/scripts/setup.sh test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("bash ")] == [commands[1]]


def test_tests_directory_is_not_a_package():
    # verl and TransferQueue ship a top-level `tests` package; ours must not shadow it.
    assert not (ROOT / "tests" / "__init__.py").exists()


def test_setup_refuses_a_full_disk_before_installing_anything(tmp_path):
    """A disk without room for `.venv` gets setup.sh's own message and exit 1 before a venv is
    created, not pip's `OSError: [Errno 28]` half-way through an install (how CI ended on
    2026-12-04). `df` is the machine's, faked here to report 1,200 MiB free."""
    import shutil
    import stat
    import subprocess

    root = tmp_path / "repo"
    (root / "workflow" / "scripts").mkdir(parents=True)
    (root / "constraints").mkdir()
    shutil.copy(ROOT / "workflow" / "scripts" / "setup.sh", root / "workflow" / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy(ROOT / "constraints" / "cpu.txt", root / "constraints" / "cpu.txt")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    df = bin_dir / "df"
    df.write_text("#!/bin/sh\necho 'Filesystem 1048576-blocks Used Available Capacity Mounted on'\n"
                  "echo '/dev/x 100000 98800 1200 99% /'\n")
    df.chmod(df.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "workflow/scripts/setup.sh", "setup"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"setting up {root}/.venv needs about 4000 MiB free on the disk of {root}; 1200 MiB are free" \
        in proc.stderr, proc.stderr
    assert not (root / ".venv").exists()
