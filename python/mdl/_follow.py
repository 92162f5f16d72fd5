"""A newer commit's training state applied to a model and optimizer where they are, and a
branch followed as it moves (issue 72: weight sync for RL rollouts and fine-tuners).

Applying ``B`` to objects that hold ``A`` (``load_state(B, model, optimizer, since=A)``) writes
only the tensors whose content id differs between the two commits, each into the tensor the
model or optimizer already has (CPU or CUDA), without building B's state dicts. Every changed
tensor is decoded before the first one is written, so a failure (a damaged record, a shape that
does not match) changes nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from . import _state

#: Most bytes of changed tensors decoded in one call to the library.
GROUP_BYTES = 256 << 20


def _pairs(encoded: Any, live: Any, path: str, out: list) -> None:
    """Walks an encoded state beside the live object it describes: each tensor reference with
    the live tensor at the same place (``None`` where there is none) into ``out``."""
    if isinstance(encoded, dict) and len(encoded) == 1:
        ((k, v),) = encoded.items()
        if k == "$tensor":
            out.append((tuple(v), live, path))
            return
        if k in ("$tuple", "$dict"):
            items = v if k == "$tuple" else [x for _, x in v]
            keys = range(len(v)) if k == "$tuple" else [key for key, _ in v]
            for key, x in zip(keys, items):
                _pairs(x, _at(live, key), f"{path}.{key}", out)
            return
    if isinstance(encoded, dict):
        for key, x in encoded.items():
            _pairs(x, _at(live, key), f"{path}.{key}", out)
    elif isinstance(encoded, list):
        for i, x in enumerate(encoded):
            _pairs(x, _at(live, i), f"{path}.{i}", out)


def _at(live: Any, key: Any) -> Any:
    """``live[key]`` where there is one (an optimizer's state is keyed by int, its encoding by
    str), else None."""
    if isinstance(live, dict):
        if key in live:
            return live[key]
        if isinstance(key, str) and key.isdigit():
            return live.get(int(key))
        return None
    if isinstance(live, (list, tuple)) and isinstance(key, int) and key < len(live):
        return live[key]
    return None


def targets(doc: dict, model: Any, optimizer: Any) -> tuple[list, list, list]:
    """The live tensor of each tensor reference of ``doc`` that ``model`` holds, those the
    ``optimizer`` holds, and the optimizer's group numbers (learning rates) with their
    groups."""
    of_model: list = []
    of_optimizer: list = []
    groups: list = []
    if model is not None:
        if "model" not in doc:
            raise ValueError("the commit holds no model state")
        _pairs(doc["model"], model.state_dict(), "model", of_model)
    if optimizer is not None:
        if "optimizer" not in doc:
            raise ValueError("the commit holds no optimizer state")
        enc = doc["optimizer"]
        # state_dict() hands out the optimizer's own tensors; its groups are copies, whose
        # numbers are set on the live groups instead.
        _pairs(enc["state"], optimizer.state_dict()["state"], "optimizer.state", of_optimizer)
        new_groups = _state.decode(enc["param_groups"], {})
        for g, new in zip(optimizer.param_groups, new_groups):
            groups.extend((g, k, v) for k, v in new.items() if k != "params")
    return of_model, of_optimizer, groups


def check(pairs: list, infos: dict) -> None:
    """Refuses before anything is written: a tensor the model or optimizer lacks, or holds
    in another dtype or shape."""
    torch = _state._torch()
    for ref, live, path in pairs:
        info = infos[ref]
        if live is None or torch is None or not isinstance(live, torch.Tensor):
            raise ValueError(
                f"since=: {path} is not there to patch (load the commit without since= first)"
            )
        want = getattr(torch, _state.DTYPES[info.dtype][0])
        if live.dtype != want or list(live.shape) != list(info.shape):
            raise ValueError(
                f"since=: {path} is {str(live.dtype).removeprefix('torch.')} {list(live.shape)}, "
                f"the commit's is {info.dtype} {list(info.shape)}"
            )


def apply(native: Any, commit: str, pairs: list, infos: dict, held: dict) -> int:
    """Writes the tensors of ``pairs`` whose id in ``commit`` (``infos``) differs from the one
    ``held`` (by reference) into their live tensors; how many. All or none: a failure leaves
    every tensor as it was. A CPU tensor that ``commit`` stores as a masked delta over the
    version it holds is patched where it lies (only its changed elements written, checked
    against the commit's id as it is, undone if anything fails); another stored as a delta over
    that version decodes against its bytes (one level, not its chain); the rest decode whole.
    Those decoded are all decoded before the patches, and copied in after them."""
    changed = [(ref, live) for ref, live, _ in pairs if infos[ref].id != held.get(ref)]
    # Patched in place: CPU tensors that share no bytes with another, held at a known version
    # that the commit stores a masked delta over.
    on_cpu = [(ref, live) for ref, live in changed if live.device.type == "cpu"]
    lent = [(ref, live, _base(held.get(ref), live)) for ref, live in on_cpu]
    lent = _alone([(ref, live, b) for ref, live, b in lent if b is not None])
    can = native.patchable(commit, [ref for ref, _, _ in lent], [b[0] for _, _, b in lent])
    patch = [p for p, ok in zip(lent, can) if ok]
    patched = {id(live) for _, live, _ in patch}
    decoded = _decode(native, commit, [p for p in changed if id(p[1]) not in patched], infos, held)
    if patch and not native.patch_tensors(
        commit, [ref for ref, _, _ in patch], [b for _, _, b in patch]
    ):
        # A record re-encoded by maintenance since: nothing was written; decoded instead.
        decoded += _decode(native, commit, [(ref, live) for ref, live, _ in patch], infos, held)
    torch = _state._torch()
    with torch.no_grad():
        for live, new in decoded:
            live.copy_(new)
    return len(changed)


def _decode(native: Any, commit: str, wanted: list, infos: dict, held: dict) -> list:
    """``(live, decoded)`` of each ``(ref, live)`` of ``wanted``, decoded from ``commit``: in
    groups of at most :data:`GROUP_BYTES` a device, a CPU tensor stored as a delta over the
    version it holds decoded against its bytes."""
    decoded: list = []
    group: list = []
    size = 0

    def flush() -> None:
        nonlocal group, size
        if not group:
            return
        device = group[0][1].device
        refs = [r for r, _ in group]
        if device.type == "cpu":
            bases = [_base(held.get(r), live) for r, live in group]
            data = native.read_tensors(commit, refs, bases)
            data = [_state.to_tensor(d, dtype, shape, "torch") for dtype, shape, d in data]
        else:
            data = _state.read(native, commit, refs, "torch", device, lambda: list(infos.values()))
        decoded.extend(zip((t for _, t in group), data))
        group, size = [], 0

    for ref, live in sorted(wanted, key=lambda p: str(p[1].device)):
        if group and (group[0][1].device != live.device or size >= GROUP_BYTES):
            flush()
        group.append((ref, live))
        size += live.numel() * live.element_size()
    flush()
    return decoded


def _alone(lent: list) -> list:
    """Those of ``lent`` (``(ref, live, base)``) whose live tensor shares no byte with
    another's (tied weights share one storage: a patch applied through each would apply its
    changes twice)."""
    spans = sorted(
        (live.data_ptr(), live.data_ptr() + live.numel() * live.element_size(), k)
        for k, (_, live, _) in enumerate(lent)
    )
    shared: set = set()
    end, owner = 0, None
    for start, stop, k in spans:
        if start < end:
            shared.update((k, owner))
        if stop > end:
            end, owner = stop, k
    return [p for k, p in enumerate(lent) if k not in shared]


def lent(pairs: list, ids: dict) -> list:
    """``(id, bytes)`` of each live CPU tensor of ``pairs`` whose version ``ids`` names (by
    reference): what it holds, lent to a read."""
    torch = _state._torch()
    out: list = []
    if torch is None:
        return out
    for ref, live, _ in pairs:
        if isinstance(live, torch.Tensor) and live.device.type == "cpu":
            base = _base(ids.get(ref), live)
            if base is not None:
                out.append(base)
    return out


def _base(held_id: str | None, live: Any) -> tuple[str, Any] | None:
    """What a live CPU tensor holds, for a delta over it to decode against: its id and its
    bytes (a view, no copy); None where it holds nothing known or is not contiguous."""
    if not held_id or not live.is_contiguous() or live.numel() == 0:
        return None
    torch = _state._torch()
    return held_id, live.detach().reshape(-1).view(torch.uint8).numpy()


def follow(
    current: str | None,
    moved: Callable[[str | None, float], str | None],
    load: Callable[[str, str | None], Any],
    timeout: float | None,
) -> Iterator[Any]:
    """Yields ``load(new, previous)`` each time ``moved(previous, seconds)`` reports a new
    commit; ends when none comes within ``timeout`` seconds (never, for None)."""
    while True:
        start = time.monotonic()
        new = None
        while new is None:
            left = None if timeout is None else timeout - (time.monotonic() - start)
            if left is not None and left <= 0:
                return
            new = moved(current, 30.0 if left is None else min(left, 30.0))
        yield load(new, current)
        current = new
