#!/usr/bin/env bash
# Install headless Chromium and its WebDriver from Debian's packages (chromium, chromium-driver), for
# the test that opens the MLflow UI (tests/test_tracking.py). Idempotent; needs root and apt (Debian 12).
set -euo pipefail
# shellcheck source=lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"

apt_install_missing install_browser chromium chromium-driver

for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null 2>&1 || { echo "[install_browser] missing after install: $tool" >&2; exit 1; }
done
echo "[install_browser] ok: $(chromium --version 2>/dev/null | head -n1), $(chromedriver --version 2>/dev/null | head -n1)" >&2
