"""Live training state as a tree of files, and back.

A commit of live state is a small tree (docs/PYTHON.md, "What a state commit stores"):

- ``model.safetensors``: the model's state dict, tensors under their own names;
- ``optimizer.safetensors``: the optimizer's per-parameter tensors, named
  ``<parameter>.<key>`` (``fc.weight.exp_avg``) when the model is known, else
  ``<index>.<key>``;
- ``extra.safetensors``: tensors anywhere in ``extra`` (RNG states, ...);
- ``mdl-state.json``: everything else (param groups, scalars, the structure), with each
  tensor replaced by a reference ``{"$tensor": [file, name]}``.

No pickle is written or read: values must be tensors, numpy arrays, numbers, strings,
booleans, None, lists, tuples or dicts.

Tensors are copied once into staging buffers (pinned when CUDA is used, reused from one
commit to the next) laid out as safetensors files; the background commit reads the buffers
in place. CUDA tensors can instead be snapshotted on their GPU and copied to the host while
training goes on (:class:`Staging`, ``snapshot``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np

STATE_FILE = "mdl-state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
EXTRA_FILE = "extra.safetensors"
STATE_VERSION = 1

# safetensors dtype name -> (torch dtype attribute, numpy dtype or None).
DTYPES: dict[str, tuple[str, str | None]] = {
    "F64": ("float64", "<f8"),
    "F32": ("float32", "<f4"),
    "F16": ("float16", "<f2"),
    "BF16": ("bfloat16", None),
    "F8_E4M3": ("float8_e4m3fn", None),
    "F8_E5M2": ("float8_e5m2", None),
    "F8_E8M0": ("float8_e8m0fnu", None),
    "C64": ("complex64", "<c8"),
    "I64": ("int64", "<i8"),
    "I32": ("int32", "<i4"),
    "I16": ("int16", "<i2"),
    "I8": ("int8", "i1"),
    "U64": ("uint64", "<u8"),
    "U32": ("uint32", "<u4"),
    "U16": ("uint16", "<u2"),
    "U8": ("uint8", "u1"),
    "BOOL": ("bool", "?"),
}
_NUMPY_NAMES = {np.dtype(v).str: k for k, (_, v) in DTYPES.items() if v is not None}


def invalid(message: str) -> Exception:
    """mdl's own error for a value it cannot take: :class:`InvalidInput`, code ``bad_input``."""
    from . import _mdl

    err = _mdl.InvalidInput(message)
    err.code = "bad_input"
    return err


def _torch():
    try:
        import torch
    except ImportError:  # numpy-only use
        return None
    return torch


def is_tensor(v: Any) -> bool:
    torch = _torch()
    return isinstance(v, np.ndarray) or (torch is not None and isinstance(v, torch.Tensor))


def dtype_name(v: Any) -> str:
    """The safetensors dtype name of a torch tensor or numpy array."""
    if isinstance(v, np.ndarray):
        name = _NUMPY_NAMES.get(v.dtype.str)
        if name is None:
            raise TypeError(f"mdl cannot store numpy dtype {v.dtype} (little-endian numbers and bool only)")
        return name
    torch = _torch()
    for name, (attr, _) in DTYPES.items():
        if getattr(torch, attr, None) == v.dtype:
            return name
    raise TypeError(f"mdl cannot store torch dtype {v.dtype}")


class Tensors:
    """The tensors of one safetensors file being built: name -> tensor or array."""

    def __init__(self, path: str):
        self.path = path
        self.items: dict[str, Any] = {}

    def add(self, name: str, value: Any) -> dict:
        if name in self.items:
            raise ValueError(f"tensor {name!r} given twice in {self.path}")
        if name == "__metadata__":
            raise invalid(
                "a tensor cannot be named '__metadata__' (safetensors keeps that name for the "
                "file's metadata): rename that key of the state"
            )
        torch = _torch()
        if torch is not None and isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise invalid(
                f"{name}: a {str(value.layout).removeprefix('torch.')} tensor; mdl stores dense "
                "tensors (call .to_dense() on it first)"
            )
        self.items[name] = value
        return {"$tensor": [self.path, name]}


