"""Stored bytes of a lossy series by role, under the papers' accountings.

  python3 bench/lossy-bound/accounting.py MDL REPO

Reads `mdl show --json` of every commit on the current branch (oldest first) and prints, per
commit, the bits per element stored for weights, exp_avg and exp_avg_sq, and for the series:

- mdl's own ratio: every raw byte of every checkpoint over every stored byte;
- DynaQuant's: weights only, the whole series, against fp32 (4 bytes an element);
- ExCP's: weights and both moments, per delta checkpoint (the first commit excluded).

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
    total_raw = sum(sum(r[2].values()) for r in rows)
    total_stored = sum(sum(r[1].values()) for r in rows)
    w_elems = sum(r[3]["w"] for r in rows)
    w_stored = sum(r[1]["w"] for r in rows)
    d_raw = sum(4 * (r[3]["w"] + r[3]["m"] + r[3]["v"]) for r in rows[1:])
    d_stored = sum(r[1]["w"] + r[1]["m"] + r[1]["v"] for r in rows[1:])
    print()
    print(f"series (every byte): {total_raw / total_stored:.2f}×")
    print(f"DynaQuant (weights, whole series, vs fp32): {4 * w_elems / max(w_stored, 1):.2f}×")
    print(f"ExCP (weights + moments, per delta, first excluded, vs fp32): {d_raw / max(d_stored, 1):.2f}×")


if __name__ == "__main__":
    main()
