"""Scale and memory benchmark (issue 22): commit and checkout time and peak memory (max RSS) of
generated checkpoints, a first version and a second one a training step later (so the second
commit's deferred re-encode makes the first a reverse delta), fp32 and bf16.

Usage: run.py MDL WORKDIR [--sizes 1,4] [--dtypes f32,bf16] [--single] [--commits-only]

  --sizes         checkpoint sizes in GB (10^9 bytes): weights, exp_avg and exp_avg_sq, a third each
  --single        one tensor of 4 GiB (f32) instead: the memory target's checkpoint
  --commits-only  the commits and their zstd baselines only (no maintenance, no checkouts): what
                  a 16 GB checkpoint leaves room for on a disk of ~50 GB
  --input DIR     where the generated checkpoint is written (default WORKDIR): a tmpfs, with the
                  repository and zstd's output on the disk

Each row is one process measured by /usr/bin/time -v, `zstd -3 -T2` of each version beside its
commit. Commits run with MDL_NO_BACKGROUND=1, so the second commit's deferred re-encode of the
first (`delta.defer`) is its own row, `mdl maintenance`. Outputs are verified byte for byte.
"""
import argparse, hashlib, json, os, shutil, struct, subprocess, sys, time

import numpy as np

CHUNK = 1 << 24  # elements generated at a time


def tensor_chunks(kind, n, step, dtype):
    """Yields the bytes of tensor `kind` at `step`, CHUNK elements at a time."""
    for k, at in enumerate(range(0, n, CHUNK)):
        m = min(CHUNK, n - at)
        g = np.random.default_rng(["wmv".index(kind), k])
        if kind == "w":
            x = g.standard_normal(m, dtype=np.float32) * np.float32(0.02)
            scale = 1e-4
        elif kind == "m":
            x = g.standard_normal(m, dtype=np.float32) * np.float32(1e-3)
            scale = 2e-4
        else:
            x = np.abs(g.standard_normal(m, dtype=np.float32)) * np.float32(1e-6)
            scale = 1e-7
        if step:
            d = np.random.default_rng(["wmv".index(kind), k, step])
            x = x + d.standard_normal(m, dtype=np.float32) * np.float32(scale)
            if kind == "v":
                x = np.abs(x)
        if dtype == "bf16":
            bits = x.view(np.uint32)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            yield bits.astype(np.uint16).tobytes()
        else:
            yield x.astype(np.float32).tobytes()


def write_checkpoint(path, tensors, step, dtype):
    """tensors: [(name, kind, elements)]."""
    width = 2 if dtype == "bf16" else 4
    header, at = {}, 0
    for name, _, n in tensors:
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": [n],
                        "data_offsets": [at, at + n * width]}
        at += n * width
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, kind, n in tensors:
            for b in tensor_chunks(kind, n, step, dtype):
                f.write(b)


def digest(path):
    h = hashlib.blake2b()
    with open(path, "rb") as f:
        while b := f.read(1 << 24):
            h.update(b)
    return h.hexdigest()


QUIET = dict(os.environ, MDL_NO_BACKGROUND="1")


def measured(cmd):
    """Runs cmd under /usr/bin/time -v: (wall seconds, max RSS MiB)."""
    t = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=QUIET)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    rss = next(int(l.split()[-1]) for l in p.stderr.splitlines() if "Maximum resident" in l)
    return wall, rss / 1024


def run(mdl, work, label, tensors, dtype, commits_only=False, input_dir=None):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.makedirs(input_dir or work, exist_ok=True)
    ckpt = f"{input_dir or work}/ckpt.safetensors"
    repo, out = f"{work}/repo", f"{work}/out.safetensors"
    subprocess.run([mdl, "init", repo], check=True, capture_output=True)
    digests, rows = [], []
    for step in (0, 1):
        write_checkpoint(ckpt, tensors, step, dtype)
        digests.append(digest(ckpt))
        size = os.path.getsize(ckpt)
        os.system("sync")
        wall, rss = measured(["zstd", "-q", "-3", "-T2", "-f", ckpt, "-o", f"{work}/ckpt.zst"])
        os.remove(f"{work}/ckpt.zst")
        rows.append((f"zstd -3 -T2 of v{step + 1} (baseline)", size, wall, rss))
        os.system("sync")
        wall, rss = measured([mdl, "-C", repo, "commit", ckpt, "-m", f"step {step}"])
        rows.append((f"commit v{step + 1}", size, wall, rss))
    # The re-encode of v1 against v2 that the second commit deferred (`delta.defer`).
    if not commits_only:
        wall, rss = measured([mdl, "-C", repo, "maintenance"])
        rows.append(("maintenance (v1 re-encoded against v2)", size, wall, rss))
    for rev, want in () if commits_only else (("main", digests[1]), ("main~1", digests[0])):
        wall, rss = measured([mdl, "-C", repo, "checkout", rev, "-o", out, "--force"])
        assert digest(out) == want, f"{label} {rev} differs"
        rows.append((f"checkout {rev}", os.path.getsize(out), wall, rss))
        os.remove(out)
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{repo}/.mdl/objects") for f in fs)
    for what, size, wall, rss in rows:
        print(f"| {label} | {what} | {size / 1e9:.2f} | {wall:.1f} | {size / wall / 1e6:.0f} | {rss:.0f} |")
    print(f"| {label} | stored (both versions) | {stored / 1e9:.2f} | | | |")
    sys.stdout.flush()
    shutil.rmtree(work)
    if os.path.exists(ckpt):
        os.remove(ckpt)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("mdl")
    a.add_argument("work")
    a.add_argument("--sizes", default="1,4")
    a.add_argument("--dtypes", default="f32,bf16")
    a.add_argument("--single", action="store_true")
    a.add_argument("--commits-only", action="store_true")
    a.add_argument("--input", default=None)
    args = a.parse_args()
    print("| checkpoint | step | GB | seconds | MB/s | max RSS MiB |")
    print("|---|---|---|---|---|---|")
    if args.single:
        run(args.mdl, args.work, "one 4 GiB f32 tensor", [("w", "w", 1 << 30)], "f32")
        return
    for dtype in args.dtypes.split(","):
        width = 2 if dtype == "bf16" else 4
        for gb in map(float, args.sizes.split(",")):
            n = int(gb * 1e9 / 3 / width)
            tensors = [("w", "w", n), ("exp_avg", "m", n), ("exp_avg_sq", "v", n)]
            run(args.mdl, args.work, f"{gb:g} GB {dtype}", tensors, dtype, args.commits_only,
                args.input)


if __name__ == "__main__":
    main()
