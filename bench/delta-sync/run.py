"""What a client holding one step of an RL-like run moves to get the next (issue 72).

An RL-like series is made by real training (the shared corpus script): the corpus model,
trained from scratch (traj-bf16's last checkpoint), trained on in bf16 with fp32 master
weights, a checkpoint every optimizer step, at a learning rate small enough that about 1 % of
the bf16 weights change a step (as in RL post-training). What a rollout engine loads, the bf16
model weights, is taken out of each checkpoint into a file of its own (a safetensors file of
the `model.*` tensors).

Per step B after step A (consecutive, and five steps apart), the table prints the fraction of
bf16 weights that changed and the bytes that carry the change:

- (a) the whole weights file;
- (b) TRL-style patches: an int32 index and a bf16 value per changed element;
- (c) `zstd -3` of A XOR B;
- mdl: what `mdl fetch` moves (`--json fetch`'s "bytes") into a clone holding A, from a
  server (`mdl serve`) whose repository commits every step (five steps apart: `fetch --depth
  1`, the newest step alone, as a follower takes it).

And per step: `mdl commit`'s wall time into a repository holding the steps before (with
`MDL_NO_BACKGROUND=1`, then `mdl maintenance`), against a commit of the same file into an
empty repository (a full lossless commit), and the bytes that repository grew by once its
maintenance ran (the previous step turned into a reverse delta).

    $corpus/venv/bin/python bench/delta-sync/run.py [--corpus DIR] [--mdl PATH] [--steps 50] [--lr 1e-6] [--mode forward]

`--mode forward` times the commits in a repository with `delta.mode forward` (each step stored
as a delta of the one before, a whole version every `delta.max_depth` commits) instead of the
default reverse deltas.

The series is cached in the corpus folder (`rl-bf16-<lr>-<steps>`), made with the corpus'
own Python, which also runs this script (it has numpy). Needs ../shared/corpus/make.sh run once.
"""

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SHM = "/dev/shm/mdl-delta-sync"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def series(corpus, steps, lr):
    """The cached RL-like series: its checkpoint paths, in step order."""
    out = os.path.join(corpus, f"rl-bf16-{lr:g}-{steps}")
    files = sorted(f for f in os.listdir(out)) if os.path.isdir(out) else []
    if len(files) < steps + 1:
        gen = os.path.join(ROOT, "..", "shared", "corpus", "gen_trajectory.py")
        init = os.path.join(corpus, "traj-bf16", "ckpt_000200.safetensors")
        shutil.rmtree(out + ".tmp", ignore_errors=True)
        print(f"making {out} ({steps} steps, lr {lr:g})", file=sys.stderr)
        run([os.path.join(corpus, "venv", "bin", "python"), gen, "--out", out + ".tmp",
             "--init-from", init, "--dtype", "bf16", "--master", "--every", "1",
             "--steps", str(steps), "--lr", str(lr), "--warmup", "1", "--save-init", "--seed", "1"])
        shutil.rmtree(out, ignore_errors=True)
        os.rename(out + ".tmp", out)
        files = sorted(os.listdir(out))
    return [os.path.join(out, f) for f in files if f.endswith(".safetensors")]


