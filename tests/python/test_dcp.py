"""torch.distributed.checkpoint through mdl.dcp: saves from 2 and 4 ranks (gloo, processes on
this machine) become one commit each, load back byte for byte with the same and with a
different number of ranks, and a rank's shards delta against the previous save's."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mdl
from conftest import mdl as run_mdl, tree_bytes

WORKER = Path(__file__).with_name("dcp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(task, repo, world, version, rev, out="-", machines=None):
    """Runs `world` ranks of dcp_worker.py; fails with their output if any fails. With
    `machines` (a folder), each rank has a cache of its own there, as on its own machine."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), task, str(repo), str(r), str(world), str(port),
             str(version), rev, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ if machines is None else dict(os.environ, MDL_CACHE_DIR=str(machines / f"rank-{r}")),
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    failed = [(r, o) for r, (p, o) in enumerate(zip(procs, outputs)) if p.returncode != 0]
    assert not failed, "\n".join(f"rank {r}:\n{o}" for r, o in failed)


def test_sharded_saves_load_back_with_any_number_of_ranks(tmp_path):
    repo = tmp_path / "repo"  # created by the first save's coordinator
    results = []
    for version in (1, 2):
        out = tmp_path / f"v{version}.json"
        ranks("save", repo, 2, version, "main", out)
        results.append(json.loads(out.read_text()))
    first, second = results

    r = mdl.open(repo)
    log = r.log("main")
    assert [e.id for e in log] == [second["id"], first["id"]]
    assert log[0].parents == [first["id"]] and log[0].step == 2
    # The parts' branches are gone; only the save's commit remains.
    assert [b.name for b in r.branches()] == ["main"]
    files = {t.file for t in r.tensors(second["id"])}
    assert files == {"part-00000.safetensors", "part-00001.safetensors"}
    # Each rank's large shard and its shard of the other save are one delta chain (reverse
    # deltas: the older is stored as a delta against the newer), once the re-encodes the part
    # commits deferred are done (a rank exits without waiting for its committer's).
    run_mdl("maintenance", cwd=repo)
    newer = {(t["file"], t["name"]): t["id"] for t in r.show(second["id"])["tensors"]}
    bases = {
        (t["file"], t["name"]): t["base"]
        for t in r.show(first["id"])["tensors"]
        if t["name"].startswith("layer.w")
    }
    assert len(bases) == 2 and bases == {k: newer[k] for k in bases}, bases

    # Same and other world sizes read it back; then four ranks save and two and one read.
    ranks("load", repo, 2, 2, second["id"])
    ranks("load", repo, 4, 2, second["id"])
    ranks("load", repo, 4, 1, first["id"])
    out = tmp_path / "v3.json"
    ranks("save", repo, 4, 3, "four", out)
    third = json.loads(out.read_text())
    assert third["branch"] == "four"
    ranks("load", repo, 2, 3, "four")
    ranks("load", repo, 1, 3, "four")
    assert [b.name for b in r.branches()] == ["four", "main"]

    # The commit is an ordinary one: it checks out, and fsck finds it whole.
    out_dir = tmp_path / "checkout"
    r.checkout(third["id"], out_dir)
    names = sorted(tree_bytes(out_dir))
    assert names[0] == ".metadata"
    assert [n for n in names if n.endswith(".safetensors")] == [f"part-0000{i}.safetensors" for i in range(4)]
    run_mdl("fsck", cwd=repo)


def test_reading_a_commit_that_is_not_a_save_is_refused(tmp_path):
    import pytest
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    import mdl.dcp

    r = mdl.init(tmp_path / "repo")
    r.commit_state({"w": torch.ones(3)}, wait=True)
    # DCP gathers the ranks' failures into its own exception; the reason is ours.
    with pytest.raises(CheckpointException, match="is not a DCP save"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=mdl.dcp.Reader(r, "main"))


def test_a_failed_save_publishes_nothing(tmp_path):
    import pytest
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    import mdl.dcp

    r = mdl.init(tmp_path / "repo")
    writer = mdl.dcp.Writer(r, message="one process")
    dcp.save({"w": torch.arange(6.0), "n": 3}, storage_writer=writer)
    saved = writer.result.id
    before = (r.branches(), r.log())
    # A dtype mdl does not store: the save fails, and the branch and history stay as they were.
    with pytest.raises(CheckpointException, match="cannot store torch dtype"):
        dcp.save({"w": torch.zeros(2, dtype=torch.complex128)}, storage_writer=mdl.dcp.Writer(r))
    assert (r.branches(), r.log()) == before
    loaded = {"w": torch.zeros(6), "n": 0}
    dcp.load(loaded, storage_reader=mdl.dcp.Reader(r, saved))
    assert torch.equal(loaded["w"], torch.arange(6.0)) and loaded["n"] == 3


def test_ranks_on_separate_machines_save_into_object_storage(tmp_path, bucket):
    # Each rank has a replica of its own: their parts are committed and published in
    # parallel, and the coordinator's replica assembles them.
    repo = f"{bucket}/dcp"
    machines = tmp_path / "machines"
    out = tmp_path / "v1.json"
    ranks("save", repo, 4, 1, "main", out, machines=machines)
    saved = json.loads(out.read_text())
    ranks("load", repo, 2, 1, saved["id"], machines=machines)
    # A machine that took no part reads it too, and sees no part branches left.
    r = mdl.open(repo)
    assert r.location == repo
    assert [b.name for b in r.branches()] == ["main"]
    assert r.resolve("main") == saved["id"]
    ranks("load", repo, 1, 1, "main")
