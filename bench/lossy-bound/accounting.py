"""Stored bytes of a lossy series by role, under the papers' accountings.

  python3 bench/lossy-bound/accounting.py MDL REPO

Reads `mdl show --json` of every commit on the current branch (oldest first) and prints, per
commit, the bits per element stored for weights, exp_avg and exp_avg_sq; then the series'
ratios as `mdl stats --lossy` counts them (mdl's own, DynaQuant's, ExCP's: docs/CLI_JSON.md).

Stored bytes are each record's own size (a delta counts its delta, a residual its residual),
counted once per object however many tensors or commits share it.
"""
import json
import subprocess
import sys


def role(name):
    if name.endswith("exp_avg_sq"):
        return "v"
    if name.endswith("exp_avg"):
        return "m"
    if name.endswith(".master") or name.startswith("model."):
        return "w"
    return "other"


def main():
    mdl, repo = sys.argv[1], sys.argv[2]
    run = lambda *a: subprocess.run([mdl, "-C", repo, *a], check=True, capture_output=True, text=True).stdout
    ids = [c["id"] for c in json.loads(run("log", "--json"))][::-1]
    rows = []
    seen = set()
    for cid in ids:
        s = json.loads(run("show", cid, "--json"))
        stored = {"w": 0, "m": 0, "v": 0, "other": 0}
        raw = dict(stored)
        elems = dict(stored)
        for t in s["tensors"]:
            r = role(t["name"])
            if t["id"] not in seen:  # an object shared by tensors or commits counts once
                seen.add(t["id"])
                stored[r] += t["stored_bytes"] or 0
            raw[r] += t["raw_bytes"]
            n = 1
            for d in t["shape"]:
                n *= d
            elems[r] += n
        rows.append((s["message"], stored, raw, elems))
    print("| commit | weights b/elt | exp_avg b/elt | exp_avg_sq b/elt | stored | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for msg, st, raw, el in rows:
        b = lambda r: f"{8 * st[r] / el[r]:.2f}" if el[r] else "—"
        tot = sum(st.values())
        print(f"| {msg} | {b('w')} | {b('m')} | {b('v')} | {tot} | {sum(raw.values()) / max(tot, 1):.1f}× |")
    counted = json.loads(run("stats", "--lossy", "--json"))["lossy"]
    print()
    print(f"series (every byte): {counted['ratio']:.2f}×")
    print(f"DynaQuant (weights, whole series, vs fp32): {counted['dynaquant']:.2f}×")
    print(f"ExCP (weights + moments, per delta, first excluded, vs fp32): {counted['excp']:.2f}×")


if __name__ == "__main__":
    main()
