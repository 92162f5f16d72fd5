"""The Hub's own tools against a real `mdl serve` (HF_ENDPOINT=.../hf), each as a fine-tuner types
it: `hf upload`, `push_to_hub` of a model and a tokenizer-less Trainer's folder, `create_repo`
without a namespace, `HfFileSystem` and `hf://` URLs through fsspec, `list_repo_refs`,
`list_repo_commits`, `get_paths_info`, `create_commit(parent_commit=...)` in the client's
40-digit form, and mdl's own error text in what the client raises."""

import os
import subprocess
import sys

import fsspec
import pytest
import torch
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, HfFileSystem, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import GPT2Config, GPT2LMHeadModel

from conftest import ADMIN_TOKEN, READ_TOKEN, WRITE_TOKEN, mdl, tree_bytes


@pytest.fixture
def hub(tmp_path, serve, monkeypatch):
    root = tmp_path / "repos"
    root.mkdir()
    server = serve(root, root=True)
    endpoint = f"{server.base}/hf"
    # As a user configures the client: the endpoint and the token in the environment.
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return endpoint, root


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2))


def test_push_to_hub_and_hf_upload_publish_to_the_namespace_they_name(tmp_path, hub):
    endpoint, root = hub
    # No namespace: the repository goes to the token holder's, as on the Hub.
    url = HfApi(endpoint=endpoint).create_repo("scratch")
    assert url.repo_id == "admin/scratch" and url.startswith(endpoint), url
    assert (root / "admin" / "scratch" / ".mdl").is_dir()

    # push_to_hub as a training script calls it, the endpoint in its environment; without a
    # namespace too (that repository did not exist: it is made, then filled).
    script = tmp_path / "push.py"
    script.write_text(
        "import sys, torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "torch.manual_seed(0)\n"
        "m = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2))\n"
        "m.push_to_hub('team/pushed', commit_message='first push')\n"
        "m.push_to_hub('mine', commit_message='into my namespace')\n"
        "m.save_pretrained(sys.argv[1])\n"
    )
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "saved")], capture_output=True, text=True,
                       env=os.environ)
    assert r.returncode == 0, r.stderr
    log = mdl("-C", root / "team" / "pushed", "log", "--json")
    assert [e["message"] for e in log] == ["first push"]
    assert [e["message"] for e in mdl("-C", root / "admin" / "mine", "log", "--json")] == ["into my namespace"]
    snap = snapshot_download("team/pushed", cache_dir=str(tmp_path / "cache"), endpoint=endpoint)
    pushed = tree_bytes(snap)
    assert pushed.pop("README.md").startswith(b"---\n")  # the model card push_to_hub writes
    assert pushed == tree_bytes(tmp_path / "saved")

    # The `hf` command line, as installed with huggingface_hub (its entry point run as the
    # installed `hf` script runs it: this environment reaches the package through a path file).
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("step 10\n")
    hf = "import sys; from huggingface_hub.cli.hf import main; sys.argv[0] = 'hf'; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", hf, "upload", "team/cli-upload", str(tmp_path / "run"), "."],
                       capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    files = HfApi(endpoint=endpoint).list_repo_files("team/cli-upload")
    assert files == ["notes.txt"]
    # A name the server cannot hold is refused before anything is made.
    with pytest.raises(HfHubHTTPError, match="not a repository name"):
        HfApi(endpoint=endpoint).create_repo("team/refs")
    assert not (root / "team" / "refs").exists()


def test_hf_file_system_and_hf_urls_read_what_was_pushed(tmp_path, hub):
    endpoint, root = hub
    api = HfApi(endpoint=endpoint)
    api.create_repo("team/tiny")
    model = tiny_model()
    model.save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "eval").mkdir()
    (tmp_path / "saved" / "eval" / "scores.json").write_text('{"loss": 1.5}')
    api.upload_folder(repo_id="team/tiny", folder_path=tmp_path / "saved", commit_message="tiny")
    want = tree_bytes(tmp_path / "saved")

    fs = HfFileSystem(endpoint=endpoint, token=READ_TOKEN, skip_instance_cache=True)
    assert sorted(fs.ls("team/tiny", detail=False)) == [
        "team/tiny/config.json", "team/tiny/eval", "team/tiny/generation_config.json",
        "team/tiny/model.safetensors"]
    assert fs.exists("team/tiny/config.json") and not fs.exists("team/tiny/nothing.json")
    assert fs.isdir("team/tiny/eval") and fs.isfile("team/tiny/eval/scores.json")
    info = fs.info("team/tiny/model.safetensors")
    assert info["type"] == "file" and info["size"] == len(want["model.safetensors"])
    assert sorted(fs.glob("team/tiny/*.json")) == ["team/tiny/config.json", "team/tiny/generation_config.json"]
    assert sorted(fs.find("team/tiny")) == sorted(f"team/tiny/{p}" for p in want)
    with fs.open("team/tiny/model.safetensors", "rb") as f:
        assert f.read() == want["model.safetensors"]
        f.seek(100)
        assert f.read(50) == want["model.safetensors"][100:150]
    assert fs.cat("team/tiny@main/eval/scores.json") == want["eval/scores.json"]
    fs.get("team/tiny/eval", str(tmp_path / "got"), recursive=True)
    assert (tmp_path / "got" / "scores.json").read_bytes() == want["eval/scores.json"]
    with pytest.raises(FileNotFoundError):
        fs.info("team/tiny/nothing.json")

    # hf:// through fsspec, as pandas and datasets open it.
    with fsspec.open("hf://team/tiny/config.json", "rb", endpoint=endpoint, token=READ_TOKEN) as f:
        assert f.read() == want["config.json"]


