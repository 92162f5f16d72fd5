"""`mdl merge` against a reference written here in numpy from the documented formulas
(crates/mdl/src/merge/combine.rs): every strategy, every float dtype, merged tensors equal to
the reference bit for bit; what is identical everywhere or not a float is taken as it is."""

import json
import math
import struct

import numpy as np
import pytest

from conftest import mdl

LANE = {"F32": np.float32, "BF16": np.float32, "F16": np.float32, "F64": np.float64}


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, raw little-endian bytes)."""
    header, offset, data = {}, 0, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    return {
        k: (v["dtype"], tuple(v["shape"]), body[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in header.items()
        if k != "__metadata__"
    }


def to_lane(dtype, raw):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").copy()
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, "<f8").copy()


def from_lane(dtype, x):
    if dtype == "F32":
        return x.astype("<f4").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    if dtype == "BF16":  # round to nearest, ties to even (no NaN here)
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
    return x.astype("<f8").tobytes()


def reference(strategy, dtype, weights, xs, base=None, density=None):
    t = LANE[dtype]
    xs = [to_lane(dtype, x) for x in xs]
    if strategy == "linear":
        c = [t(w / sum(weights)) for w in weights]
        acc = c[0] * xs[0]
        for ci, x in zip(c[1:], xs[1:]):
            acc = acc + ci * x
        return from_lane(dtype, acc)
    b = to_lane(dtype, base)
    w = [t(v) for v in weights]
    if strategy == "task-arithmetic":
        acc = w[0] * (xs[0] - b)
        for wi, x in zip(w[1:], xs[1:]):
            acc = acc + wi * (x - b)
        return from_lane(dtype, b + acc)
    n = b.size
    k = min(max(math.ceil(density * n), 1), n)
    trimmed = []
    for x in xs:
        d = x - b
        threshold = np.partition(np.abs(d), n - k)[n - k]
        trimmed.append(np.where(np.abs(d) >= threshold, d, t(0)))
    s = w[0] * trimmed[0]
    for wi, d in zip(w[1:], trimmed[1:]):
        s = s + wi * d
    num, den = np.zeros(n, t), np.zeros(n, t)
    for wi, d in zip(w, trimmed):
        agree = ((s > 0) & (d > 0)) | ((s < 0) & (d < 0))
        num = np.where(agree, num + wi * d, num)
        den = np.where(agree, den + wi, den)
    merged = np.divide(num, den, out=np.zeros(n, t), where=den != 0)
    return from_lane(dtype, b + merged)


def as_raw(dtype, values):
    return from_lane(dtype, values.astype(LANE[dtype]))


@pytest.fixture
def fine_tunes(tmp_path):
    """A base on main and three fine-tunes of it on branches a, b and c."""
    rng = np.random.default_rng(7)
    shapes = {"F32": (257, 33), "BF16": (64, 48), "F16": (300,), "F64": (40, 3)}
    base = {f"w.{d.lower()}": (d, s, as_raw(d, rng.standard_normal(s).ravel())) for d, s in shapes.items()}
    base["frozen"] = ("F32", (16,), as_raw("F32", rng.standard_normal(16)))
    base["step"] = ("I64", (1,), np.array([100], "<i8").tobytes())
    repo = tmp_path / "repo"
    mdl("init", repo)
    write_safetensors(tmp_path / "base.safetensors", base)
    mdl("-C", repo, "commit", tmp_path / "base.safetensors", "-m", "base")
    versions = {}
    for i, branch in enumerate("abc"):
        tensors = dict(base)
        for name, (d, s, raw) in base.items():
            if name.startswith("w."):
                x = to_lane(d, raw).astype(np.float64)
                move = rng.standard_normal(x.size) * 0.05
                move[rng.random(x.size) < 0.3] = 0  # entries a fine-tune left alone
                tensors[name] = (d, s, as_raw(d, x + move))
        tensors["step"] = ("I64", (1,), np.array([200 + i], "<i8").tobytes())
        f = tmp_path / f"{branch}.safetensors"
        write_safetensors(f, tensors)
        mdl("-C", repo, "commit", f, "--branch", branch, "-m", branch)
        versions[branch] = tensors
    return repo, base, versions


CASES = [
    ("linear", None, {}),
    ("linear", "0.2,0.3,0.5", {}),
    ("task-arithmetic", "0.7,0.4,1.0", {}),
    ("ties", "1,0.5,1", {"density": 0.3}),
    ("ties", None, {"density": 1.0}),
]


@pytest.mark.parametrize("strategy,weights,extra", CASES)
def test_merged_tensors_equal_the_numpy_reference_bit_for_bit(tmp_path, fine_tunes, strategy, weights, extra):
    repo, base, versions = fine_tunes
    args = ["-C", repo, "merge", "a", "b", "c", "--strategy", strategy, "--branch", "merged"]
    if weights:
        args += ["--weights", weights]
    if "density" in extra:
        args += ["--density", str(extra["density"])]
    mdl(*args)
    out = tmp_path / "merged.safetensors"
    mdl("-C", repo, "checkout", "merged", "-o", out)
    merged = read_safetensors(out)

    w = [float(v) for v in weights.split(",")] if weights else ([1 / 3] * 3 if strategy == "linear" else [1.0] * 3)
    for name, (dtype, shape, raw) in base.items():
        got = merged[name]
        assert got[:2] == (dtype, shape), name
        if name == "frozen":
            assert got[2] == raw
        elif name == "step":
            assert got[2] == versions["a"]["step"][2]  # not a float: the first branch's
        else:
            want = reference(strategy, dtype, w, [versions[b][name][2] for b in "abc"], base=raw, density=extra.get("density"))
            assert got[2] == want, f"{strategy} {name}: {sum(x != y for x, y in zip(got[2], want))} bytes differ"

    shown = mdl("-C", repo, "show", "merged", "--json")
    assert shown["properties"]["merge.strategy"] == strategy
    assert len(shown["parents"]) == 4  # main's commit, then a, b and c


def test_the_python_api_merges_as_the_cli_does(fine_tunes):
    import mdl as package

    repo_path, _, _ = fine_tunes
    repo = package.open(repo_path)
    out = repo.merge(["a", "b"], weights=[0.25, 0.75], branch="py")
    assert out["computed"] == 4 and out["identical"] == 1 and out["commit"]["branch"] == "py"
    assert out["merged"] == [mdl("-C", repo_path, "show", r, "--json")["id"] for r in ("a", "b")]
    mdl("-C", repo_path, "merge", "a", "b", "--weights", "0.25,0.75", "--branch", "cli")
    ids = lambda rev: {t["name"]: t["id"] for t in mdl("-C", repo_path, "show", rev, "--json")["tensors"]}
    assert ids("py") == ids("cli")
    before = mdl("-C", repo_path, "log", "--all", "--json")
    for bad in [dict(strategy="soup"), dict(weights=[1.0]), dict(strategy="ties", density=0.0)]:
        with pytest.raises(package.MdlError):
            repo.merge(["a", "b"], **bad)
    assert mdl("-C", repo_path, "log", "--all", "--json") == before
