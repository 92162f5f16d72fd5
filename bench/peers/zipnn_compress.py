"""ZipNN (PyPI `zipnn`, pinned by scripts/bench-peers.sh) over checkpoint files, for the
benchmarks that set mdl beside it (bench/speed, bench/whole-work).

Each file is read whole, compressed in memory (from a copy: ZipNN reorders its input's bytes
in place) with the byte grouping of the dtype that holds most of its bytes (from its
safetensors header), decompressed, and compared with the file byte for byte. Prints one JSON line a file: raw and compressed bytes, compression wall and CPU seconds (this
process, all threads), decompression wall seconds, and whether it round-tripped. Python's and
torch's start-up are outside every figure (ZipNN imports torch).

    PYTHONPATH=ZIPNN_DIR python bench/peers/zipnn_compress.py [--threads N] FILE...

The benchmarks call `series`, which runs this file so and sums its lines.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def dominant_dtype(data: bytes) -> str:
    """The byte grouping for the float dtype with the most bytes in a safetensors file."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    size: dict[str, int] = {}
    for name, t in header.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            size[t["dtype"]] = size.get(t["dtype"], 0) + b - a
    floats = {d: s for d, s in size.items() if d in DTYPES}
    return DTYPES[max(floats, key=floats.get)] if floats else "float32"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def series(files: list[str], python: str, path: str, threads: int) -> dict:
    """ZipNN over `files` with `python` (which has torch) and ZipNN installed in `path`:
    ratio, compression MB/s and CPU-seconds, and whether every file round-tripped."""
    env = dict(os.environ, PYTHONPATH=path)
    r = subprocess.run([python, os.path.abspath(__file__), "--threads", str(threads), *files],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"ZipNN failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    raw = sum(x["raw"] for x in rows)
    return {
        "ratio": raw / sum(x["compressed"] for x in rows),
        "mbps": raw / sum(x["seconds"] for x in rows) / 1e6,
        "cpu": sum(x["cpu"] for x in rows),
        "round_trips": all(x["round_trips"] for x in rows),
    }


def main() -> None:
    from zipnn import ZipNN  # only where it is installed: `series` runs this file so

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    for path in args.files:
        with open(path, "rb") as f:
            data = f.read()
        # ZipNN's compression regroups the bytes of its input in place (even of a `bytes`):
        # it is given a copy, and its output is compared with the file's bytes.
        scratch = bytearray(data)
        z = ZipNN(bytearray_dtype=dominant_dtype(data), threads=args.threads)
        c0, t0 = cpu(), time.perf_counter()
        packed = z.compress(scratch)
        t1, c1 = time.perf_counter(), cpu()
        back = z.decompress(packed)
        t2 = time.perf_counter()
        print(json.dumps({
            "file": path,
            "raw": len(data),
            "compressed": len(packed),
            "seconds": t1 - t0,
            "cpu": c1 - c0,
            "decompress_seconds": t2 - t1,
            "round_trips": bytes(back) == data,
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
