#!/usr/bin/env python3
"""Makes one fixture repository under tests/fixtures/ with a given `mdl` binary.

    scripts/make-fixture.py --mdl PATH/TO/mdl --version N --out tests/fixtures/vN

Run by scripts/make-fixtures.sh, which builds the `mdl` of the commit that wrote format
version N. From version 4 on, the last commit is a tree (its checkout a folder). The checkpoints are made here from a fixed seed (no numpy needed). The fixture
holds the repository (`repo/.mdl`), every commit's checkout as that build wrote it
(`checkouts/`), and `expected.json`: the refs, HEAD, the commit each checkout belongs to, and
the codec tags the repository's records use. tests/fixtures.rs (in the mdl crate) reads it back
with today's code.
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import tempfile

MASK = (1 << 64) - 1


class Rng:
    """xorshift64*, so the checkpoints are the same on every machine."""

    def __init__(self, seed):
        self.s = seed & MASK or 1

    def u64(self):
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & MASK
        s ^= s >> 27
        self.s = s
        return (s * 0x2545F4914F6CDD1D) & MASK

    def uniform(self):
        return ((self.u64() >> 11) + 0.5) / float(1 << 53)

    def normal(self):
        u, v = self.uniform(), self.uniform()
        return math.sqrt(-2.0 * math.log(u)) * math.cos(2.0 * math.pi * v)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def bf16(values):
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, dtype, shape, bytes)] in data order."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in tensors:
            f.write(data)


class Model:
    """A small model being trained: weights drift a little each step; Adam moments follow."""

    def __init__(self, seed, moments, master=False):
        self.rng = Rng(seed)
        # Format 13 on: `model.b` is the bf16 cast of an fp32 master copy with Adam moments
        # (a mixed-precision run), stored as a cast record.
        self.master = master
        self.w = [self.rng.normal() * 0.02 for _ in range(32 * 32)]
        self.b = [self.rng.normal() * 0.05 for _ in range(32 * 64)]
        self.ln = [1.0] * 64
        # Signs flip and nothing else: the XOR of two versions is one bit (xor-delta's case).
        self.sign = [self.rng.normal() * 0.1 for _ in range(32 * 32)]
        self.ids = [int(self.rng.uniform() * 50) for _ in range(512)]
        self.moments = moments
        self.m = [0.0] * len(self.w)
        self.v = [0.0] * len(self.w)
        self.step = 0

    def train(self, steps):
        for _ in range(steps):
            self.step += 1
            for i in range(len(self.w)):
                g = self.rng.normal() * 0.01 + self.w[i] * 0.1
                self.m[i] = 0.9 * self.m[i] + 0.1 * g
                self.v[i] = 0.999 * self.v[i] + 0.001 * g * g
                mh = self.m[i] / (1 - 0.9**self.step)
                vh = self.v[i] / (1 - 0.999**self.step)
                self.w[i] -= 1e-3 * mh / (math.sqrt(vh) + 1e-8)
            for i in range(0, len(self.b), 3):
                self.b[i] += self.rng.normal() * 1e-3
            self.ln[self.step % 64] += 0.001
            for i in range(self.step % 16, len(self.sign), 16):
                self.sign[i] = -self.sign[i]

    def write(self, path):
        tensors = [
            ("model.w", "F32", [32, 32], f32(self.w)),
            ("model.b", "BF16", [32, 64], bf16(self.b)),
            ("model.ln", "F32", [64], f32(self.ln)),
            ("model.sign", "F32", [32, 32], f32(self.sign)),
            ("ids", "I32", [512], struct.pack("<512i", *self.ids)),
            ("optim.step", "I64", [], struct.pack("<q", self.step)),
            ("mask", "BOOL", [7], bytes([1, 0, 1, 1, 0, 0, 1])),
            ("empty", "F32", [0, 3], b""),
        ]
        if self.moments:
            tensors += [
                ("optim.w.exp_avg", "F32", [32, 32], f32(self.m)),
                ("optim.w.exp_avg_sq", "F32", [32, 32], f32(self.v)),
            ]
        if self.master:
            tensors += [
                ("optim.b.master", "F32", [32, 64], f32(self.b)),
                ("optim.b.exp_avg", "F32", [32, 64], f32([x * 1e-3 for x in self.b])),
                ("optim.b.exp_avg_sq", "F32", [32, 64], f32([x * x * 1e-4 + 1e-9 for x in self.b])),
            ]
        write_safetensors(path, tensors, {"step": str(self.step)})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mdl", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    mdl = os.path.abspath(a.mdl)
    out = os.path.abspath(a.out)
    if os.path.exists(out):
        shutil.rmtree(out)
    repo = os.path.join(out, "repo")
    checkouts = os.path.join(out, "checkouts")
    os.makedirs(checkouts)
    # Deferred re-encodes run when the script says (`mdl maintenance`), not in the background.
    env = dict(os.environ, MDL_AUTHOR="fixture", MDL_NO_BACKGROUND="1")

    def run(*args):
        r = subprocess.run([mdl, "-C", repo, "--json", *args], env=env, check=True,
                           stdout=subprocess.PIPE)
        return json.loads(r.stdout) if r.stdout.strip() else None

    subprocess.run([mdl, "init", repo], env=env, check=True, stdout=subprocess.DEVNULL)
    if a.version >= 2:
        run("config", "delta.mode", "reverse")
    model = Model(seed=0x5EED_0000 + a.version, moments=a.version >= 3, master=a.version >= 13)
    lossy = ["--lossy"] if a.version >= 3 else []
    commits = []
    trees = set()
    large = set()
    with tempfile.TemporaryDirectory() as tmp:
        def commit(*flags):
            model.train(2)
            f = os.path.join(tmp, "step%d.safetensors" % model.step)
            model.write(f)
            done = run("commit", f, "--step", str(model.step), "--metric", "loss=%g" % (3.0 / model.step),
                       "-m", "step %d" % model.step, *flags)
            commits.append(done["id"])

        commit()
        run("tag", "first", commits[0], "-m", "the first checkpoint")
        commit(*lossy)
        commit(*lossy)
        run("branch", "exp", commits[1])
        trim = ["--trim-bits", "7"] if a.version >= 3 else []
        commit("--branch", "exp", *trim)
        if a.version >= 4:
            # A tree: a safetensors file, a real torch.save optimizer, small JSON (inline in
            # the manifest), a tokenizer file longer than 4 KiB (a bytes object) and an
            # executable script in a subfolder.
            model.train(2)
            d = os.path.join(tmp, "checkpoint-%d" % model.step)
            os.makedirs(os.path.join(d, "sub"))
            model.write(os.path.join(d, "model.safetensors"))
            here = os.path.dirname(os.path.abspath(__file__))
            shutil.copy(os.path.join(here, "..", "tests", "fixtures", "torch", "optimizer.pt"), d)
            with open(os.path.join(d, "config.json"), "w") as fh:
                fh.write('{"hidden_size": 32, "step": %d}\n' % model.step)
            with open(os.path.join(d, "tokenizer.json"), "w") as fh:
                fh.write("".join("tok%d " % i for i in range(1200)))
            script = os.path.join(d, "sub", "run.sh")
            with open(script, "w") as fh:
                fh.write("#!/bin/sh\necho resume\n")
            os.chmod(script, 0o755)
            done = run("commit", d, "--step", str(model.step), "-m", "a tree")
            commits.append(done["id"])
            trees.add(done["id"])
        if a.version >= 6:
            # Retention coarsens the first moments of the lossy commits behind main's tip
            # (records that decode to other content than their ids name).
            commit(*lossy)
            commit(*lossy)
            run("config", "retention.coarsen_after", "1")
            run("gc")
        if a.version >= 7:
            # A tensor of 64 MiB and more: framed records (mostly zeros, so they stay small;
            # the whole-tensor estimate of a delta does not pay here, so both stay whole).
            n = (17 << 20) + 1000
            rng = Rng(7)
            head = [rng.normal() * 0.02 for _ in range(4096)]
            for step in range(2):
                # A few signs flip.
                head = [-x if i % 256 == 0 else x for i, x in enumerate(head)] if step else head
                f = os.path.join(tmp, "large%d.safetensors" % step)
                data = f32(head) + bytes(4 * (n - len(head)))
                write_safetensors(f, [("large.w", "F32", [n], data)], {"step": str(step)})
                done = run("commit", f, "-m", "large, version %d" % step)
                commits.append(done["id"])
                large.add(done["id"])
        if a.version >= 11:
            # An RL-like step: 1 % of a bf16 tensor's elements move by one unit in the last
            # place, so the previous version becomes a masked reverse delta.
            rng = Rng(11)
            words = [0x3C00 + int(rng.uniform() * 0x400) for _ in range(1 << 15)]
            for step in range(2):
                if step:
                    words = [w + (1 if rng.uniform() < 0.5 else -1) if rng.uniform() < 0.01 else w
                             for w in words]
                f = os.path.join(tmp, "rl%d.safetensors" % step)
                data = struct.pack("<%dH" % len(words), *words)
                write_safetensors(f, [("rl.w", "BF16", [len(words)], data)], {"step": str(step)})
                done = run("commit", f, "-m", "rl step %d" % step)
                commits.append(done["id"])
        if a.version >= 12:
            # The same on a tensor of 2 Mi elements, one in twenty a unit up (so its records
            # stay small): a mask this long is coded as runs of zero flag bytes.
            rng = Rng(12)
            n = 1 << 21
            words = [0x3C01 if rng.uniform() < 0.05 else 0x3C00 for _ in range(n)]
            for step in range(2):
                if step:
                    for _ in range(n // 100):
                        i = int(rng.uniform() * n)
                        words[i] ^= 1
                f = os.path.join(tmp, "rl_long%d.safetensors" % step)
                data = struct.pack("<%dH" % n, *words)
                write_safetensors(f, [("rl.long", "BF16", [n], data)], {"step": str(step)})
                done = run("commit", f, "-m", "long rl step %d" % step)
                commits.append(done["id"])
                # Its checkouts kept as zstd frames, as the large tensor's are.
                large.add(done["id"])
        if a.version >= 7:
            run("maintenance")

    expected = {"format_version": a.version, "head": "main", "refs": {}, "checkouts": {}}
    for kind, prefix in (("branch", "refs/heads/"), ("tag", "refs/tags/")):
        for r in run(kind):
            expected["refs"][prefix + r["name"]] = r["target"]
    for i, c in enumerate(commits):
        name = ("%d" if c in trees else "%d.safetensors") % i
        run("checkout", c, "-o", os.path.join(checkouts, name))
        expected["checkouts"][name] = c
        if c in large:
            # Kept as zstd frames: the test decompresses them.
            path = os.path.join(checkouts, name)
            subprocess.run(["zstd", "-q", "-19", "--rm", path], check=True)
    tags = set()
    masked = runs = 0
    for root, _, files in os.walk(os.path.join(repo, ".mdl", "objects")):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                record = fh.read()
            if record[:4] == b"MDLR":
                tags.add(record[7])
                # The payload's first byte: 1 for a masked delta (format 11 on), 9 for one whose
                # mask is run-coded (format 12 on).
                at = 9 + (32 if record[8] & 1 else 0) + (48 if record[8] & 2 else 0)
                at += 2 + struct.unpack_from("<H", record, at)[0]
                masked += record[7] in (3, 7) and record[at] in (1, 9)
                runs += record[7] in (3, 7) and record[at] == 9
    expected["codecs"] = sorted(tags)
    if a.version >= 11:
        expected["masked"] = masked
    if a.version >= 12:
        expected["runs"] = runs
    for f in ("lock",):
        path = os.path.join(repo, ".mdl", f)
        if os.path.exists(path) and os.path.getsize(path) == 0:
            os.remove(path)
    # Decoded chain ends are a cache, not the format (docs/FORMAT.md): not kept.
    shutil.rmtree(os.path.join(repo, ".mdl", "tips"), ignore_errors=True)
    with open(os.path.join(out, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print("wrote %s: codecs %s" % (out, expected["codecs"]))


if __name__ == "__main__":
    main()
