"""Repositories, wherever they are: a folder on this machine, a repository behind ``mdl serve``
(``http://HOST:PORT/REPO``) or one in object storage (``s3://BUCKET/PREFIX``) — one class,
:class:`Repository`, over the library's one operations interface."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

from . import _follow, _mdl, _state, _types
from ._mdl import MdlError
from ._types import CommitResult, LogEntry, Ref, TensorInfo

PathLike = Union[str, "os.PathLike[str]"]


class CommitHandle:
    """A commit being stored in the background.

    ``wait()`` blocks until it is durable and returns its :class:`CommitResult`, or raises
    :class:`MdlError` if it failed (as many times as it is called). A failure is also raised
    by the repository's next commit call, so it cannot pass unnoticed.
    """

    def __init__(self, pending: Any):
        self._pending = pending
        self._result: CommitResult | None = None

    def wait(self) -> CommitResult:
        """Waits until the commit is stored; its result (raises MdlError if it failed)."""
        if self._result is None:
            self._result = CommitResult.of(self._pending.wait())
        return self._result

    def done(self) -> bool:
        """Whether the commit has finished (stored or failed); never blocks."""
        return self._pending.done()

    @property
    def id(self) -> str:
        """The commit's id (waits for it)."""
        return self.wait().id

    def __repr__(self) -> str:
        return f"<mdl.CommitHandle {'done' if self.done() else 'running'}>"


@dataclass
class State:
    """Training state read back from a commit: state dicts that ``load_state_dict`` takes."""

    commit: str
    step: int | None
    model: "OrderedDict[str, Any] | None"
    optimizer: dict | None
    extra: Any
    #: With ``since=``: how many tensors were written in place (``model`` and ``optimizer``
    #: are then None: the objects passed hold the state).
    changed: int | None = None


# Repositories with commits possibly in flight, finished at interpreter exit.
_live: "weakref.WeakSet[Repository]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    for repo in list(_live):
        try:
            repo.wait()
        except MdlError as e:  # reported, never silently dropped
            print(f"mdl: a background commit to {repo.root} failed: {e}", file=sys.stderr)


