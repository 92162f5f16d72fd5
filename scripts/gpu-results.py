"""Issue 45's targets from what `scripts/gpu-check.sh run` measured in OUT (kernels.md, e2e.md,
baselines.md, auto.txt): prints a Markdown table and writes OUT/results.json, the object
`bench/gpu/results.json` keeps. A target not measured in the run (or whose path mdl does not have
yet) is null, and the table says which.

    IDENTICAL=true|false COMMIT=SHA python3 scripts/gpu-results.py OUT
"""

import datetime
import json
import os
import re
import sys


def rows(path):
    """The cells of every row of a Markdown table in `path` (header and rule left out)."""
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0] in ("kernel", "step"):
            continue
        out.append(cells)
    return out


def gbps(cell):
    m = re.search(r"([0-9.]+) GB/s", cell)
    return float(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    kernels = {r[0]: r for r in rows(os.path.join(out, "kernels.md"))}
    e2e = rows(os.path.join(out, "e2e.md"))
    base = rows(os.path.join(out, "baselines.md"))
    # bench/gpu-stall/run.py: | snapshot | engine | d2d ms | stall ms | stall / d2d |
    # device-wide ms | s | GB/s |
    stall = {(r[0], r[1]): r for r in rows(os.path.join(out, "stall.md")) if len(r) >= 8}
    # | load | engine | s | GB/s |: load_state(device="cuda") of the newest commit.
    loaded = {r[1]: float(r[3]) for r in rows(os.path.join(out, "stall.md")) if len(r) == 4 and r[0] == "load"}

    def stalled(snapshot, engine, col):
        r = stall.get((snapshot, engine))
        return float(r[col]) if r else None
    device = "unknown"
    kmd = os.path.join(out, "kernels.md")
    if os.path.exists(kmd):
        first = open(kmd).readline()
        if first.startswith("device: "):
            device = first[len("device: "):].strip()

    def kernel(name, col):
        r = kernels.get(name)
        if not r:
            return None
        return float(r[col].rstrip(" %"))

    commits = [r for r in e2e if r[0].startswith("commit") and "lossless" in r[0]]
    lossy = [r for r in e2e if r[0].startswith("commit") and "--lossy" in r[0]]

    def rate(rs, engine):
        """The best GB/s of the rows `rs` run on `engine`."""
        found = [gbps(" | ".join(r[2:])) for r in rs if r[1] == engine]
        return max((f for f in found if f is not None), default=None)

    lossless_gpu, lossless_cpu = rate(commits, "gpu"), rate(commits, "cpu")
    lossy_gpu, lossy_cpu = rate(lossy, "gpu"), rate(lossy, "cpu")
    checkout = [r for r in e2e if r[0].startswith("checkout")]
    checkout_gpu, checkout_cpu = rate(checkout, "gpu"), rate(checkout, "cpu")
    host_write = gbps(" | ".join(base[0][2:])) if base else None
    hist = kernel("plane histograms", 4)
    hash_gbps = kernel("tensor id (BLAKE3)", 3)
    encode = kernel("encode, host to host", 3)
    decode = kernel("decode, host to host", 3)
    residual_search = kernel("residual search, host to host", 3)
    residual_encode = kernel("residual encode, host to host", 3)

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    results = {
        "date": datetime.date.today().isoformat(),
        "commit": os.environ.get("COMMIT", "unknown"),
        "device": device,
        "cores": os.cpu_count(),
        # commit_state(..., snapshot="device") against a device-to-device copy of the state.
        # The training loop's stream held (the call and its queued work), in ms, against the
        # copy; and the whole device caught up (the snapshot's copy to the host included).
        "stall_over_d2d": stalled("device", "gpu", 4),
        "stall_ms": stalled("device", "gpu", 3),
        "copy_ms": stalled("device", "gpu", 2),
        "stall_device_wide_ms": stalled("device", "gpu", 5),
        "stall_over_d2d_host_snapshot": stalled("host", "gpu", 4),
        # commit_state from CUDA state (device snapshot) to durable, GPU and CPU engine.
        "commit_from_device_gbps": stalled("device", "gpu", 7),
        "commit_from_device_cpu_gbps": stalled("device", "cpu", 7),
        "gpu_over_cpu_commit_from_device": ratio(
            stalled("device", "gpu", 7), stalled("device", "cpu", 7)
        ),
        # From a file in the page cache with --engine gpu.
        "commit_lossless_gbps": lossless_gpu,
        "commit_lossy_gbps": lossy_gpu,
        # load_state(device="cuda"): the GPU engine decodes into the CUDA tensors in place.
        "load_device_gbps": loaded.get("gpu"),
        "load_device_cpu_gbps": loaded.get("cpu"),
        "checkout_file_gbps": checkout_gpu,
        "gpu_over_cpu_commit": ratio(lossless_gpu, lossless_cpu),
        "gpu_over_cpu_lossy": ratio(lossy_gpu, lossy_cpu),
        "gpu_over_cpu_checkout": ratio(checkout_gpu, checkout_cpu),
        # Issue 44's target 9: the CPU engine on all cores against two of them (>= 6x on 16).
        "cpu_all_over_2_commit": ratio(rate(commits, "cpu-all"), rate(commits, "cpu-2")),
        "cpu_all_over_2_checkout": ratio(rate(checkout, "cpu-all"), rate(checkout, "cpu-2")),
        "histogram_of_copy": round(hist / 100, 3) if hist is not None else None,
        "encode_gbps": encode,
        "decode_gbps": decode,
        "tensor_id_gbps": hash_gbps,
        # The lossy path's residual quantizer on the device (raw weights a second).
        "residual_search_gbps": residual_search,
        "residual_encode_gbps": residual_encode,
        "host_write_gbps": host_write,
        "identical_bytes": os.environ.get("IDENTICAL", "false") == "true",
        "auto": open(os.path.join(out, "auto.txt")).read().strip()
        if os.path.exists(os.path.join(out, "auto.txt")) else None,
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")

    def fmt(v, unit="", missing="not measured"):
        return missing if v is None else f"{v}{unit}"

    table = [
        "| target | measured | goal |",
        "| --- | ---: | --- |",
        f"| stall of `commit_state` with CUDA state / device copy | {fmt(results['stall_over_d2d'], '×')} ({fmt(results['stall_ms'], ' ms')} against {fmt(results['copy_ms'], ' ms')}; device-wide {fmt(results['stall_device_wide_ms'], ' ms')}) | ≤ 1.2× |",
        f"| lossless commit from CUDA state (`commit_state`), GPU engine; CPU engine | {fmt(results['commit_from_device_gbps'], ' GB/s')}; {fmt(results['commit_from_device_cpu_gbps'], ' GB/s')} | ≥ 10 GB/s, ≥ 3× the CPU |",
        f"| lossless commit, GPU engine (file in page cache) | {fmt(lossless_gpu, ' GB/s')} | ≥ 10 GB/s (or 80 % of host write {fmt(host_write, ' GB/s')} × ratio) |",
        f"| lossy commit, GPU engine | {fmt(lossy_gpu, ' GB/s')} | ≥ 5 GB/s |",
        f"| GPU / CPU engine: commit, lossy, checkout | {fmt(results['gpu_over_cpu_commit'], '×')}, {fmt(results['gpu_over_cpu_lossy'], '×')}, {fmt(results['gpu_over_cpu_checkout'], '×')} | ≥ 3× (checkout to a file ≥ 1×) |",
        f"| load into device memory | {fmt(results['load_device_gbps'], ' GB/s')} (CPU engine {fmt(results['load_device_cpu_gbps'], ' GB/s')}) | ≥ 20 GB/s |",
        f"| plane histograms / device copy | {fmt(results['histogram_of_copy'])} | ≥ 0.5 |",
        f"| tensor ids (BLAKE3) on the device | {fmt(hash_gbps, ' GB/s')} | off the critical path |",
        f"| entropy encode, decode | {fmt(encode, ' GB/s')}, {fmt(decode, ' GB/s')} | ≥ 100 GB/s |",
        f"| residual search (15 steps, 1/8 sample), residual encode | {fmt(residual_search, ' GB/s')}, {fmt(residual_encode, ' GB/s')} | lossy commit ≥ 5 GB/s |",
        f"| identical bytes to the CPU engine | {str(results['identical_bytes']).lower()} | true |",
        f"| CPU engine, all {os.cpu_count()} cores / 2 cores: commit, checkout (issue 44) | {fmt(results['cpu_all_over_2_commit'], '×')}, {fmt(results['cpu_all_over_2_checkout'], '×')} | ≥ 6× on 16 cores |",
    ]
    text = "\n".join(table) + "\n"
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write(f"device: {device}; commit {results['commit']}; {results['date']}\n\n" + text)
    print(text)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
