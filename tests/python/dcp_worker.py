"""One rank of a torch.distributed.checkpoint save or load through mdl.dcp (test_dcp.py starts
`world` of these on this machine, gloo over loopback).

    python dcp_worker.py save|load REPO RANK WORLD PORT VERSION REV_OR_BRANCH OUT

The state of version V is the same on every world size: sharded tensors (DTensors over all
ranks, one split unevenly), a replicated tensor and a plain integer. `save` commits version V
onto branch REV_OR_BRANCH (the coordinator writes the commit's result to OUT); `load` reads
commit REV_OR_BRANCH into zeroed state and checks that it equals version V byte for byte.
With WORLD 1 no process group is started: plain tensors, whole.
"""

import dataclasses
import json
import os
import sys
import zlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import mdl.dcp

# name -> (shape, dtype, dimension it is sharded on, or None: replicated)
TENSORS = {
    "layer.w": ((256, 128), torch.float32, 0),
    "layer.e": ((16, 24), torch.bfloat16, 1),
    "uneven": ((10, 3), torch.float32, 0),
    "bias": ((32,), torch.float32, None),
}


def full(name: str, version: int) -> torch.Tensor:
    """Tensor `name` of version `version`: version 1 random, each later one a small step on."""
    shape, dtype, _ = TENSORS[name]
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    t = torch.randn(shape, generator=g)
    for v in range(2, version + 1):
        t = t + 1e-5 * torch.randn(shape, generator=torch.Generator().manual_seed(v))
    return t.to(dtype)


def state(version: int, world: int, zeros: bool) -> dict:
    def value(name):
        t = full(name, version)
        return torch.zeros_like(t) if zeros else t

    if world == 1:
        out = {name: value(name) for name in TENSORS}
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        out = {}
        for name, (_, _, dim) in TENSORS.items():
            placement = Replicate() if dim is None else Shard(dim)
            out[name] = distribute_tensor(value(name), mesh, [placement])
    out["steps"] = 0 if zeros else 1000 + version
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def main() -> None:
    task, repo, rank, world, port, version, rev, out = sys.argv[1:]
    rank, world, version = int(rank), int(world), int(version)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    if task == "save":
        writer = mdl.dcp.Writer(repo, branch=rev, step=version, message=f"v{version} from {world} ranks")
        dcp.save(state(version, world, zeros=False), storage_writer=writer)
        if writer.result is not None:
            with open(out, "w") as f:
                json.dump(dataclasses.asdict(writer.result), f)
    else:
        loaded = state(version, world, zeros=True)
        dcp.load(loaded, storage_reader=mdl.dcp.Reader(repo, rev))
        assert loaded["steps"] == 1000 + version, loaded["steps"]
        for name in TENSORS:
            got = loaded[name]
            got = got.full_tensor() if world > 1 else got
            assert same_bytes(got, full(name, version)), f"{name} differs after the load"
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    # Every check above has passed and nothing of mdl's is in flight (the writer commits and
    # assembles before dcp.save returns). Exit without the interpreter's teardown: gloo's
    # threads sometimes abort it ("terminate called without an active exception", a torch
    # issue: pytorch/pytorch#190489), which would fail a rank whose work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
