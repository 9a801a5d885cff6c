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
# shellcheck source=lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"

policy=/usr/sbin/policy-rc.d
if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary: written by install_slurm.sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

apt_install_missing install_slurm "${PACKAGES[@]}"

for tool in munged slurmctld slurmd sbatch squeue scontrol sinfo srun; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; exit 1; }
done
log "ok: $(slurmctld -V 2>/dev/null || echo slurmctld), $(munged -V 2>&1 | head -n1)"
