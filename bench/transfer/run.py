"""Push and clone over loopback against `cp -r` + `sync` of the same repository (issue 72).

Per corpus series (`traj-fp32`, `traj-bf16`, `ft-fp32`): the series is committed into a
repository (`MDL_NO_BACKGROUND=1`, then `mdl maintenance`, so older versions are reverse
deltas as a user's repository holds them), served by `mdl serve` on 127.0.0.1, and, in each of
`--runs` rounds, in the same disk's folder:

- cp: `cp -r` of the repository's folder, then `sync` (what copying it by hand costs);
- clone: `mdl clone` of the served repository into a fresh folder;
- push: `mdl push` of that clone into an empty repository served by a second `mdl serve`.

Each row prints the median wall time of each, MB/s of stored bytes (the repository's folder),
the ratio to the same round's cp, and each end's CPU seconds (user + system: the client's from
its exit status, the server's from /proc). One more round of clone and push runs under
`strace -c -f` (when strace is there), for each end's fsync-family calls and the seconds spent
in them; strace slows what it watches, so those rounds are not timed.

    python3 bench/transfer/run.py [--corpus DIR] [--mdl PATH] [--runs 5] [--work DIR]

With `--shallow`, instead: per series, `mdl clone --depth 1` beside a whole clone of the same
served repository (bytes moved, from `--json`, and median wall time), against the newest
commit's stored size (its tensors' records, from `mdl show --json`); then `fetch --deepen 4` in
the shallow clone (issue 72's target: depth 1 moves at most 1.1x the newest commit's stored
size).

`--work` is where the repositories go (default: a folder under /tmp, the disk a user's
repositories live on; not /dev/shm, where fsync costs nothing). Needs ../shared/corpus/make.sh
run once, and a release build (`cargo build --release -p mdl-cli`).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SERIES = ["traj-fp32", "traj-bf16", "ft-fp32"]
SYNCS = ("fsync", "fdatasync", "syncfs", "sync_file_range")


def run(cmd, env=None, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def env():
    e = dict(os.environ)
    e["MDL_NO_BACKGROUND"] = "1"
    return e


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def cpu_of(pid):
    """User + system seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