def encode(value: Any, tensors: Tensors, name: str) -> Any:
    """``value`` as JSON, its tensors added to ``tensors`` under names from ``name``."""
    if is_tensor(value):
        return tensors.add(name, value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, tensors, f"{name}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, tensors, f"{name}.{i}") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        plain = all(isinstance(k, str) and not k.startswith("$") for k in value)
        if plain:
            return {k: encode(v, tensors, f"{name}.{k}" if name else k) for k, v in value.items()}
        for k in value:
            if not isinstance(k, (str, int, bool)) and k is not None:
                raise TypeError(f"mdl cannot store a dict key of type {type(k).__name__} (at {name or 'top level'})")
        return {"$dict": [[k, encode(v, tensors, f"{name}.{k}" if name else str(k))] for k, v in value.items()]}
    raise TypeError(
        f"mdl cannot store a value of type {type(value).__name__} (at {name or 'top level'}): "
        "state holds tensors, numpy arrays, numbers, strings, lists, tuples and dicts (no pickles)"
    )


def decode(value: Any, tensors: Mapping[tuple[str, str], Any]) -> Any:
    """The inverse of :func:`encode`, with tensors looked up by ``(file, name)``."""
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (k, v), = value.items()
            if k == "$tensor":
                return tensors[tuple(v)]
            if k == "$tuple":
                return tuple(decode(x, tensors) for x in v)
            if k == "$dict":
                return {key: decode(x, tensors) for key, x in v}
            if k == "$float":
                return float(v)
        return {k: decode(v, tensors) for k, v in value.items()}
    return value


def references(value: Any) -> list[tuple[str, str]]:
    """Every tensor ``(file, name)`` an encoded value refers to."""
    out: list[tuple[str, str]] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            if len(v) == 1 and "$tensor" in v:
                out.append(tuple(v["$tensor"]))
            else:
                for x in v.values():
                    walk(x)

    walk(value)
    return out


def optimizer_state(optimizer: Any, model: Any, tensors: Tensors) -> tuple[dict, dict[int, str]]:
    """An optimizer's state dict encoded, and the model's parameter name of each index."""
    state_dict = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer
    names: dict[int, str] = {}
    if model is not None and hasattr(optimizer, "param_groups") and hasattr(model, "named_parameters"):
        by_id = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        index = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in by_id:
                    names[index] = by_id[id(p)]
                index += 1
    state = state_dict.get("state", {})
    encoded_state = {}
    for index, per_param in state.items():
        label = names.get(index, str(index))
        encoded_state[str(index)] = encode(per_param, tensors, label)
    groups = encode(list(state_dict.get("param_groups", [])), Tensors("param_groups"), "param_groups")
    rest = {k: v for k, v in state_dict.items() if k not in ("state", "param_groups")}
    encoded = {"state": encoded_state, "param_groups": groups}
    if rest:
        encoded["rest"] = encode(rest, tensors, "rest")
    return encoded, names


def on_cuda(v: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(v, torch.Tensor) and v.device.type == "cuda"


def layout(tensors: Tensors) -> tuple[bytes, list[tuple[Any, int, int]]]:
    """A safetensors header for ``tensors`` and where each one's bytes go: CUDA tensors first
    (one run of bytes, which a device snapshot copies to the host in one piece), each group in
    the order given."""
    header: dict[str, Any] = {}
    places = []
    at = 0
    for name, t in sorted(tensors.items.items(), key=lambda kv: not on_cuda(kv[1])):
        shape = list(t.shape)
        nbytes = int(t.nbytes) if isinstance(t, np.ndarray) else t.element_size() * t.numel()
        header[name] = {"dtype": dtype_name(t), "shape": shape, "data_offsets": [at, at + nbytes]}
        places.append((t, at, nbytes))
        at += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, places


SNAPSHOTS = ("auto", "device", "host")


def _flat_bytes(t: Any) -> Any:
    # A lazily conjugated or negated view is materialized first: its bits are not its values.
    src = t.detach().resolve_conj().resolve_neg()
    if not src.is_contiguous():
        src = src.contiguous()
    return src.reshape(-1).view(_torch().uint8)


class Staging:
    """Reused staging buffers, one per file of the tree, grown when a state grows.

    CUDA tensors are snapshotted one of two ways (``snapshot``):

    - ``"device"``: copied into a buffer on their GPU, in order on the current stream (the
      training loop's stall is that device-to-device copy being queued); a side stream then
      copies the buffer to pinned host memory while training goes on, and the commit waits for
      that copy (the CUDA event :meth:`stage` returns) before it reads a byte;
    - ``"host"``: copied to pinned host memory before :meth:`stage` returns.

    ``"auto"`` takes the device snapshot when the file's CUDA tensors are on one GPU and their
    bytes are at most half of what that GPU has free (the driver's free memory plus what
    PyTorch's allocator holds unused), else the host one.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}
        self._device: dict[str, Any] = {}
        self._streams: dict[Any, Any] = {}
        self._in_flight: list[Any] = []

    def _buffer(self, path: str, size: int, pinned: bool):
        torch = _torch()
        held = self._buffers.get(path)
        fits = held is not None and held.shape[0] >= size
        if torch is None:
            if not fits:
                held = np.empty(size, dtype=np.uint8)
                self._buffers[path] = held
            return held[:size], held[:size]
        if fits and pinned and not held.is_pinned():
            fits = False
        if not fits:
            held = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            self._buffers[path] = held
        view = held[:size]
        return view, view.numpy()

    def _device_buffer(self, path: str, size: int, device: Any):
        torch = _torch()
        held = self._device.get(path)
        if held is None or held.device != device or held.shape[0] < size:
            self._device.pop(path, None)
            held = torch.empty(size, dtype=torch.uint8, device=device)
            self._device[path] = held
        return held[:size]

    def _device_room(self, path: str, size: int, device: Any) -> bool:
        """Whether a device snapshot of ``size`` bytes fits ``device`` comfortably."""
        torch = _torch()
        held = self._device.get(path)
        if held is not None and held.device == device and held.shape[0] >= size:
            return True
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return size <= (free + cached) // 2

    @staticmethod
    def parts(tensors: Tensors) -> list[Any] | None:
        """``tensors`` as a safetensors file in parts, for a commit the caller waits for: the
        header, then each tensor's own bytes where they lie (no copy of the state; the commit
        copies each tensor once as it reaches it). None when a tensor is on a GPU: its bytes
        are staged instead (:meth:`stage`)."""
        if any(on_cuda(t) for t in tensors.items.values()):
            return None
        head, places = layout(tensors)
        parts = [np.frombuffer(head, dtype=np.uint8)]
        for t, _, n in places:
            if n == 0:
                continue
            if isinstance(t, np.ndarray):
                parts.append(np.ascontiguousarray(t).reshape(-1).view(np.uint8))
            else:
                parts.append(_flat_bytes(t).numpy())
        return parts

    def stage(self, tensors: Tensors, snapshot: str = "host") -> tuple[Any, Any, Any]:
        """Copies ``tensors`` into this file's buffer as a safetensors file. Returns the buffer
        as a numpy array (what the commit reads) and, for a device snapshot, the CUDA event
        after which its bytes are all there and where the snapshot lies on the GPU:
        ``(start, length, device index, address)``, the run of the file it holds (else None
        twice). The commit's GPU engine reads that run there instead of copying it back."""
        if snapshot not in SNAPSHOTS:
            raise ValueError(f"snapshot must be one of {', '.join(SNAPSHOTS)}, not {snapshot!r}")
        torch = _torch()
        # A copy still in flight from a commit that failed before waiting for it must not
        # land in a buffer being refilled.
        for event in self._in_flight:
            event.synchronize()
        self._in_flight.clear()
        head, places = layout(tensors)
        size = len(head) + sum(n for _, _, n in places)
        gpu = [(t, at, n) for t, at, n in places if on_cuda(t)]
        gpu_bytes = sum(n for _, _, n in gpu)
        devices = {t.device for t, _, _ in gpu}
        device = next(iter(devices)) if len(devices) == 1 else None
        on_device = (
            gpu_bytes > 0
            and device is not None
            and snapshot != "host"
            and (snapshot == "device" or self._device_room(tensors.path, gpu_bytes, device))
        )
        buf, array = self._buffer(tensors.path, size, pinned=bool(gpu))
        array[: len(head)] = np.frombuffer(head, dtype=np.uint8)
        base = len(head)
        ready = on_gpu = None
        if on_device:
            # The CUDA tensors come first in the layout: one run of gpu_bytes.
            dev = self._device_buffer(tensors.path, gpu_bytes, device)
            for t, at, n in gpu:
                if n:
                    dev[at : at + n].copy_(_flat_bytes(t))
            side = self._streams.get(device)
            if side is None:
                side = self._streams[device] = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                buf[base : base + gpu_bytes].copy_(dev, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(side)
            self._in_flight.append(ready)
            on_gpu = (base, gpu_bytes, device.index, dev.data_ptr())
        for t, at, n in places:
            if n == 0 or (on_device and on_cuda(t)):
                continue
            lo, hi = base + at, base + at + n
            if isinstance(t, np.ndarray):
                array[lo:hi] = np.ascontiguousarray(t).reshape(-1).view(np.uint8)
            else:
                buf[lo:hi].copy_(_flat_bytes(t), non_blocking=on_cuda(t))
        if gpu and not on_device:
            torch.cuda.synchronize()
        return array, ready, on_gpu


def read(native: Any, commit: str, refs: list, framework: str, device: Any, infos: Any) -> list:
    """The tensors ``refs`` (``(file, name)``) of ``commit``, decoded: as ``framework``'s, or
    with ``device`` (a CUDA device) as torch tensors there. A GPU engine on that device decodes
    into them in place (only coded bytes cross to it); otherwise the decoded bytes are copied
    over. ``infos()``: the commit's :class:`TensorInfo` list (called only for a device)."""
    if not refs:
        return []
    torch = _torch()
    target = None if device is None or torch is None else torch.device(device)
    if target is None or target.type == "cpu":
        data = native.read_tensors(commit, refs)
        return [to_tensor(d, dtype, shape, framework) for dtype, shape, d in data]
    if target.type != "cuda":
        raise ValueError(f"device must be a CUDA device or the CPU, not {device!r}")
    if framework != "torch":
        raise ValueError("a device needs framework='torch'")
    if target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    by_ref = {(t.file, t.name): t for t in infos()}
    out = [
        torch.empty(by_ref[r].shape, dtype=getattr(torch, DTYPES[by_ref[r].dtype][0]), device=target)
        for r in refs
    ]
    # Fresh memory may still be read by work queued on the current stream; the decode writes
    # it from streams of its own.
    torch.cuda.current_stream(target).synchronize()
    places = [(target.index, t.data_ptr() if t.numel() else 0) for t in out]
    # Decoded in parallel; the bytes come back only for tensors the engine did not put there.
    for t, r, d in zip(out, refs, native.read_tensors_to_gpu(commit, refs, places)):
        if d is not None and t.numel():
            info = by_ref[r]
            t.copy_(to_tensor(d, info.dtype, info.shape, "torch"))
    return out


def to_tensor(data: bytearray, dtype: str, shape: list[int], framework: str) -> Any:
    """Decoded bytes as a tensor (torch) or array (numpy), without copying where possible."""
    attr, np_dtype = DTYPES[dtype]
    if framework == "numpy":
        if np_dtype is None:
            raise TypeError(f"numpy has no dtype for {dtype}; load with framework='torch'")
        return np.frombuffer(data, dtype=np_dtype).reshape(shape)
    torch = _torch()
    if torch is None:
        raise ImportError("framework='torch' needs torch installed; use framework='numpy'")
    tdtype = getattr(torch, attr)
    if len(data) == 0:
        return torch.empty(shape, dtype=tdtype)
    return torch.frombuffer(data, dtype=tdtype).reshape(shape)
