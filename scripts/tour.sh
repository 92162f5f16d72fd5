#!/usr/bin/env bash
# A short end-to-end tour of mdl on a generated checkpoint series, in a temporary repository.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts the binary ($CARGO_TARGET_DIR, a workspace setting, or ./target).
target=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "building mdl (release; a first build takes a few minutes)" >&2
cargo build --release -p mdl-cli
mdl="$target/release/mdl"
fixtures="$PWD/tests/fixtures/torch"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# Three small checkpoints: an f32 weight that drifts, a frozen bf16 embedding, a step counter.
python3 - <<'PY'
import json, struct, random
random.seed(0)
w = [random.gauss(0, 0.02) for _ in range(65536)]
emb = bytes(random.getrandbits(8) for _ in range(2 * 4096))
for i, step in enumerate([100, 200, 300]):
    w = [x + random.gauss(0, 0.001) for x in w]
    tensors = [("model.w", "F32", [256, 256], struct.pack(f"<{len(w)}f", *w)),
               ("model.emb", "BF16", [64, 64], emb),
               ("optim.step", "I64", [], struct.pack("<q", step))]
    header, off = {"__metadata__": {"step": str(step)}}, 0
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(f"ckpt{i}.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors))
PY
set -x
"$mdl" init
"$mdl" config                # delta.mode = reverse, delta.max_depth = 16 (defaults)
"$mdl" commit ckpt0.safetensors -m "step 100" --step 100 --metric loss=2.9
"$mdl" commit ckpt1.safetensors -m "step 200" --step 200 --metric loss=2.5
"$mdl" branch lr-low HEAD~1
"$mdl" commit ckpt2.safetensors -b lr-low -m "step 300, lower lr" --step 300 --metric loss=2.4
"$mdl" log --graph lr-low
"$mdl" log main
"$mdl" show lr-low
"$mdl" show main~1           # the older commit: its tensors are deltas against main's
"$mdl" diff main lr-low
"$mdl" checkout main -o restored.safetensors
cmp restored.safetensors ckpt1.safetensors && echo "checkout is byte-identical"
"$mdl" tag v1 main -m "first release"
"$mdl" stats
"$mdl" compact --max-depth 0 # every tensor self-contained again; ids unchanged
"$mdl" checkout main -o restored.safetensors --force
cmp restored.safetensors ckpt1.safetensors && echo "still byte-identical after compaction"
"$mdl" branch -d lr-low || true   # refused: its commit is on no other branch
"$mdl" branch -D lr-low
"$mdl" reflog lr-low                # where it was: `mdl branch lr-low ID` would bring it back
"$mdl" gc --prune-older-than 0s --expire-reflog 0s   # the deleted branch's commit goes
"$mdl" fsck
# A checkpoint as training stacks write it: a folder with safetensors weights, a torch.save
# optimizer (written by the real torch: tests/fixtures/torch), Trainer's JSON state, a config.
mkdir -p checkpoint-400
cp ckpt2.safetensors checkpoint-400/model.safetensors
cp "$fixtures/optimizer.pt" checkpoint-400/optimizer.pt
echo '{"n_embd": 256}' > checkpoint-400/config.json
echo '{"global_step": 400, "log_history": [{"step": 400, "loss": 2.31, "eval_loss": 2.45}]}' \
    > checkpoint-400/trainer_state.json
"$mdl" commit checkpoint-400 -m "a Trainer folder"   # step and metrics from trainer_state.json
"$mdl" show main             # files by format; optimizer.pt split per storage (state.K.exp_avg)
"$mdl" log -n 1
"$mdl" checkout main -o restored-400
diff -r restored-400 checkpoint-400 && echo "the folder is byte-identical"
"$mdl" checkout main -o one.pt --path optimizer.pt
cmp one.pt checkpoint-400/optimizer.pt && echo "one file of it, too"