class Server:
    """`mdl serve` of one repository; its URL, pid and owner token."""

    def __init__(self, mdl, repo, public):
        args = [mdl, "-C", repo, "serve", "--addr", "127.0.0.1:0"]
        if public:
            args.append("--read-public")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env()
        )
        self.url = None
        for line in self.proc.stdout:
            m = re.match(r"serving (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            raise SystemExit(f"mdl serve {repo} printed no URL")
        with open(os.path.join(repo, ".mdl", "serve.json")) as f:
            self.token = json.load(f)["token"]

    def cpu(self):
        return cpu_of(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def timed(cmd):
    """Wall seconds and the command's own CPU seconds (children included)."""
    before = os.times()
    t = time.perf_counter()
    run(cmd, env=env())
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return wall, cpu


def fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    run(["sync"])


def syncs_of(strace_out):
    """Calls and seconds of the fsync family in `strace -c` output."""
    calls, secs = 0, 0.0
    for line in strace_out.splitlines():
        parts = line.split()
        if parts and parts[-1] in SYNCS and len(parts) >= 5:
            secs += float(parts[1])
            calls += int(parts[3])
    return calls, secs


def strace_round(mdl, work, src_url, name):
    """Clone and push once under strace: each end's fsync calls and seconds."""
    if shutil.which("strace") is None:
        return None
    out = {}
    clone = os.path.join(work, "st-clone")
    fresh(clone)
    log = os.path.join(work, "strace.txt")
    run(["strace", "-f", "-c", "-o", log, mdl, "clone", src_url, clone], env=env())
    out["clone client"] = syncs_of(open(log).read())
    dst = os.path.join(work, "st-dst")
    fresh(dst)
    run([mdl, "init", dst])
    server = Server(mdl, dst, public=False)
    watcher = subprocess.Popen(
        ["strace", "-f", "-c", "-o", log, "-p", str(server.proc.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    run([mdl, "-C", clone, "remote", "add", "dst", server.url])
    run([mdl, "-C", clone, "--token", server.token, "push", "dst", "main"], env=env())
    time.sleep(0.2)
    watcher.terminate()
    watcher.wait()
    out["push server"] = syncs_of(open(log).read())
    server.stop()
    return out


def build(mdl, corpus, work, name):
    """The series committed into a repository, maintained: its folder and checkpoint count."""
    src = os.path.join(work, name)
    fresh(src)
    run([mdl, "init", src])
    ckpts = sorted(os.listdir(os.path.join(corpus, name)))
    for c in ckpts:
        run([mdl, "-C", src, "commit", os.path.join(corpus, name, c), "-m", c], env=env())
    run([mdl, "-C", src, "maintenance"], env=env())
    return src, ckpts


def moved(mdl, args):
    """Wall seconds and record bytes of `mdl --json ARGS`."""
    t = time.perf_counter()
    out = run([mdl, "--json", *args], env=env()).stdout
    return time.perf_counter() - t, json.loads(out)["bytes"]


def shallow(mdl, corpus, work, name, runs):
    src, ckpts = build(mdl, corpus, work, name)
    shown = json.loads(run([mdl, "-C", src, "--json", "show", "main"]).stdout)
    newest = sum(t["stored_bytes"] for t in shown["tensors"])
    server = Server(mdl, src, public=True)
    rows = {k: [] for k in ("depth1", "full")}
    sizes = {}
    try:
        for r in range(runs):
            for key, extra in (("depth1", ["--depth", "1"]), ("full", [])):
                clone = os.path.join(work, key)
                fresh(clone)
                wall, n = moved(mdl, ["clone", *extra, server.url, clone])
                rows[key].append(wall)
                sizes[key] = n
        _, sizes["deepen"] = moved(mdl, ["-C", os.path.join(work, "depth1"), "fetch", "--deepen", "4"])
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    return len(ckpts), newest, sizes, med


def bench(mdl, corpus, work, name, runs):
    src, ckpts = build(mdl, corpus, work, name)
    stored = du(src)
    server = Server(mdl, src, public=True)
    rows = {k: [] for k in ("cp", "clone", "push", "clone_c", "clone_s", "push_c", "push_s")}
    try:
        for r in range(runs):
            copy = os.path.join(work, "cp")
            fresh(copy)
            t = time.perf_counter()
            run(["cp", "-r", src, copy])
            run(["sync"])
            rows["cp"].append(time.perf_counter() - t)

            clone = os.path.join(work, "clone")
            fresh(clone)
            s0 = server.cpu()
            wall, cpu = timed([mdl, "clone", server.url, clone])
            rows["clone"].append(wall)
            rows["clone_c"].append(cpu)
            rows["clone_s"].append(server.cpu() - s0)

            dst = os.path.join(work, "dst")
            fresh(dst)
            run([mdl, "init", dst])
            target = Server(mdl, dst, public=False)
            try:
                run([mdl, "-C", clone, "remote", "add", "dst", target.url])
                s0 = target.cpu()
                wall, cpu = timed(
                    [mdl, "-C", clone, "--token", target.token, "push", "dst", "main"]
                )
                rows["push"].append(wall)
                rows["push_c"].append(cpu)
                rows["push_s"].append(target.cpu() - s0)
            finally:
                target.stop()
        syncs = strace_round(mdl, work, server.url, name)
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = {
        k: statistics.median(c / t for c, t in zip(rows["cp"], rows[k]))
        for k in ("clone", "push")
    }
    return stored, len(ckpts), med, ratio, syncs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    ap.add_argument("--mdl", default=os.path.join(ROOT, "target", "release", "mdl"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default=None)
    ap.add_argument("--series", nargs="*", default=SERIES)
    ap.add_argument("--shallow", action="store_true")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="mdl-transfer-")
    os.makedirs(work, exist_ok=True)
    if a.shallow:
        try:
            shallow_table(a, work)
        finally:
            if a.work is None:
                shutil.rmtree(work, ignore_errors=True)
        return
    print(f"# mdl push and clone over loopback, {a.runs} rounds, medians ({work})")
    print()
    print(
        "| series | stored | cp -r + sync | clone | clone MB/s | cp/clone | client, server CPU | "
        "push | push MB/s | cp/push | client, server CPU |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    syncs = {}
    try:
        for name in a.series:
            if not os.path.isdir(os.path.join(a.corpus, name)):
                print(f"(no {name} in {a.corpus}: run ../shared/corpus/make.sh)", file=sys.stderr)
                continue
            stored, n, m, ratio, s = bench(a.mdl, a.corpus, work, name, a.runs)
            syncs[name] = s
            mb = stored / 1e6
            print(
                f"| {name} ({n} commits) | {mb:.0f} MB | {m['cp']:.2f} s | {m['clone']:.2f} s | "
                f"{mb / m['clone']:.0f} | {ratio['clone']:.2f}× | "
                f"{m['clone_c']:.2f} s, {m['clone_s']:.2f} s | {m['push']:.2f} s | "
                f"{mb / m['push']:.0f} | {ratio['push']:.2f}× | "
                f"{m['push_c']:.2f} s, {m['push_s']:.2f} s |",
                flush=True,
            )
        print()
        print("fsync-family calls (seconds in them), one round under strace -c -f:")
        print()
        print("| series | clone: client | push: server |")
        print("| --- | ---: | ---: |")
        for name, s in syncs.items():
            if s is None:
                print(f"| {name} | (no strace) | |")
                continue
            c, p = s["clone client"], s["push server"]
            print(f"| {name} | {c[0]} ({c[1]:.3f} s) | {p[0]} ({p[1]:.3f} s) |")
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


def shallow_table(a, work):
    print(f"# mdl clone --depth 1 against a whole clone, {a.runs} rounds, medians ({work})")
    print()
    print(
        "| series | newest commit stored | depth 1 moves | ratio | whole clone moves | "
        "depth 1 time | whole clone time | then fetch --deepen 4 moves |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in a.series:
        if not os.path.isdir(os.path.join(a.corpus, name)):
            print(f"(no {name} in {a.corpus}: run ../shared/corpus/make.sh)", file=sys.stderr)
            continue
        n, newest, sizes, med = shallow(a.mdl, a.corpus, work, name, a.runs)
        mb = lambda b: f"{b / 1e6:.1f} MB"
        print(
            f"| {name} ({n} commits) | {mb(newest)} | {mb(sizes['depth1'])} | "
            f"{sizes['depth1'] / newest:.3f}× | {mb(sizes['full'])} | {med['depth1']:.2f} s | "
            f"{med['full']:.2f} s | {mb(sizes['deepen'])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
