#!/usr/bin/env bash
# Everything that needs a GPU, in one script anyone with one can rerun:
#   1. the identical-bytes tests and kernel tests of mdl-gpu, ignored ones included (a missing
#      GPU fails instead of skipping), and a commit of device-resident input (mdl's
#      tests/device_input.rs); then, with the machine's CUDA torch, the Python package's
#      device-snapshot tests and the training loop's stall with the commit from device state
#      on either engine (bench/gpu-stall/run.py);
#   2. kernel throughput against the device's copy bandwidth (examples/kernel-bench.rs);
#   3. end-to-end `mdl commit` (lossless and --lossy) and `mdl checkout` of a GPT-2-sized
#      checkpoint with AdamW state (scripts/gpt2-checkpoint.py, PyTorch), CPU engine against GPU
#      engine in the same run, the CPU engine on two cores against all of them, and a check
#      that both engines stored the same bytes;
#   4. issue 45's targets from all of it (scripts/gpu-results.py).
#
#   scripts/gpu-check.sh          build and run (a GPU machine with Rust)
#   scripts/gpu-check.sh build    build release binaries into target/gpu-check (no GPU needed)
#   scripts/gpu-check.sh run      run them (a GPU machine without Rust: carry target/gpu-check)
#
# Results go to $OUT (or target/gpu-check/out): log.txt, kernels.md, e2e.md, and targets.md
# with results.json (issue 45's targets, one JSON object: copy it to bench/gpu/results.json and
# the table to docs/BENCHMARKS.md). A target not measured (or not built yet) is `null` there.
# MDL_CKPT_DIR=DIR uses the step*.safetensors already in DIR instead of generating them, and
# MDL_GPU_CHECK_BIN=DIR runs binaries from DIR (a smoke run of this script against binaries
# built with mdl-gpu's `emulate` feature needs neither a GPU nor PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MDL_GPU_CHECK_BIN:-target/gpu-check}
what=${1:-all}

