#!/bin/sh
# Round trip for gen_trajectory.py --restore-cmd: commit IN lossily to a scratch repository
# (kept across calls, so later commits use deltas and the neighbourhood search, as a real run
# would) and check it out to OUT.
#   MDL      the mdl binary (default: target/release/mdl next to this script)
#   MDL_RT   the scratch repository (default: $TMPDIR/mdl-roundtrip)
#   MDL_RT_ARGS  extra `mdl commit` arguments (default: --lossy)
#   MDL_RT_CONFIG  "key=value;key=value" applied when the repository is created
set -eu
in=$1 out=$2
here=$(cd "$(dirname "$0")/.." && pwd)
mdl=${MDL:-$here/target/release/mdl}
repo=${MDL_RT:-${TMPDIR:-/tmp}/mdl-roundtrip}
if [ ! -d "$repo/.mdl" ]; then
    mkdir -p "$repo"
    "$mdl" -C "$repo" init >/dev/null
    old_ifs=$IFS; IFS=';'
    for kv in ${MDL_RT_CONFIG:-}; do
        [ -n "$kv" ] && "$mdl" -C "$repo" config "${kv%%=*}" "${kv#*=}" >/dev/null
    done
    IFS=$old_ifs
fi
# shellcheck disable=SC2086
"$mdl" -C "$repo" commit "$in" -m "$(basename "$in")" ${MDL_RT_ARGS:---lossy} >/dev/null
"$mdl" -C "$repo" checkout HEAD -o "$out" --force >/dev/null
