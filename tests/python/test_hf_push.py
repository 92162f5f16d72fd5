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


def test_large_files_go_through_xet_or_lfs_as_the_client_is_installed(tmp_path, serve, monkeypatch):
    """Files of at least `mdl serve --hf-lfs-from` (64K here) are uploaded before the commit,
    streamed: through Xet by a default install (hf_xet: xorbs, then a shard, rebuilt and checked
    against the file's SHA-256 by the server), through git LFS by a client without it (one PUT
    each); each commit names the files by SHA-256 and downloads give them back byte for byte."""
    import hf_xet  # noqa: F401  (a default install has it: this test is about that client)
    import huggingface_hub.constants

    root = tmp_path / "repos"
    root.mkdir()
    endpoint = f"{serve(root, root=True, args=['--hf-lfs-from', '64K']).base}/hf"
    HfApi(endpoint=endpoint, token=ADMIN_TOKEN).create_repo("team/big")
    api = HfApi(endpoint=endpoint, token=WRITE_TOKEN)
    big = root / "team" / "big"
    for message, seed, xet in [("through xet", 1, True), ("through lfs", 2, False)]:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", not xet)
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=2))
        folder = save_pretrained(model, tmp_path / message.replace(" ", "-"))
        assert (folder / "model.safetensors").stat().st_size > 64 << 10
        info = api.upload_folder(repo_id="team/big", folder_path=folder, commit_message=message)
        log = mdl("-C", big, "log", "--json")
        assert log[0]["message"] == message and log[0]["id"] == info.oid
        snap = snapshot_download("team/big", endpoint=endpoint, token=READ_TOKEN, cache_dir=str(tmp_path / "cache"))
        assert tree_bytes(snap) == tree_bytes(folder), message
        shown = mdl("-C", big, "show", "HEAD", "--json")
        assert len([t for t in shown["tensors"] if t["file"] == "model.safetensors"]) > 10
        # Nothing is left staged once committed (xorbs wait a day for another shard).
        assert not list((big / ".mdl" / "incoming").glob("lfs-*"))
    assert [e["message"] for e in mdl("-C", big, "log", "--json")] == ["through lfs", "through xet"]