def test_refs_commits_paths_info_and_parent_commit(tmp_path, hub):
    endpoint, root = hub
    api = HfApi(endpoint=endpoint, token=ADMIN_TOKEN)
    api.create_repo("team/hist")
    first = api.upload_file(path_or_fileobj=b"one", path_in_repo="a.txt", repo_id="team/hist",
                            commit_message="first\n\nthe body")
    api.create_branch("team/hist", branch="exp")
    api.create_tag("team/hist", tag="v1", revision=first.oid)
    second = api.upload_file(path_or_fileobj=b"two", path_in_repo="sub/b.txt", repo_id="team/hist",
                             commit_message="second", parent_commit=first.oid[:40])

    refs = api.list_repo_refs("team/hist")
    assert {(b.name, b.ref, b.target_commit) for b in refs.branches} == {
        ("main", "refs/heads/main", second.oid), ("exp", "refs/heads/exp", first.oid)}
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", first.oid)]

    commits = api.list_repo_commits("team/hist")
    assert [(c.commit_id, c.title, c.message, c.authors) for c in commits] == [
        (second.oid, "second", "", ["admin"]), (first.oid, "first", "the body", ["admin"])]
    assert [c.commit_id for c in api.list_repo_commits("team/hist", revision="exp")] == [first.oid]

    infos = api.get_paths_info("team/hist", ["a.txt", "sub", "missing.txt"])
    assert [(type(i).__name__, i.path) for i in infos] == [("RepoFile", "a.txt"), ("RepoFolder", "sub")]
    assert infos[0].size == 3

    # A parent that is no longer the tip: refused with mdl's reason, nothing committed.
    with pytest.raises(HfHubHTTPError, match="no longer at") as e:
        api.upload_file(path_or_fileobj=b"three", path_in_repo="c.txt", repo_id="team/hist",
                        parent_commit=first.oid[:40])
    assert e.value.response.status_code == 409
    assert api.list_repo_refs("team/hist").branches[0].target_commit in (second.oid, first.oid)
    assert len(api.list_repo_commits("team/hist")) == 2


def test_the_clients_errors_carry_mdls_reasons(tmp_path, hub):
    endpoint, root = hub
    admin = HfApi(endpoint=endpoint, token=ADMIN_TOKEN)
    admin.create_repo("team/errs")
    admin.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/errs")
    writer = HfApi(endpoint=endpoint, token=WRITE_TOKEN)
    reader = HfApi(endpoint=endpoint, token=READ_TOKEN)
    cases = [
        (lambda: reader.upload_file(path_or_fileobj=b"y", path_in_repo="y.txt", repo_id="team/errs"),
         "needs write"),
        (lambda: writer.create_repo("team/other"), "admin"),
        (lambda: writer.create_commit("team/errs", [CommitOperationDelete(path_in_repo="absent.txt")],
                                      commit_message="del"), "absent.txt"),
        (lambda: writer.create_commit("team/errs", [CommitOperationAdd(path_in_repo="a.txt", path_or_fileobj=b"a")],
                                      commit_message="pr", create_pr=True), "pull requests"),
        (lambda: writer.create_repo("team/x", repo_type="dataset"), "model repositories only"),
    ]
    for call, reason in cases:
        with pytest.raises(HfHubHTTPError) as e:
            call()
        assert reason in str(e.value), (reason, str(e.value))
    assert [e["message"] for e in mdl("-C", root / "team" / "errs", "log", "--json")] == ["Upload x.txt with huggingface_hub"]


PUSH_FROM_TRAINER = '''
import sys, torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Trainer,
                          TrainingArguments, default_data_collator)

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.x = torch.randint(0, 96, (n, 24), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2))
# A tokenizer built here (no download): a word-level vocabulary of 96 entries.
vocab = {f"w{i}": i for i in range(95)} | {"[UNK]": 95}
raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
raw.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
tokenizer.push_to_hub("team/tokenizer", commit_message="tokenizer")
args = TrainingArguments(output_dir=sys.argv[1], max_steps=4, save_steps=2, logging_steps=1,
                         per_device_train_batch_size=4, report_to=[], use_cpu=True, seed=0,
                         push_to_hub=True, hub_model_id="team/trained", hub_strategy="every_save")
trainer = Trainer(model=model, args=args, train_dataset=Tokens(32), processing_class=tokenizer,
                  data_collator=default_data_collator)
trainer.train()
trainer.push_to_hub(commit_message="end of training")
'''


def test_a_trainer_with_push_to_hub_and_a_tokenizer_publish_to_mdl(tmp_path, hub):
    endpoint, root = hub
    script = tmp_path / "train.py"
    script.write_text(PUSH_FROM_TRAINER)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                       env=os.environ)
    assert r.returncode == 0, r.stderr[-4000:]
    api = HfApi(endpoint=endpoint)
    assert "tokenizer.json" in api.list_repo_files("team/tokenizer")
    log = mdl("-C", root / "team" / "trained", "log", "--json")
    assert log[0]["message"] == "end of training" and len(log) >= 2, [e["message"] for e in log]
    # What the Hub holds is what the Trainer wrote last, byte for byte.
    snap = snapshot_download("team/trained", cache_dir=str(tmp_path / "cache"), endpoint=endpoint)
    pushed = tree_bytes(snap)
    out = tree_bytes(tmp_path / "out")
    for name in ["model.safetensors", "config.json", "tokenizer.json", "training_args.bin"]:
        assert pushed[name] == out[name], name
