"""The README's and the docs' commands work exactly as written.

A new user copies commands from README.md. Once, `snakemake --profile local --configfile
configs/local.yaml all` failed for everyone (`--configfile` takes several values, so `all` was read
as a second config file) while CI, which puts targets first, passed. So these tests read the
commands out of the markdown itself:

- every `snakemake …` line in README.md and docs/*.md (code blocks and inline code) is parsed
  with Snakemake's own argument parser: every `--configfile` value must be a config file (a
  `configs/` one must exist), so no target is swallowed by the multi-value option;
- every command in the README's code blocks runs, in dry-run form where running it for real would
  mean the whole pipeline or test suite (`-n` for Snakemake, `--collect-only` for pytest), fully
  where it is short (the MLflow UI is started and must answer).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
PLACEHOLDER = re.compile(r"[<>…$]|\bCFG\b|\.\.\.")  # a command with a placeholder to fill in is a template


def code_blocks(path: Path) -> list[str]:
    """The fenced shell blocks of a markdown file."""
    blocks, lang, lines = [], None, []
    for line in path.read_text().splitlines():
        fence = re.match(r"^\s*```(\w*)\s*$", line)
        if fence and lang is None:
            lang, lines = fence.group(1).lower(), []
        elif fence:
            if lang in SHELL_LANGS:
                blocks.append("\n".join(lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def commands(block: str) -> list[str]:
    """Command lines of a shell block: continuations joined, comments dropped, `a && b` split."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # not a shell line (a YAML or Python snippet in a console block)
            continue
        if not words:
            continue
        text = shlex.join(words)
        out.extend(part.strip() for part in text.split(" '&&' ") if part.strip())
    return out


def inline_snakemake(path: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"`(snakemake [^`]+)`", path.read_text())]


def snakemake_lines() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        lines = [c for b in code_blocks(path) for c in commands(b)] + inline_snakemake(path)
        found += [(path.name, line) for line in lines if line.startswith("snakemake ")]
    return found


def test_every_snakemake_command_in_readme_and_docs_parses_as_intended():
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    lines = snakemake_lines()
    assert any(name == "README.md" for name, _ in lines)
    for name, line in lines:
        words = shlex.split(line)[1:]
        if PLACEHOLDER.search(line) or {"--version", "--help", "-h"} & set(words):
            continue
        try:
            args = parser.parse_args(words)
        except SystemExit:
            pytest.fail(f"{name}: `{line}` is not a valid snakemake command line")
        for configfile in args.configfile or []:
            # a target after --configfile is read as one more config file (the newcomer's error)
            assert configfile.suffix in (".yaml", ".yml", ".json"), f"{name}: `{line}` reads {configfile} as a config file"
            if configfile.parts[0] == "configs":
                assert (REPO / configfile).is_file(), f"{name}: `{line}`: {configfile} does not exist"
        for target in args.targets or []:
            assert not target.endswith((".yaml", ".yml")), f"{name}: `{line}` has a config file as a target"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_and_check(command: list[str], env: dict, port: int, cwd: Path) -> None:
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    assert response.status == 200
                    return
            except OSError:
                time.sleep(2)
        pytest.fail(f"`{shlex.join(command)}` did not answer within 240 s")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def dry_form(words: list[str]) -> list[str] | None:
    """How the test runs a README command: dry-run flags for long commands; None when it cannot run here."""
    if words[0] == "snakemake":
        return [*words, "-n"]
    if words[:2] == ["bash", "workflow/scripts/setup.sh"] and words[2] == "run":
        return [*words, "-n"]
    if words[:2] == ["bash", "workflow/scripts/setup.sh"] and words[2] == "test":
        return [*words, "--collect-only", "-q", "tests/test_passk.py"]
    return words


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
    venv_bin = REPO / ".venv" / "bin"
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"}
    ran = []
    for block in code_blocks(REPO / "README.md"):
        for line in commands(block):
            words = shlex.split(line)
            if words[0] == "conda":
                # conda is not installable here; the file it reads must exist and name this project's extras
                assert (REPO / "environment.yml").is_file()
                continue
            if words[0] == "export":
                for assignment in words[1:]:
                    key, _, value = assignment.partition("=")
                    env[key] = value
                continue
            command = dry_form(words)
            if "mlflow" in Path(command[0]).name and command[1:2] == ["ui"]:
                # from a directory laid out like the checkout after the run (.venv, results/mlflow/),
                # so the test leaves no store in the checkout; on a free port instead of 5000
                (tmp_path / ".venv").symlink_to(REPO / ".venv")
                (tmp_path / "results" / "mlflow").mkdir(parents=True)
                port = _free_port()
                _serve_and_check([*command, "--port", str(port)], env, port, cwd=tmp_path)
                ran.append(line)
                continue
            if shutil.which(command[0], path=env["PATH"]) is None and not (REPO / command[0]).exists():
                pytest.fail(f"README command `{line}`: {command[0]} not found")
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"README command `{line}` failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            ran.append(line)
    assert any("setup.sh run" in line for line in ran) and any("setup.sh test" in line for line in ran)
    assert any(line.startswith("snakemake") for line in ran) and any(" ui " in line for line in ran)
