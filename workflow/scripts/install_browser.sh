#!/usr/bin/env bash
# Install headless Chromium and its WebDriver from Debian's packages (chromium, chromium-driver), for
# the test that opens the MLflow UI (tests/test_tracking.py). Idempotent; needs root and apt (Debian 12).
set -euo pipefail

PACKAGES=(chromium chromium-driver)

log() { printf '[install_browser] %s\n' "$*" >&2; }

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
    export DEBIAN_FRONTEND=noninteractive
    # Another apt-get (e.g. install_slurm.sh in a parallel shell) may hold the dpkg lock: wait for it.
    apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
    log "installing ${missing[*]}"
    # A fresh machine has no package lists; a stale list can name files the mirror dropped.
    if ! apt_get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        apt_get update -q
        apt_get install -y -q --no-install-recommends "${missing[@]}"
    fi
fi

for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; exit 1; }
done
log "ok: $(chromium --version 2>/dev/null | head -n1), $(chromedriver --version 2>/dev/null | head -n1)"
