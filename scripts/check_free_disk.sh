#!/usr/bin/env bash
# Refuse to start installing when the disk cannot hold the environments still to be made, so a
# small disk fails at once with the sizes, not minutes later with pip's "No space left on device"
# and a half-built environment.
#
#   scripts/check_free_disk.sh VENV:GB [VENV:GB ...]
#
# Each VENV that has no interpreter yet counts with GB (its size once installed, plus room for
# pip's unpacking). Set DFLASH_SKIP_DISK_CHECK=1 to install anyway.
set -euo pipefail

[[ -n "${DFLASH_SKIP_DISK_CHECK:-}" ]] && exit 0
needed=0
missing=()
for pair in "$@"; do
    venv=${pair%%:*}
    gb=${pair##*:}
    if [[ ! -x $venv/bin/python ]]; then
        needed=$((needed + gb))
        missing+=("$venv (~${gb} GB)")
    fi
done
((needed == 0)) && exit 0

# Free space where the first environment goes (its parent exists even when it does not).
first=${1%%:*}
where=$(dirname "$first")
free_gb=$(df --output=avail -BG "$where" | tail -1 | tr -dc '0-9')
if ((free_gb < needed)); then
    {
        echo "setup: not enough free disk under $where: ${free_gb} GB free, ${needed} GB needed for"
        printf '  %s\n' "${missing[@]}"
        echo "  Free some space (pip's cache: pip cache purge) or set DFLASH_SKIP_DISK_CHECK=1."
    } >&2
    exit 1
fi
