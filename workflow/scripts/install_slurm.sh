#!/usr/bin/env bash
# Install the Debian packages of a single-host SLURM test cluster (tests/slurm_cluster.py):
# munge, slurmctld, slurmd and the client commands. Idempotent; needs root and apt (Debian 12).
#
# No slurmdbd/MariaDB: the test cluster has no accounting database. Snakemake's SLURM executor
# polls job states with `squeue` instead of `sacct` (docs/slurm.md explains why that is enough).
#
# The packages' init scripts would start daemons with the system config; the harness starts
# its own daemons, so service starts are denied during the install (policy-rc.d, exit 101).
set -euo pipefail

PACKAGES=(munge slurmctld slurmd slurm-client)

log() { printf '[install_slurm] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    log "must run as root (apt-get install)"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: this script supports Debian/Ubuntu only"
    exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    log "already installed: ${PACKAGES[*]}"
else
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# temporary: written by install_slurm.sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    cleanup() { if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi; }
    trap cleanup EXIT

    export DEBIAN_FRONTEND=noninteractive
    log "installing ${missing[*]}"
    # A fresh machine has no package lists; a stale list can name files the mirror dropped.
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
fi

for tool in munged slurmctld slurmd sbatch squeue scontrol sinfo srun; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; exit 1; }
done
log "ok: $(slurmctld -V 2>/dev/null || echo slurmctld), $(munged -V 2>&1 | head -n1)"