def _options(
    message: str,
    step: int | None,
    metrics: Mapping[str, float] | None,
    branch: str | None,
    lossy: bool | None,
    epsilon: float | None,
    author: str | None,
    follow_links: bool = False,
    as_bytes: bool = False,
) -> dict:
    """A commit's options as the native module takes them."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**64):
        raise _state.invalid(f"step must be a whole number, 0 or more: not {step!r}")
    return {
        "message": message,
        "step": step,
        "metrics": [(str(k), float(v)) for k, v in (metrics or {}).items()],
        "branch": branch,
        "lossy": lossy,
        "epsilon": epsilon,
        "author": author,
        "follow_links": follow_links,
        "as_bytes": as_bytes,
        "source": _training_code(),
    }


def _training_code() -> str:
    """Where the training code is, whose git commit a commit records: the folder of the
    script that was run (``python train.py``), else the working directory."""
    main = sys.argv[0] if sys.argv else ""
    if main and os.path.isfile(main):
        return os.path.dirname(os.path.abspath(main))
    return os.getcwd()


def as_repository(repo: "Repository | PathLike") -> "Repository":
    """``repo`` itself, or the repository at that path (created if missing)."""
    return repo if isinstance(repo, Repository) else open(repo, create=True)


# What a Repository keeps of its last commit by default (bytes; the library's default too).
WARM_BYTES = 2 << 30


class _Finished:
    """A commit already stored (a served repository stores it before answering)."""

    def __init__(self, text: str):
        self._text = text

    def wait(self) -> str:
        return self._text

    def done(self) -> bool:
        return True


def _unsupported(what: str, instead: str) -> MdlError:
    err = _mdl.Unsupported(f"{what} does not run on a served repository: {instead}")
    err.code = "unsupported"
    return err


class Repository:
    """A repository: a folder on this machine, one in object storage, or one behind
    ``mdl serve``.

    Each call opens the repository for itself: a training process holds no lock between
    commits, and other ``mdl`` commands (and ``mdl serve``) run meanwhile. Over HTTP
    (``http://HOST:PORT/REPO``), everything but live state and tensor reads runs on the
    server; those raise :class:`mdl.Unsupported` saying what to do instead.
    """

    def __init__(self, native: Any, ops: Any):
        self._native = native  # None for a served repository
        self._operations = ops
        self._staging = _state.Staging()
        self._lock = threading.Lock()
        _live.add(self)

    @classmethod
    def _reach(
        cls, path: PathLike, token: str | None, wait: float, warm_bytes: int, create: bool
    ) -> "Repository":
        """The repository at ``path`` through the library's operations (which tell where it
        is); a folder or a bucket also through the native repository that stages commits and
        decodes tensors here. ``create`` makes it first (on a server: one that serves a folder
        of repositories, for a token of ``admin`` scope)."""
        text = os.fspath(path)
        token = token if token is not None else os.environ.get("MDL_TOKEN")
        ops = _mdl.Ops(text, token, wait)
        if ops.backend == "served":
            if create:
                _mdl.Ops.create(text, token)
            return cls(None, ops)
        make = _mdl.Repo.init if create else _mdl.Repo.open
        return cls(make(text, wait, warm_bytes), ops)

    def _local(self, what: str) -> Any:
        """The native repository on this machine, for what needs one."""
        if self._native is None:
            raise _unsupported(
                what,
                "commit live state into a local repository and push it, or into the served "
                "folder on the server's machine; read tensors from a checkout or a clone",
            )
        return self._native

    @classmethod
    def init(
        cls, path: PathLike, *, wait: float = 60.0, warm_bytes: int = WARM_BYTES
    ) -> "Repository":
        """Creates a repository in ``path`` (created if missing); ``wait`` and ``warm_bytes``
        as for :meth:`open`."""
        return cls._reach(path, None, wait, warm_bytes, create=True)

    @classmethod
    def open(
        cls, path: PathLike = ".", *, wait: float = 60.0, warm_bytes: int = WARM_BYTES
    ) -> "Repository":
        """Opens the repository at ``path`` or its nearest ancestor holding ``.mdl``.

        ``wait``: how many seconds an operation waits for another process that holds the
        repository (a commit owns it while it stores) before raising MdlError.

        ``warm_bytes``: how much of the last commit's tensors this object keeps in memory, so
        that the next commit takes its residuals (lossy commits) or eager deltas against them
        instead of decoding them from the repository again (0: keep nothing). With the default
        deferred reverse deltas a lossless commit's tensors are not kept: nothing reads them.
        """
        return cls._reach(path, None, wait, warm_bytes, create=False)

    @property
    def backend(self) -> str:
        """Where the repository is: ``"local"``, ``"served"`` or ``"bucket"``."""
        return self._ops.backend

    @property
    def root(self) -> str:
        """The work directory (for a repository in object storage, this machine's replica;
        for a served one, its URL)."""
        if self._native is None:
            return self._ops.location
        return os.fspath(self._native.root)

    @property
    def location(self) -> str | None:
        """The URL of a repository in object storage or on a server; None for one on this
        machine."""
        if self._native is None:
            return self._ops.location
        return self._native.location

    def __repr__(self) -> str:
        return f"<mdl.Repository {self.location or self.root}>"

    # Commits

    def commit(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        message: str = "",
        step: int | None = None,
        metrics: Mapping[str, float] | None = None,
        branch: str | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
        author: str | None = None,
        wait: bool = True,
        follow_links: bool = False,
        as_bytes: bool = False,
    ) -> CommitResult | CommitHandle:
        """Commits a file or a directory (or several), as ``mdl commit`` does.

        With ``wait=False`` it returns a :class:`CommitHandle` while the commit is stored in
        the background: the files are first copied into the repository's ``.mdl/incoming``
        (a reflink where the filesystem has them, otherwise a copy at disk speed), so the
        loop may save the next checkpoint over them, or delete them, as soon as this returns.
        Otherwise they are read where they are, and a file written while the commit reads it
        fails the commit (:class:`MdlError`, nothing recorded). ``lossy``: True for ``--lossy``, False for ``--lossless``, None for the
        repository's setting; ``epsilon``: the lossy quality budget. ``follow_links`` and
        ``as_bytes`` are ``--follow-links`` (commit what a symlink out of a folder points to)
        and ``--as-bytes`` (store a damaged checkpoint as bytes instead of refusing it).
        """
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        options = _options(message, step, metrics, branch, lossy, epsilon, author, follow_links, as_bytes)
        listed = [os.fspath(p) for p in paths]
        if self._native is None:  # the server stores it before it answers
            handle = CommitHandle(_Finished(self._ops.commit(listed, options)))
            return handle.wait() if wait else handle
        with self._lock:
            self.wait()
            # A commit waited for reads the files in place; one that is not copies them first.
            pending = self._native.submit_paths(listed, options, not wait)
        return self._settle(CommitHandle(pending), wait)

    def _settle(self, handle: CommitHandle, wait: bool) -> CommitResult | CommitHandle:
        """The handle, or with ``wait`` its result: a failure is then raised here only, not
        again by the next call."""
        if not wait:
            return handle
        try:
            return handle.wait()
        finally:
            try:
                self._native.finish()
            except MdlError:
                pass  # the failure raised by handle.wait() above

    def commit_state(
        self,
        model: Any = None,
        optimizer: Any = None,
        extra: Any = None,
        *,
        step: int | None = None,
        metrics: Mapping[str, float] | None = None,
        message: str = "",
        branch: str | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
        author: str | None = None,
        wait: bool = False,
        snapshot: str = "auto",
    ) -> CommitHandle | CommitResult:
        """Commits live training state; returns once it is snapshotted.

        ``model``: a ``torch.nn.Module`` or a state dict (tensors or numpy arrays, CPU or
        GPU). ``optimizer``: a ``torch.optim.Optimizer`` (its moments are paired with the
        model's parameters by name, exactly) or its state dict. ``extra``: anything made of
        tensors, arrays, numbers, strings, lists, tuples and dicts (scheduler state, RNG
        states, the data loader's position); no pickles.

        Compression and the durable write run in the background; the returned
        :class:`CommitHandle` tells when they are done. At most one commit is in flight: a
        second call first waits for the one before (and raises its error, if it failed).
        ``wait=True`` blocks until stored and returns the :class:`CommitResult`; CPU tensors
        are then read where they lie (no snapshot of the state is made: nothing may change them
        until the call returns, as with ``torch.save``), each copied once as the commit reaches
        it, so the commit's memory does not grow with the state.

        ``snapshot``: how CUDA tensors are taken. ``"device"`` copies them into a buffer on
        their GPU, queued on the current stream (the loop is held only for that copy), and
        moves them to the host on a side stream while training goes on; ``"host"`` copies
        them to pinned host memory before returning; ``"auto"`` (the default) takes the
        device snapshot when it needs at most half of the GPU's free memory.
        """
        if snapshot not in _state.SNAPSHOTS:
            raise ValueError(f"snapshot must be one of {', '.join(_state.SNAPSHOTS)}, not {snapshot!r}")
        native = self._local("commit_state")
        with self._lock:
            self.wait()  # the staging buffers are reused: the commit before must be done
            files, pairs, ready, on_gpu = self._stage(model, optimizer, extra, step, snapshot, wait)
            pending = native.submit_buffers(
                files,
                pairs,
                _options(message, step, metrics, branch, lossy, epsilon, author),
                ready,
                on_gpu,
            )
        return self._settle(CommitHandle(pending), wait)

    def _stage(self, model: Any, optimizer: Any, extra: Any, step: int | None, snapshot: str, borrow: bool):
        """The commit's files, moment pairs, CUDA events and device runs. With ``borrow`` (the
        caller waits for the commit) a file of CPU tensors is handed over in parts, each tensor
        where it lies, rather than copied into a staging buffer."""
        model_t = _state.Tensors(_state.MODEL_FILE)
        optim_t = _state.Tensors(_state.OPTIMIZER_FILE)
        extra_t = _state.Tensors(_state.EXTRA_FILE)
        doc: dict[str, Any] = {"version": _state.STATE_VERSION, "step": step}
        if model is not None:
            sd = model.state_dict() if hasattr(model, "state_dict") else model
            doc["model"] = _state.encode(dict(sd), model_t, "")
        pairs = []
        if optimizer is not None:
            module = model if hasattr(model, "named_parameters") else None
            doc["optimizer"], names = _state.optimizer_state(optimizer, module, optim_t)
            for label in names.values():
                m, v = f"{label}.exp_avg", f"{label}.exp_avg_sq"
                if label in model_t.items and m in optim_t.items and v in optim_t.items:
                    pairs.append(
                        ((_state.MODEL_FILE, label), (_state.OPTIMIZER_FILE, m), (_state.OPTIMIZER_FILE, v))
                    )
        if extra is not None:
            doc["extra"] = _state.encode(extra, extra_t, "")
        files = [(_state.STATE_FILE, bytearray(json.dumps(doc).encode()))]
        ready, on_gpu = [], []
        for tensors in (model_t, optim_t, extra_t):
            if tensors.items:
                parts = _state.Staging.parts(tensors) if borrow else None
                if parts is not None:
                    files.append((tensors.path, parts))
                    continue
                array, event, where = self._staging.stage(tensors, snapshot)
                files.append((tensors.path, array))
                if event is not None:
                    ready.append(event)
                    on_gpu.append((tensors.path, *where))
        return files, pairs, ready, on_gpu

    def _commit_files(self, files: list, options: dict, ready: list = (), on_gpu: list = ()) -> CommitResult:
        """Commits files given as ``(path, buffer)``, blocking (what :mod:`mdl.dcp`'s ranks
        store); ``ready`` and ``on_gpu`` as :meth:`commit_state` passes them for device
        snapshots."""
        native = self._local("a commit of buffers")
        with self._lock:
            self.wait()
            pending = native.submit_buffers(files, [], options, list(ready), list(on_gpu))
        return self._settle(CommitHandle(pending), True)

    def _assemble(self, parts: list[str], options: dict) -> CommitResult:
        """One commit of the union of the trees of ``parts``, nothing re-encoded (what
        :mod:`mdl.dcp`'s coordinator publishes)."""
        native = self._local("assembling a commit")
        with self._lock:
            self.wait()
            return CommitResult.of(native.assemble(parts, options))

    def wait(self) -> CommitResult | None:
        """Waits for the commit in flight, if any; its result (None when there was none).

        Raises the commit's MdlError if it failed (once: the next commit goes ahead).
        """
        if self._native is None:
            return None
        report = self._native.finish()
        return None if report is None else CommitResult.of(report)

    @property
    def _ops(self) -> Any:
        """The library's operations on this repository, once this object's commit in flight
        (if any) has landed or failed: every operation through them sees the commits
        submitted here before it."""
        self._settled()
        return self._operations

    def _settled(self) -> None:
        """Waits until this object's commit in flight, if any, has landed or failed, without
        taking its outcome (``wait()``, the handle and the next commit still report a failure):
        reads and ref changes through a repository see every commit submitted to it before."""
        if self._native is not None:
            self._native.settle()

    # Reads

    def resolve(self, rev: str = "HEAD") -> str:
        """The full id of the commit ``rev`` names (a branch, tag, id prefix, ``main~2``)."""
        if self._native is None:
            return self.log(rev, 1)[0].id
        self._settled()
        return self._native.resolve(rev)

    def checkout(
        self, rev: str, dir: PathLike, *, path: str | None = None, force: bool = False
    ) -> dict:
        """Writes ``rev``'s files into ``dir`` as ``mdl checkout`` does (``path``: one file or
        folder of the tree); what was written, as a dict."""
        return self._ops.checkout(rev, os.fspath(dir), path, force)

    def tensors(self, rev: str = "HEAD") -> list[TensorInfo]:
        """The tensors of ``rev`` (file, name, dtype, shape, lossy), without decoding any."""
        self._settled()
        return _types.tensor_infos(self._local("tensors").tensors(rev))

    def load(
        self,
        rev: str = "HEAD",
        names: Iterable[str] | None = None,
        *,
        file: str | None = None,
        framework: str = "torch",
        device: Any = None,
    ) -> dict[str, Any]:
        """Tensors of ``rev`` by name; only those asked for are decoded.

        ``file`` limits them to one file of the tree (for a state commit, the model's tensors
        are in ``model.safetensors``). Tensors come as torch tensors (``framework="torch"``)
        or numpy arrays (``"numpy"``), in their stored dtypes and shapes, sharing memory
        with the decoded bytes (no copy). A name found in two files needs ``file``.

        ``device``: a CUDA device to load them onto (torch tensors there). With the GPU
        engine on that device, they are decoded in place: only compressed bytes cross to it.
        """
        commit = self.resolve(rev)
        listed = [t for t in self.tensors(commit) if file is None or t.file == file]
        by_name: dict[str, TensorInfo] = {}
        for t in listed:
            if t.name in by_name:
                raise ValueError(
                    f"tensor {t.name!r} is in {by_name[t.name].file} and {t.file}: pass file="
                )
            by_name[t.name] = t
        wanted = list(by_name) if names is None else list(names)
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise KeyError(f"no tensor {missing[0]!r} in commit {commit[:12]}")
        refs = [(by_name[n].file, n) for n in wanted]
        data = _state.read(self._local("load"), commit, refs, framework, device, lambda: listed)
        return dict(zip(wanted, data))

    def load_state(
        self,
        rev: str = "HEAD",
        model: Any = None,
        optimizer: Any = None,
        *,
        framework: str = "torch",
        device: Any = None,
        since: str | None = None,
    ) -> State:
        """Training state committed by :meth:`commit_state`, as state dicts.

        Given a ``model`` and/or ``optimizer``, their ``load_state_dict`` is called with it.
        ``device``: a CUDA device to load the tensors onto, as :meth:`load` does.

        ``since``: a commit whose state ``model`` and ``optimizer`` hold now. Only the tensors
        that differ between the two are decoded, and each is written into the tensor the
        model or optimizer already has, on its device (no state dicts are built, nothing else
        is copied); learning rates and other numbers of the optimizer's groups are set too.
        Every changed tensor is decoded before the first is written: a failure changes
        nothing.
        """
        commit = self.resolve(rev)
        doc = self._state_document(commit)
        if since is not None:
            return self._patch_state(commit, doc, model, optimizer, self.resolve(since))
        refs = _state.references(doc)
        data = _state.read(
            self._local("load_state"), commit, refs, framework, device, lambda: self.tensors(commit)
        )
        tensors = dict(zip(refs, data))
        model_sd = OrderedDict(_state.decode(doc.get("model", {}), tensors))
        optim_sd = None
        if "optimizer" in doc:
            o = doc["optimizer"]
            optim_sd = {
                "state": {int(k): _state.decode(v, tensors) for k, v in o["state"].items()},
                "param_groups": _state.decode(o["param_groups"], tensors),
            }
            optim_sd.update(_state.decode(o.get("rest", {}), tensors))
        state = State(
            commit=commit,
            step=doc.get("step"),
            model=model_sd,
            optimizer=optim_sd,
            extra=_state.decode(doc.get("extra"), tensors),
        )
        if model is not None:
            model.load_state_dict(state.model)
        if optimizer is not None:
            if optim_sd is None:
                raise ValueError(f"commit {commit[:12]} holds no optimizer state")
            optimizer.load_state_dict(optim_sd)
        return state

    def _patch_state(self, commit: str, doc: dict, model: Any, optimizer: Any, held: str) -> State:
        """``load_state(commit, model, optimizer, since=held)``."""
        if model is None and optimizer is None:
            raise ValueError("since= patches a model or optimizer in place: pass one")
        infos = {(t.file, t.name): t for t in self.tensors(commit)}
        had = {(t.file, t.name): t.id for t in self.tensors(held)}
        pairs, of_optimizer, groups = _follow.targets(doc, model, optimizer)
        # An optimizer without a slot the commit has (one that had not stepped yet) takes
        # the commit's optimizer state whole.
        whole = any(live is None for _, live, _ in of_optimizer)
        if not whole:
            pairs += of_optimizer
        _follow.check(pairs, infos)
        native = self._local("load_state")
        changed = _follow.apply(native, commit, pairs, infos, had)
        if whole:
            self.load_state(commit, optimizer=optimizer)
        else:
            for group, key, value in groups:
                group[key] = value
        extra_refs = _state.references(doc.get("extra"))
        extra_data = _state.read(native, commit, extra_refs, "torch", None, lambda: [])
        extra = _state.decode(doc.get("extra"), dict(zip(extra_refs, extra_data)))
        return State(commit, doc.get("step"), None, None, extra, changed)

    def follow(
        self,
        branch: str = "main",
        model: Any = None,
        optimizer: Any = None,
        *,
        since: str | None = None,
        remote: str | None = None,
        timeout: float | None = None,
        device: Any = None,
    ) -> Iterator[State]:
        """Each new commit of ``branch`` as it comes: a :class:`State`, with ``model`` and
        ``optimizer`` (when given) brought to it in place from the commit before
        (``load_state(new, model, optimizer, since=previous)``).

        ``since``: the commit they hold now (the first commit that comes is loaded whole
        without it). ``remote``: follow that remote's branch instead — the server holds each
        request until the branch moves (a long poll), and its newest commit is fetched here
        first (``fetch(remote, branch, depth=1)``: as deltas against what this repository
        holds, without the steps between, which stay cut here). Ends when nothing comes within
        ``timeout`` seconds (never, for None).
        """
        current = None if since is None else self.resolve(since)
        watched = branch if remote is None else f"refs/remotes/{remote}/{branch}"

        def where() -> str | None:
            try:
                return self.resolve(watched)
            except MdlError:
                return None

        def moved(previous: str | None, seconds: float) -> str | None:
            end = time.monotonic() + seconds
            while True:
                here = where()
                if here is not None and here != previous:
                    return here
                if remote is not None:
                    if self._ops.wait_remote_branch(remote, branch, here, seconds) is None:
                        return None
                    # What the model holds is lent to the fetch: the step that comes as a
                    # delta over it is verified against its bytes, not this repository's chain.
                    # Bytes that are not what they claim fail that check; the fetch is then
                    # made without them, and the load that follows says what is wrong.
                    try:
                        self._fetch(remote, branch, 1, self._lent(previous, model, optimizer))
                    except MdlError:
                        self._fetch(remote, branch, 1, None)
                    continue
                if time.monotonic() >= end:
                    return None
                time.sleep(0.01)

        def load(new: str, previous: str | None) -> State:
            if model is None and optimizer is None:
                return self.load_state(new, device=device)
            if previous is None:
                return self.load_state(new, model, optimizer, device=device)
            return self.load_state(new, model, optimizer, since=previous)

        return _follow.follow(current, moved, load, timeout)

    def fetch(
        self, remote: str = "origin", branch: str | None = None, depth: int | None = None
    ) -> dict:
        """``mdl fetch REMOTE [BRANCH] [--depth N]``: what it moved, as ``mdl fetch --json``
        prints it. ``depth``: only the newest ``depth`` commits of each branch (history behind
        them is cut here, as in a shallow clone)."""
        return self._fetch(remote, branch, depth, None)

    def _fetch(self, remote: str, branch: str | None, depth: int | None, held: list | None) -> dict:
        return self._ops.fetch(remote, branch, depth, held)

    def _lent(self, commit: str | None, model: Any, optimizer: Any) -> list:
        """``(id, bytes)`` of the CPU tensors of ``model`` and ``optimizer`` that hold
        ``commit``'s state (views, no copies); none where that is not known."""
        if commit is None or (model is None and optimizer is None):
            return []
        try:
            doc = self._state_document(commit)
            ids = {(t.file, t.name): t.id for t in self.tensors(commit)}
            of_model, of_optimizer, _ = _follow.targets(doc, model, optimizer)
        except (MdlError, ValueError):
            return []
        return _follow.lent(of_model + of_optimizer, ids)

    def _state_document(self, commit: str) -> dict:
        """The ``mdl-state.json`` of a live-state commit (MdlError for other commits)."""
        return json.loads(self._local("load_state").read_file(commit, _state.STATE_FILE))

    def log(
        self, rev: str | None = None, limit: int | None = None, *, all: bool = False
    ) -> list[LogEntry]:
        """History from ``rev`` (HEAD when None), newest first; with ``all``, every branch's
        and tag's (``mdl log --all``)."""
        return _types.log_entries(self._ops.log(rev, limit, all))

    def show(self, rev: str = "HEAD") -> dict:
        """A commit with its files and tensors (codec, sizes, recorded lossy error)."""
        return self._ops.show(rev)

    def diff(self, a: str, b: str) -> dict:
        """What changed from ``a`` to ``b``: files and tensors, with relative changes."""
        return self._ops.diff(a, b)

    # Refs

    @property
    def head(self) -> str:
        """The branch HEAD names."""
        if self._native is None:
            current = [b.name for b in self.branches() if b.current]
            return current[0] if current else "main"
        self._settled()
        return self._native.head()

    def branches(self) -> list[Ref]:
        """Branches (``current`` marks HEAD's)."""
        return _types.refs(self._ops.branches())

    def tags(self) -> list[Ref]:
        """Tags."""
        return _types.refs(self._ops.tags())

    def branch(self, name: str, rev: str | None = None) -> str:
        """Creates branch ``name`` at ``rev`` (HEAD's commit when None); the commit's id."""
        return self._ops.create_branch(name, rev)

    def tag(self, name: str, rev: str | None = None, message: str | None = None) -> str:
        """Creates tag ``name`` at ``rev`` (annotated with ``message`` when given)."""
        return self._ops.create_tag(name, rev, message)

    def delete_branch(self, name: str, force: bool = False) -> None:
        """Deletes branch ``name``. Unless ``force``, a branch with commits no other branch or
        tag reaches is refused (``mdl branch -d`` against ``-D``); its reflog keeps them."""
        self._ops.delete_branch(name, force)

    def delete_tag(self, name: str) -> None:
        self._ops.delete_tag(name)

    def switch(self, name: str) -> None:
        """Points HEAD at branch ``name`` (where commits without ``branch=`` go)."""
        self._ops.switch(name)

    def reset(self, rev: str) -> dict:
        """Moves the current branch to ``rev`` (``mdl reset``): ``{branch, from, to}``."""
        return self._ops.reset(rev)

    def merge(
        self,
        revs: Sequence[str],
        *,
        strategy: str = "linear",
        weights: Sequence[float] | None = None,
        base: str | None = None,
        density: float = 0.2,
        optimizer: bool = False,
        message: str = "",
        branch: str | None = None,
        author: str | None = None,
    ) -> dict:
        """Merges the commits ``revs`` tensor by tensor (``mdl merge``): ``strategy`` is
        ``linear``, ``task-arithmetic`` or ``ties``; the commit goes on ``branch`` (the current
        one when None) with every merged commit as a parent. Returns what ``mdl merge --json``
        prints: ``{commit, merged, base, computed, identical, from_first, left_out}``."""
        return self._ops.merge(
            list(revs),
            strategy,
            None if weights is None else [float(w) for w in weights],
            base,
            float(density),
            optimizer,
            message,
            branch,
            author,
        )

    def reflog(self, name: str | None = None) -> dict:
        """Where ref ``name`` (HEAD's branch when None) pointed, newest first:
        ``{ref, entries: [{old, new, time_ms, message}]}``."""
        return self._ops.reflog(name)

    # Settings and upkeep

    def config(self) -> dict[str, str]:
        """Every setting's value, by key."""
        return {k: v for k, v, _ in self._ops.config()}

    def set_config(self, key: str, value: str) -> None:
        """Changes one setting (``mdl config KEY VALUE``)."""
        self._ops.set_config(key, str(value))

    def gc(self, *, prune_older_than: str | None = None, dry_run: bool = False) -> dict:
        """Removes what nothing reaches (``mdl gc``); its report."""
        return self._ops.gc(prune_older_than, dry_run)

    def fsck(self) -> dict:
        """Checks every object and ref (``mdl fsck``); its report (``problems`` empty when sound)."""
        return self._ops.fsck()

    def stats(self, lossy: bool = False) -> dict:
        """Repository totals (``mdl stats``); with ``lossy``, also ``"lossy"``: HEAD's series
        by role and its ratio by mdl's, DynaQuant's and ExCP's accountings (``mdl stats
        --lossy``)."""
        return self._ops.stats(lossy)


def open(
    location: PathLike,
    token: str | None = None,
    *,
    create: bool = False,
    wait: float = 60.0,
    warm_bytes: int = WARM_BYTES,
) -> Repository:
    """A repository: a local path (created when ``create`` and missing, or opened when another
    process made it meanwhile; ``wait`` and ``warm_bytes`` as for :meth:`Repository.open`), a
    repository in object storage ``s3://BUCKET/PREFIX`` (endpoint and credentials from the
    ``AWS_*`` environment; each call works on this machine's replica and publishes what it
    changed before returning), or a server URL ``http://HOST:PORT/REPO`` with an optional token (``$MDL_TOKEN`` when None)."""
    text = os.fspath(location)
    if create and not os.path.isdir(os.path.join(text, ".mdl")):
        try:
            return Repository._reach(text, token, wait, warm_bytes, create=True)
        except (_mdl.Conflict, _mdl.Unsupported):
            pass  # made meanwhile (another rank, another writer), or a server that makes none
    return Repository._reach(text, token, wait, warm_bytes, create=False)
