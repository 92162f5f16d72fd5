"""Publishing with the real huggingface_hub client to a real `mdl serve` (HF_ENDPOINT's write
routes): create_repo, upload_folder of a save_pretrained folder, upload_file, create_commit
with a deletion, create_branch and create_tag; each upload is one mdl commit, downloads give
back the uploaded bytes, and a second fine-tune stores only what changed."""

import json

import pytest
import torch
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import GPT2Config, GPT2LMHeadModel

from conftest import ADMIN_TOKEN, READ_TOKEN, WRITE_TOKEN, mdl, tree_bytes


def save_pretrained(model, path):
    model.save_pretrained(path)
    return path


@pytest.fixture
def hub(tmp_path, serve):
    root = tmp_path / "repos"
    root.mkdir()
    server = serve(root, root=True)
    endpoint = f"{server.base}/hf"
    return endpoint, root


def test_a_fine_tune_pushed_with_huggingface_hub_is_one_commit_each_and_downloads_identically(tmp_path, hub):
    endpoint, root = hub
    admin = HfApi(endpoint=endpoint, token=ADMIN_TOKEN)
    api = HfApi(endpoint=endpoint, token=WRITE_TOKEN)
    admin.create_repo("team/ft")
    admin.create_repo("team/ft", exist_ok=True)  # the Hub's "create unless it exists"
    with pytest.raises(HfHubHTTPError):
        api.create_repo("other")  # creating a repository takes an admin token

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    base = save_pretrained(model, tmp_path / "base")
    info = api.upload_folder(repo_id="team/ft", folder_path=base, commit_message="base model")

    # A fine-tune of it: a few tensors move, the rest stay.
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.add_(0.01)
    tuned = save_pretrained(model, tmp_path / "tuned")
    info2 = api.upload_folder(repo_id="team/ft", folder_path=tuned, commit_message="fine-tune")
    assert info2.oid != info.oid

    log = mdl("-C", root / "team" / "ft", "log", "--json")
    assert [e["message"] for e in log] == ["fine-tune", "base model"]
    assert log[0]["id"] == info2.oid and log[0]["author"] == "writer"
    # Stored per tensor: the second upload adds only what changed.
    assert log[0]["stored_bytes"] < log[1]["stored_bytes"] / 4, log
    shown = mdl("-C", root / "team" / "ft", "show", "HEAD", "--json")
    assert len([t for t in shown["tensors"] if t["file"] == "model.safetensors"]) > 10

    # Downloads through the same client give back the uploaded bytes, file by file.
    snap = snapshot_download("team/ft", endpoint=endpoint, token=READ_TOKEN, cache_dir=str(tmp_path / "cache"))
    assert tree_bytes(snap) == tree_bytes(tuned)
    old = hf_hub_download("team/ft", "model.safetensors", revision=info.oid, endpoint=endpoint, token=READ_TOKEN,
                          cache_dir=str(tmp_path / "cache"))
    assert open(old, "rb").read() == (base / "model.safetensors").read_bytes()

    # One file, then a commit that adds one and deletes another: the rest of the tree stays.
    card = b"---\nlicense: mit\n---\n# ft\n"
    api.upload_file(path_or_fileobj=card, path_in_repo="README.md", repo_id="team/ft", commit_message="card")
    api.create_commit(
        repo_id="team/ft",
        operations=[
            CommitOperationAdd(path_in_repo="notes/eval.json", path_or_fileobj=json.dumps({"loss": 1.5}).encode()),
            CommitOperationDelete(path_in_repo="generation_config.json"),
        ],
        commit_message="eval notes",
    )
    files = sorted(s.rfilename for s in api.model_info("team/ft").siblings)
    assert files == ["README.md", "config.json", "model.safetensors", "notes/eval.json"]
    readme = hf_hub_download("team/ft", "README.md", endpoint=endpoint, token=READ_TOKEN, cache_dir=str(tmp_path / "cache"))
    assert open(readme, "rb").read() == card
    assert len(mdl("-C", root / "team" / "ft", "log", "--json")) == 4
    api.delete_file("notes/eval.json", repo_id="team/ft", commit_message="drop notes")  # deletions only
    assert sorted(s.rfilename for s in api.model_info("team/ft").siblings) == ["README.md", "config.json", "model.safetensors"]
    assert len(mdl("-C", root / "team" / "ft", "log", "--json")) == 5

    # Branches and tags are refs.
    api.create_branch("team/ft", branch="exp", revision=info.oid)
    api.create_tag("team/ft", tag="v1", revision="main", tag_message="first release")
    branches = {b["name"]: b["target"] for b in mdl("-C", root / "team" / "ft", "branch", "--json")}
    assert branches["exp"] == info.oid
    tags = {t["name"] for t in mdl("-C", root / "team" / "ft", "tag", "--json")}
    assert tags == {"v1"}
    api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/ft", revision="exp", commit_message="on exp")
    assert mdl("-C", root / "team" / "ft", "log", "exp", "--json")[0]["message"] == "on exp"
    assert mdl("-C", root / "team" / "ft", "log", "--json")[0]["message"] == "drop notes"


