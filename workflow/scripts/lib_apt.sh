# Sourced by install_slurm.sh and install_browser.sh: install missing Debian packages (root + apt).
#   apt_install_missing LOG_PREFIX PKG...    exits 1 (with the reason) where it cannot install

apt_install_missing() {
    local prefix="$1"
    shift
    log_line() { printf '[%s] %s\n' "$prefix" "$*" >&2; }
    if [ "$(id -u)" != 0 ]; then
        log_line "must run as root (apt-get install)"
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log_line "apt-get not found: this script supports Debian/Ubuntu only"
        exit 1
    fi
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        log_line "already installed: $*"
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    # Another apt-get (a parallel install) may hold the dpkg lock: wait for it rather than fail.
    local apt=(apt-get -o DPkg::Lock::Timeout=600)
    log_line "installing ${missing[*]}"
    # A fresh machine has no package lists; a stale list can name files the mirror dropped.
    if ! "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        "${apt[@]}" update -q
        "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}"
    fi
}