build() {
    cargo build --release -p mdl-cli --bin mdl
    cargo build --release -p mdl-gpu --features bench --example kernel-bench
    mkdir -p "$BIN"
    cp target/release/mdl target/release/examples/kernel-bench "$BIN/"
    for t in identical kernels; do
        exe=$(cargo test --release -p mdl-gpu --test "$t" --no-run 2>&1 |
            grep -o "target/release/deps/$t-[0-9a-f]*" | tail -1)
        cp "$exe" "$BIN/test-$t"
    done
    exe=$(cargo test --release -p mdl --test device_input --no-run 2>&1 |
        grep -o "target/release/deps/device_input-[0-9a-f]*" | tail -1)
    cp "$exe" "$BIN/test-device-input"
    # The Python package (abi3), unpacked for PYTHONPATH: the device snapshot's test and stall
    # benchmark run with the machine's own torch.
    local venv
    venv=$(scripts/python-env.sh)
    rm -rf "$BIN/py" "$BIN/wheel"
    PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --release --quiet -m python/Cargo.toml -o "$BIN/wheel"
    "$venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$BIN"/wheel/*.whl "$BIN/py"
    rm -rf "$BIN/wheel"
    strip "$BIN"/* "$BIN"/py/mdl/*.so 2>/dev/null || true
    git rev-parse HEAD > "$BIN/commit.txt" 2>/dev/null || echo unknown > "$BIN/commit.txt"
    ls -la "$BIN"
}

run() {
    local out=${OUT:-$BIN/out}
    mkdir -p "$out"
    local log=$out/log.txt
    exec > >(tee -a "$log") 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    # NVRTC from the Python wheel when there is one (else the committed PTX is used).
    local nvrtc
    nvrtc=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
    [ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "== tests"
    # The NVRTC tests need the wheel; without it they stay ignored (and say so).
    if [ -n "$nvrtc" ]; then
        "$BIN/test-kernels" --nocapture --include-ignored
    else
        "$BIN/test-kernels" --nocapture
    fi
    local identical=true
    "$BIN/test-identical" --nocapture --include-ignored --test-threads=1 || identical=false
    # A commit of device-resident input: read where it lies, the same records as the CPU's.
    "$BIN/test-device-input" --nocapture --include-ignored || identical=false
    echo "== CUDA state (commit_state's device snapshot)"
    local work=${MDL_BENCH_DIR:-/tmp/mdl-gpu-check}
    rm -rf "$work" && mkdir -p "$work"
    local abs
    abs=$(cd "$BIN" && pwd)
    if [ -d "$BIN/py" ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        PYTHONPATH="$abs/py" MDL="$abs/mdl" python3 -m pytest -q -p no:cacheprovider \
            tests/python/test_snapshot.py || identical=false
        PYTHONPATH="$abs/py" python3 bench/gpu-stall/run.py --dir "$work" \
            --gib "${MDL_STALL_GIB:-4}" --reps 5 --mdl "$abs/mdl" --out "$out/stall.md" \
            --profile "$out/profile.md"
    else
        echo "no CUDA torch or no built package: the stall is not measured"
    fi
    echo "== kernels"
    "$BIN/kernel-bench" "${MDL_BENCH_MIB:-1024}" 20 | tee "$out/kernels.md"
    echo "== end to end"
    if [ -n "${MDL_CKPT_DIR:-}" ]; then
        mkdir -p "$work/ckpt" && cp "$MDL_CKPT_DIR"/step*.safetensors "$work/ckpt/"
    else
        python3 scripts/gpt2-checkpoint.py --out "$work/ckpt" ${MDL_GPT2_ARGS:-}
    fi
    local c1 c2
    c1=$(ls "$work"/ckpt/step*.safetensors | head -1)
    c2=$(ls "$work"/ckpt/step*.safetensors | tail -1)
    local bytes
    bytes=$(stat -c %s "$c1")
    now() { date +%s.%N; }
    # rate BYTES START: seconds since START and bytes per second.
    rate() { python3 -c "import sys,time; b,s=float(sys.argv[1]),time.time()-float(sys.argv[2]); print(f'{s:.2f} s | {b/s/1e9:.2f} GB/s')" "$@"; }
    # The host's write bandwidth into the work folder (fsynced), a baseline of the targets.
    local t0; t0=$(now)
    dd if="$c1" of="$work/dd.bin" bs=4M conv=fsync status=none
    echo "| host write, fsynced | dd | $(rate "$bytes" "$t0") |" > "$out/baselines.md"
    rm -f "$work/dd.bin"
    # What `auto` chose on this machine, and the measurement it chose by.
    "$BIN/mdl" init "$work/auto" > /dev/null
    "$BIN/mdl" -C "$work/auto" -v commit "$c1" -m auto 2>&1 | grep '^engine: ' | tee "$out/auto.txt"
    {
        echo "checkpoint: $(basename "$c1") and $(basename "$c2"), $bytes bytes each; $(nproc) cores"
        echo
        echo "| step | engine | time | rate |"
        echo "| --- | --- | ---: | ---: |"
    } > "$out/e2e.md"
    for engine in cpu gpu; do
        local repo=$work/repo-$engine
        "$BIN/mdl" init "$repo" > /dev/null
        for f in "$c1" "$c2"; do
            cat "$f" > /dev/null # the same warm page cache for both engines
            local t0; t0=$(now)
            "$BIN/mdl" -C "$repo" -v commit "$f" -m "$(basename "$f")" --engine "$engine"
            echo "| commit $(basename "$f") lossless | $engine | $(rate "$bytes" "$t0") |" >> "$out/e2e.md"
        done
        local lrepo=$work/lossy-$engine
        "$BIN/mdl" init "$lrepo" > /dev/null
        for f in "$c1" "$c2"; do
            local t0; t0=$(now)
            "$BIN/mdl" -C "$lrepo" commit "$f" --lossy -m "$(basename "$f")" --engine "$engine"
            echo "| commit $(basename "$f") --lossy | $engine | $(rate "$bytes" "$t0") |" >> "$out/e2e.md"
        done
        for rev in HEAD HEAD~1; do
            local t0; t0=$(now)
            "$BIN/mdl" -C "$repo" checkout "$rev" -o "$work/out-$engine.safetensors" --force --engine "$engine"
            echo "| checkout $rev | $engine | $(rate "$bytes" "$t0") |" >> "$out/e2e.md"
        done
        cmp "$work/out-$engine.safetensors" "$c1"
        rm -f "$work/out-$engine.safetensors"
    done
    # The CPU engine on two cores of this machine against all of them (issue 44's scaling
    # target: >= 6x on 16 cores), background re-encodes off so that each run is the commit alone.
    if command -v taskset > /dev/null && [ "$(nproc)" -gt 2 ]; then
        for cores in all 2; do
            local pin=() label=cpu-all
            [ "$cores" = 2 ] && pin=(taskset -c 0,1) && label=cpu-2
            local srepo=$work/scale-$cores
            "$BIN/mdl" init "$srepo" > /dev/null
            for f in "$c1" "$c2"; do
                local t0; t0=$(now)
                MDL_NO_BACKGROUND=1 "${pin[@]}" "$BIN/mdl" -C "$srepo" commit "$f" -m "$(basename "$f")" --engine cpu
                echo "| commit $(basename "$f") lossless | $label | $(rate "$bytes" "$t0") |" >> "$out/e2e.md"
            done
            local t0; t0=$(now)
            "${pin[@]}" "$BIN/mdl" -C "$srepo" checkout HEAD -o "$work/out-scale.safetensors" --force --engine cpu
            echo "| checkout HEAD | $label | $(rate "$bytes" "$t0") |" >> "$out/e2e.md"
            rm -f "$work/out-scale.safetensors"
        done
    fi
    # Identical bytes end to end: every tensor's codec, size and id, lossless and lossy.
    for kind in repo lossy; do
        for rev in HEAD HEAD~1; do
            if diff <("$BIN/mdl" -C "$work/$kind-cpu" show "$rev" --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tensors"]))') \
                    <("$BIN/mdl" -C "$work/$kind-gpu" show "$rev" --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tensors"]))'); then
                echo "$kind $rev: cpu and gpu stored the same tensors"
            else
                identical=false
            fi
        done
    done
    cat "$out/e2e.md"
    echo "== targets"
    IDENTICAL=$identical COMMIT=$(cat "$BIN/commit.txt" 2>/dev/null || echo unknown) \
        python3 scripts/gpu-results.py "$out"
    # The table is written either way; the run fails unless both engines stored the same bytes.
    if [ "$identical" != true ]; then
        echo "the GPU engine did not store the CPU engine's bytes (see above)" >&2
        exit 1
    fi
}

case $what in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: $0 [build|run]" >&2; exit 2 ;;
esac
