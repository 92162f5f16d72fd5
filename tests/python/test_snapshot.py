"""How live state is snapshotted: a commit whose staged bytes are still arriving waits for
them (the CUDA event of a device snapshot), fails cleanly when they never arrive, and on a
GPU the device snapshot stores the state as it was when ``commit_state`` returned."""

import numpy as np
import pytest
import torch

import mdl
from mdl import _state
from conftest import mdl as run_mdl


def staged_file(values):
    """``values`` (name -> float32 tensor) laid out as a safetensors file, as the stager does,
    with the tensor bytes left zero: (buffer, the bytes that belong after the header)."""
    tensors = _state.Tensors(_state.MODEL_FILE)
    for name, t in values.items():
        tensors.add(name, t)
    head, places = _state.layout(tensors)
    body = b"".join(t.numpy().tobytes() for t, _, _ in places)
    buf = np.zeros(len(head) + len(body), dtype=np.uint8)
    buf[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    return buf, len(head), body


class Arrival:
    """A stand-in for a copy in flight: its ``synchronize`` writes the bytes (or fails)."""

    def __init__(self, buf, at, body, fail=False):
        self.buf, self.at, self.body, self.fail = buf, at, body, fail
        self.calls = 0

    def synchronize(self):
        self.calls += 1
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.buf[self.at : self.at + len(self.body)] = np.frombuffer(self.body, dtype=np.uint8)


OPTIONS = dict(message="m", branch=None, step=1, metrics=[], lossy=None, epsilon=None, author=None)


def test_a_commit_reads_staged_bytes_only_once_they_have_arrived(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    values = {"w": torch.randn(300, 7), "b": torch.randn(11)}
    buf, at, body = staged_file(values)
    arrival = Arrival(buf, at, body)
    pending = repo._native.submit_buffers([(_state.MODEL_FILE, buf)], [], OPTIONS, [arrival])
    result = mdl.CommitHandle(pending).wait()
    assert arrival.calls == 1
    got = repo.load(result.id, file=_state.MODEL_FILE)
    for name, t in values.items():
        assert torch.equal(got[name], t), name


def test_bytes_that_never_arrive_fail_the_commit_and_change_nothing(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    first = repo.commit_state({"w": torch.ones(4)}, step=0).wait()
    buf, at, body = staged_file({"w": torch.randn(64)})
    arrival = Arrival(buf, at, body, fail=True)
    pending = repo._native.submit_buffers([(_state.MODEL_FILE, buf)], [], OPTIONS, [arrival])
    with pytest.raises(mdl.MdlError, match="the copy from the GPU did not complete: .*illegal memory"):
        mdl.CommitHandle(pending).wait()
    assert [e.id for e in repo.log()] == [first.id]
    assert run_mdl("fsck", "-C", repo.root).returncode == 0
    # The next call reports it once more (committing nothing), as for any background failure;
    # the one after goes ahead.
    with pytest.raises(mdl.MdlError, match="did not complete"):
        repo.commit_state({"w": torch.zeros(4)}, step=1)
    assert repo.commit_state({"w": torch.zeros(4)}, step=2).wait().id == repo.resolve("HEAD")


def test_an_unknown_snapshot_is_refused_before_anything_starts(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    with pytest.raises(ValueError, match="snapshot must be one of auto, device, host, not 'gpu'"):
        repo.commit_state({"w": torch.zeros(2)}, snapshot="gpu")
    assert repo.log() == [] and repo.wait() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh)")
@pytest.mark.parametrize("snapshot", ["device", "host", "auto"])
def test_cuda_state_is_stored_as_it_was_when_commit_state_returned(tmp_path, snapshot):
    repo = mdl.init(tmp_path / "repo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 64)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(32, 512, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    moments = {i: {k: v.cpu().clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    handle = repo.commit_state(model, opt, step=2, snapshot=snapshot)
    # Training goes on at once, on the same stream, changing every tensor in place.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        for s in opt.state.values():
            s["exp_avg"].mul_(3.0)
    result = handle.wait()
    state = repo.load_state(result.id)
    for k, v in before.items():
        assert torch.equal(state.model[k], v), k
    for i, per in moments.items():
        for k, v in per.items():
            assert torch.equal(state.optimizer["state"][i][k], v), (i, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh)")
def test_the_gpu_engine_stores_a_device_snapshot_as_the_cpu_engine_does(tmp_path):
    """The GPU engine computes on the device snapshot where it lies; the records are the CPU
    engine's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    repos = {}
    for engine in ("cpu", "gpu"):
        repos[engine] = mdl.init(tmp_path / engine)
        run_mdl("config", "engine", engine, cwd=tmp_path / engine)
    shown = {engine: [] for engine in repos}
    for step in range(1, 4):
        model(torch.randn(32, 1024, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
        for engine, repo in repos.items():
            result = repo.commit_state(model, opt, step=step, snapshot="device", wait=True)
            tensors = repo.show(result.id)["tensors"]
            shown[engine].append([(t["name"], t["id"], t["codec"], t["stored_bytes"]) for t in tensors])
    assert shown["gpu"] == shown["cpu"]
    state = repos["gpu"].load_state()
    for k, v in model.state_dict().items():
        assert torch.equal(state.model[k], v.cpu()), k


def test_a_load_onto_a_gpu_the_engine_is_not_on_hands_the_bytes_back(tmp_path):
    """The CPU engine leaves a device load to the caller: every tensor's bytes come back
    (decoded tensor-parallel), the same as a plain read, and no address is touched."""
    repo = mdl.init(tmp_path / "repo")
    # The CPU engine whatever `auto` would pick on this machine: the addresses are not memory.
    run_mdl("config", "engine", "cpu", cwd=tmp_path / "repo")
    state = {f"w{i}": torch.randn(100 + i) for i in range(6)}
    commit = repo.commit_state(state, wait=True).id
    refs = [(t.file, t.name) for t in repo.tensors(commit)]
    assert len(refs) == 6
    plain = [bytes(d) for _, _, d in repo._native.read_tensors(commit, refs)]
    back = repo._native.read_tensors_to_gpu(commit, refs, [(0, 0)] * len(refs))
    assert [bytes(b) for b in back] == plain
    with pytest.raises(mdl.MdlError, match="one device address a tensor"):
        repo._native.read_tensors_to_gpu(commit, refs, [])


def test_loading_onto_a_device_that_is_not_cuda_is_refused(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    repo.commit_state({"w": torch.arange(6, dtype=torch.float32)}, wait=True)
    assert torch.equal(repo.load_state(device="cpu").model["w"], torch.arange(6, dtype=torch.float32))
    with pytest.raises(ValueError, match="device must be a CUDA device or the CPU, not 'meta'"):
        repo.load_state(device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh)")
@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_state_loads_onto_the_gpu_as_committed(tmp_path, engine):
    """With the GPU engine the tensors are decoded in place on the device; with the CPU engine
    they are copied there. Either way they hold the committed bytes."""
    repo = mdl.init(tmp_path / "repo")
    run_mdl("config", "engine", engine, cwd=tmp_path / "repo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1024, device="cuda")).sum().backward()
    opt.step()
    first = repo.commit_state(model, opt, step=1, wait=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.001)
    repo.commit_state(model, opt, step=2, wait=True)
    for rev, latest in (("HEAD", True), (first.id, False)):
        state = repo.load_state(rev, device="cuda")
        host = repo.load_state(rev)
        for k, v in host.model.items():
            assert state.model[k].is_cuda, k
            assert torch.equal(state.model[k].cpu(), v), (rev, k)
        if latest:
            for k, v in model.state_dict().items():
                assert torch.equal(state.model[k], v), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh)")
@pytest.mark.parametrize("engine", ["gpu", "cpu"])
def test_a_dcp_save_of_cuda_state_is_snapshotted_on_the_gpu_and_loads_back(tmp_path, engine):
    # One process, no process group: torch.distributed.checkpoint saves the CUDA tensors
    # through mdl.dcp.Writer, which stages them as commit_state does (a device snapshot where
    # there is room, read there by the GPU engine).
    import torch.distributed.checkpoint as dcp

    import mdl.dcp

    g = torch.Generator().manual_seed(3)
    state = {
        "w": torch.randn(1024, 1024, generator=g).cuda(),
        "b": torch.randn(4096, generator=g).to(torch.bfloat16).cuda(),
    }
    repo = mdl.init(tmp_path / "repo")
    run_mdl("config", "engine", engine, cwd=tmp_path / "repo")
    dcp.save(state, storage_writer=mdl.dcp.Writer(repo, message="cuda save"))
    back = {k: torch.zeros_like(v, device="cpu") for k, v in state.items()}
    dcp.load(back, storage_reader=mdl.dcp.Reader(repo))
    for k, v in state.items():
        assert torch.equal(back[k], v.cpu()), k
