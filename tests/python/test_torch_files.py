"""Files written by the real torch.save, committed per storage and checked out byte for byte."""

import shutil

import pytest
import torch

from conftest import mdl, tree_bytes


def tiny_adamw(steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def write_all(d):
    """Every kind of torch.save file the issue names, into folder `d`."""
    model, opt = tiny_adamw()
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    base = torch.randn(8, 12)
    torch.save(
        {
            "bf16": torch.randn(64, 8).to(torch.bfloat16),
            "fp16": torch.randn(100).to(torch.float16),
            "fp32": torch.randn(3, 5, 7),
            "int64": torch.arange(50),
            "shared_a": base,
            "shared_b": base[2:5],  # a view of the same storage
            "transposed": base.t(),  # not contiguous
            "strided": torch.randn(10, 10)[::2, 1::3],
        },
        d / "tensors.pt",
    )
    torch.save(
        {
            "epoch": 3,
            "global_step": 2,
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [opt.state_dict()],
            "lr_schedulers": [{"last_epoch": 2}],
            "hyper_parameters": {"lr": 1e-3},
        },
        d / "last.ckpt",
    )
    torch.save({"w": torch.ones(4)}, d / "protocol0.pt", pickle_protocol=0)
    torch.save(torch.randn(4, 4), d / "bare_tensor.pth")
    # A zip that is not a torch archive, and one whose entries are compressed.
    import zipfile

    with zipfile.ZipFile(d / "notes.zip", "w") as z:
        z.writestr("a.txt", "hello")
    with zipfile.ZipFile(d / "deflated.pt", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 100)


def test_every_kind_round_trips_and_is_split(tmp_path, repo):
    src = tmp_path / "ck"
    src.mkdir()
    write_all(src)
    mdl("-C", repo, "commit", src, "-m", "torch files")
    out = tmp_path / "out"
    mdl("-C", repo, "checkout", "main", "-o", out)
    assert tree_bytes(out) == tree_bytes(src)
    # torch loads what was checked out, to the same values.
    for name in ["optimizer.pt", "tensors.pt", "last.ckpt"]:
        a = torch.load(src / name, weights_only=True)
        b = torch.load(out / name, weights_only=True)
        assert repr(a) == repr(b)

    shown = mdl("-C", repo, "--json", "show", "main")
    files = {f["path"]: f for f in shown["files"]}
    for name in ["optimizer.pt", "pytorch_model.bin", "tensors.pt", "last.ckpt", "bare_tensor.pth"]:
        assert files[name]["format"] == "torch", name
    # The pickle of protocol 0 uses opcodes outside the reader's set: stored whole, with why.
    assert files["protocol0.pt"]["format"] == "bytes"
    assert "opcode" in files["protocol0.pt"]["note"]
    assert files["notes.zip"]["format"] == "bytes"
    assert "not a torch archive" in files["notes.zip"]["note"]
    assert "compressed" in files["deflated.pt"]["note"]
    tensors = {(t["file"], t["name"]): t for t in shown["tensors"]}
    assert tensors[("optimizer.pt", "state.0.exp_avg")]["shape"] == [16, 32]
    assert tensors[("last.ckpt", "optimizer_states.0.state.2.exp_avg_sq")]["shape"] == [4, 16]
    assert tensors[("tensors.pt", "bf16")]["dtype"] == "BF16"
    assert tensors[("tensors.pt", "fp16")]["dtype"] == "F16"
    assert tensors[("tensors.pt", "int64")]["dtype"] == "I64"
    # A storage viewed by two tensors is stored once, under the first name.
    assert ("tensors.pt", "shared_b") not in tensors
    # The same weights in pytorch_model.bin and in the Lightning checkpoint are one object.
    assert (
        tensors[("pytorch_model.bin", "0.weight")]["id"]
        == tensors[("last.ckpt", "state_dict.model.0.weight")]["id"]
    )


def test_a_second_save_stores_only_what_changed(tmp_path, repo):
    model, opt = tiny_adamw(steps=2)
    a = tmp_path / "a"
    a.mkdir()
    torch.save(opt.state_dict(), a / "optimizer.pt")
    first = mdl("-C", repo, "--json", "commit", a)
    # One more step changes every moment; an identical copy changes nothing.
    b = tmp_path / "b"
    shutil.copytree(a, b)
    again = mdl("-C", repo, "--json", "commit", b)
    assert again["new_tensors"] == 0
    assert again["stored_bytes"] < first["stored_bytes"] / 2
    model(torch.randn(8, 32)).pow(2).mean().backward()
    opt.step()
    torch.save(opt.state_dict(), b / "optimizer.pt")
    third = mdl("-C", repo, "--json", "commit", b)
    assert third["new_tensors"] > 0
    out = tmp_path / "out"
    # A commit of one file goes into a folder given with a trailing slash.
    mdl("-C", repo, "checkout", "main", "-o", f"{out}/")
    assert tree_bytes(out) == tree_bytes(b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lossy_pairs_moments_in_optimizer_pt_by_order(tmp_path, repo, dtype):
    """A Trainer-like folder: weights in safetensors, AdamW moments in optimizer.pt."""
    from safetensors.torch import save_file

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 24)).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.85, 0.97))
    for _ in range(3):
        model(torch.randn(16, 64, dtype=dtype)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    d = tmp_path / "checkpoint-3"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, d / "model.safetensors")
    torch.save(opt.state_dict(), d / "optimizer.pt")
    mdl("-C", repo, "commit", d, "--lossy", "--step", "3", "--metric", "loss=2.0")
    shown = mdl("-C", repo, "--json", "show", "main")
    pairs = {p["param"]: p for p in shown["pairs"]}
    # The estimate's bias corrections use the optimizer's own betas, read from its param_groups.
    assert shown["adam_betas"] == "0.85,0.97 (recorded in optimizer.pt)"
    # Both weight matrices have shapes no other tensor has: paired by the optimizer's order.
    for name, k in [("0.weight", 0), ("2.weight", 2)]:
        p = pairs[f"model.safetensors: {name}"]
        assert p["source"] == "optimizer_order"
        assert p["exp_avg"] == f"optimizer.pt: state.{k}.exp_avg"
    out = tmp_path / "out"
    mdl("-C", repo, "checkout", "main", "-o", out)
    # Lossy: the reconstruction loads, with the original's names and shapes.
    restored = torch.load(out / "optimizer.pt", weights_only=True)
    assert restored["state"].keys() == opt.state_dict()["state"].keys()