def test_refused_pushes_change_nothing(tmp_path, hub):
    endpoint, root = hub
    HfApi(endpoint=endpoint, token=ADMIN_TOKEN).create_repo("team/ft")
    api = HfApi(endpoint=endpoint, token=WRITE_TOKEN)
    api.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id="team/ft", commit_message="one")
    before = mdl("-C", root / "team" / "ft", "log", "--json")
    reader = HfApi(endpoint=endpoint, token=READ_TOKEN)
    cases = [
        lambda: reader.upload_file(path_or_fileobj=b"x", path_in_repo="a.txt", repo_id="team/ft", commit_message="m"),
        lambda: api.create_commit(repo_id="team/ft", operations=[CommitOperationDelete(path_in_repo="nope.txt")],
                                  commit_message="m"),
        lambda: api.upload_file(path_or_fileobj=b"x", path_in_repo="a.txt", repo_id="team/ft", commit_message="m",
                                create_pr=True),
        lambda: api.create_tag("team/ft", tag="bad..name", revision="main"),
    ]
    for case in cases:
        with pytest.raises(HfHubHTTPError):
            case()
        assert mdl("-C", root / "team" / "ft", "log", "--json") == before


def test_large_files_go_through_lfs_when_the_server_says_so(tmp_path, serve, monkeypatch):
    """With `mdl serve --hf-lfs-from`, files of that size are uploaded by git LFS (one PUT each,
    named by SHA-256 in the commit) by a client without Xet; one with Xet is refused, naming
    the variable, and nothing is committed."""
    import huggingface_hub.constants

    root = tmp_path / "repos"
    root.mkdir()
    endpoint = f"{serve(root, root=True, args=['--hf-lfs-from', '64K']).base}/hf"
    HfApi(endpoint=endpoint, token=ADMIN_TOKEN).create_repo("team/big")
    api = HfApi(endpoint=endpoint, token=WRITE_TOKEN)
    torch.manual_seed(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=2))
    folder = save_pretrained(model, tmp_path / "model")
    assert (folder / "model.safetensors").stat().st_size > 64 << 10

    # hf_xet is installed here, so the client asks for Xet for the large file: refused
    # (501), nothing committed.
    with pytest.raises(Exception) as refused:
        api.upload_folder(repo_id="team/big", folder_path=folder, commit_message="with xet")
    # (hf_xet reports the refusal by status and address, not by its message.)
    assert "501" in str(refused.value) and "xet-write-token" in str(refused.value)
    assert mdl("-C", root / "team" / "big", "log", "--json") == []

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    info = api.upload_folder(repo_id="team/big", folder_path=folder, commit_message="through lfs")
    log = mdl("-C", root / "team" / "big", "log", "--json")
    assert [e["message"] for e in log] == ["through lfs"] and log[0]["id"] == info.oid
    snap = snapshot_download("team/big", endpoint=endpoint, token=READ_TOKEN, cache_dir=str(tmp_path / "cache"))
    assert tree_bytes(snap) == tree_bytes(folder)
    shown = mdl("-C", root / "team" / "big", "show", "HEAD", "--json")
    assert len([t for t in shown["tensors"] if t["file"] == "model.safetensors"]) > 10
    # Nothing is left staged once committed.
    assert not list((root / "team" / "big" / ".mdl" / "incoming").glob("lfs-*"))
