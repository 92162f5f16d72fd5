#!/usr/bin/env bash
# The bf16 mixed-precision runs issue 73's targets are measured on: the corpus model trained in
# bf16 with an fp32 master copy (`--master`), seed 0 (`traj-bf16-master`, the series the
# settings were developed on) and seed 11 at twice the learning rate (`traj-bf16-master-s11`,
# not tuned on). 10 checkpoints each, about 3 minutes each on 2 cores; cached like the corpus.
#   bench/lossy-bound/make-bf16-master.sh [CACHE_DIR]      then
#   MDL_EVAL_SERIES="traj-bf16-master traj-bf16-master-s11" scripts/lossy-eval.sh
set -euo pipefail
source "$(dirname "$0")/corpus-env.sh"
series() {
    local out="$cache/$1"
    shift
    if [ "$(ls "$out"/*.safetensors 2>/dev/null | wc -l)" -lt 10 ]; then
        rm -rf "$out.tmp"
        "$py" "$gen" --out "$out.tmp" --dtype bf16 --master "$@" >&2
        rm -rf "$out"
        mv "$out.tmp" "$out"
    fi
    echo "$out"
}
series traj-bf16-master --seed 0
series traj-bf16-master-s11 --seed 11 --lr 2e-3