def weights(path, dest):
    """Writes `path`'s `model.*` tensors to `dest` as a safetensors file; returns its bytes
    (the tensors' raw bytes, concatenated in name order)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    start = 8 + n
    names = sorted(k for k in header if k.startswith("model."))
    out_header, parts, at = {}, [], 0
    for k in names:
        lo, hi = header[k]["data_offsets"]
        parts.append(blob[start + lo:start + hi])
        out_header[k] = dict(header[k], data_offsets=[at, at + hi - lo])
        at += hi - lo
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    raw = b"".join(parts)
    with open(dest, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + raw)
    return raw


def zstd_len(data):
    return len(subprocess.run(["zstd", "-3", "-q", "-c"], input=data, capture_output=True,
                              check=True).stdout)


def size_of(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


class Server:
    """`mdl serve --read-public` of one repository."""

    def __init__(self, mdl, repo):
        self.log = open(os.path.join(SHM, "serve.log"), "w")
        self.proc = subprocess.Popen([mdl, "-C", repo, "serve", "--read-public", "--addr",
                                      "127.0.0.1:0"], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            time.sleep(0.05)
            with open(os.path.join(SHM, "serve.log")) as f:
                for line in f:
                    if line.startswith("serving "):
                        self.url = line.split()[1]
                        return
        raise SystemExit("mdl serve did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.environ.get("MDL_CORPUS",
                                                      os.path.expanduser("~/.cache/mdl-corpus")))
    ap.add_argument("--mdl", default=os.path.join(ROOT, "target", "release", "mdl"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--gap", type=int, default=5, help="steps apart of the second comparison")
    ap.add_argument("--mode", default="reverse", choices=["reverse", "forward"],
                    help="delta.mode of the repository the commits are timed in")
    args = ap.parse_args()
    mdl = os.path.abspath(args.mdl)
    files = series(args.corpus, args.steps, args.lr)
    shutil.rmtree(SHM, ignore_errors=True)
    os.makedirs(os.path.join(SHM, "w"))
    raws, paths = [], []
    for k, f in enumerate(files):
        p = os.path.join(SHM, "w", f"step_{k:04d}.safetensors")
        raws.append(np.frombuffer(weights(f, p), dtype=np.uint16))
        paths.append(p)
    whole = os.path.getsize(paths[0])
    quiet = dict(os.environ, MDL_NO_BACKGROUND="1")

    # The server's repository, a clone following every step and one every `gap` steps.
    srv = os.path.join(SHM, "srv")
    run([mdl, "init", srv])
    run([mdl, "-C", srv, "commit", paths[0], "-m", "step 0"], env=quiet)
    server = Server(mdl, srv)
    each, every = os.path.join(SHM, "each"), os.path.join(SHM, "every")
    try:
        run([mdl, "clone", server.url, each])
        run([mdl, "clone", server.url, every])
        rows, gap_rows = [], []
        # A repository of its own for the commits' time and what each step adds once settled
        # (a served repository does its maintenance itself, when it likes).
        store = os.path.join(SHM, "store")
        run([mdl, "init", store])
        run([mdl, "-C", store, "config", "delta.mode", args.mode])
        run([mdl, "-C", store, "commit", paths[0], "-m", "step 0"], env=quiet)
        grown = size_of(os.path.join(store, ".mdl"))
        for k in range(1, len(paths)):
            run([mdl, "-C", srv, "commit", paths[k], "-m", f"step {k}"], env=quiet)
            t = time.perf_counter()
            run([mdl, "-C", store, "commit", paths[k], "-m", f"step {k}"], env=quiet)
            commit_s = time.perf_counter() - t
            run([mdl, "-C", store, "maintenance"], env=quiet)
            now = size_of(os.path.join(store, ".mdl"))
            stored, grown = now - grown, now
            empty = os.path.join(SHM, "empty")
            shutil.rmtree(empty, ignore_errors=True)
            run([mdl, "init", empty])
            t = time.perf_counter()
            run([mdl, "-C", empty, "commit", paths[k], "-m", "full"], env=quiet)
            full_s = time.perf_counter() - t
            moved = json.loads(run([mdl, "-C", each, "--json", "fetch"]))["bytes"]
            a, b = raws[k - 1], raws[k]
            changed = int(np.count_nonzero(a != b))
            rows.append(dict(step=k, frac=changed / a.size, patch=6 * changed,
                             xor=zstd_len((a ^ b).tobytes()), mdl=moved, commit=commit_s,
                             full=full_s, stored=stored))
            if k % args.gap == 0:
                # A follower that wants the newest step, not the steps between.
                moved = json.loads(run([mdl, "-C", every, "--json", "fetch", "--depth", "1"]))["bytes"]
                a = raws[k - args.gap]
                changed = int(np.count_nonzero(a != b))
                gap_rows.append(dict(step=k, frac=changed / a.size, patch=6 * changed,
                                     xor=zstd_len((a ^ b).tobytes()), mdl=moved))
    finally:
        server.stop()

    def table(title, rs, timing):
        print(f"\n{title}\n")
        head = "| step | changed | (a) whole | (b) patches | (c) zstd XOR | mdl fetch | mdl / (b) | mdl / (a) |"
        if timing:
            head += " commit s | full commit s | commit / full | stored |"
        print(head)
        print("|" + "---:|" * (head.count("|") - 1))
        for r in rs:
            line = (f"| {r['step']} | {100 * r['frac']:.2f} % | {whole:,} | {r['patch']:,} | "
                    f"{r['xor']:,} | {r['mdl']:,} | {r['mdl'] / max(r['patch'], 1):.2f} | "
                    f"{r['mdl'] / whole:.3f} |")
            if timing:
                line += (f" {r['commit']:.3f} | {r['full']:.3f} | {r['commit'] / r['full']:.2f} | "
                         f"{r['stored']:,} |")
            print(line)
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "step"}
        line = (f"| median | {100 * med['frac']:.2f} % | {whole:,} | {med['patch']:,.0f} | "
                f"{med['xor']:,.0f} | {med['mdl']:,.0f} | {med['mdl'] / max(med['patch'], 1):.2f} | "
                f"{med['mdl'] / whole:.3f} |")
        if timing:
            line += (f" {med['commit']:.3f} | {med['full']:.3f} | {med['commit'] / med['full']:.2f} | "
                     f"{med['stored']:,.0f} |")
        print(line)

    print(f"{len(paths)} steps of bf16 weights ({whole:,} bytes a file), lr {args.lr:g}; mdl {mdl}")
    table("Consecutive steps (B given A = B - 1)", rows, True)
    table(f"Steps {args.gap} apart", gap_rows, False)


if __name__ == "__main__":
    main()
