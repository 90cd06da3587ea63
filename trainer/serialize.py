"""Turning a training state (nested dicts/lists/tuples of PyTorch tensors, JAX arrays, NumPy arrays and plain
Python objects) into raw array bytes plus a small pickled skeleton, and back.

Why not torch.save / DCP / Orbax: one byte layout for both frameworks, checksums computed while the bytes stream
to disk, large sequential writes (the emergency flush must run at disk speed), and restore reads straight into
freshly allocated tensors with no intermediate copy. Arrays are stored raw, little-endian, C order; everything
that is not an array (step counters, Python/NumPy RNG states, optimizer hyper-parameters) rides in the skeleton.

Neither torch nor jax is imported here unless the state contains their objects (they are then already loaded).
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np


class ArrayRef:
    """Placeholder left in the skeleton where an array was taken out."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (ArrayRef, (self.index,))


@dataclass
class ArrayItem:
    meta: dict  # kind, dtype, shape (+ impl for JAX PRNG keys)
    source: Any  # the live array (emergency) or its snapshot copy (periodic)
    nbytes: int

    def host_bytes(self) -> memoryview:
        """A flat uint8 view of the array's bytes on the host (copying from an accelerator only if needed)."""
        kind = self.meta["kind"]
        if kind == "torch":
            t = self.source
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous().reshape(-1)
            import torch

            return memoryview(t.view(torch.uint8).numpy())
        arr = self.source
        if kind in ("jax", "jax_key"):
            arr = np.asarray(arr)
        arr = np.ascontiguousarray(arr)
        return memoryview(arr.reshape(-1).view(np.uint8))


@dataclass
class Payload:
    """A state split into its skeleton (pickled bytes) and its arrays."""

    skeleton: bytes
    arrays: list[ArrayItem]
    framework: str
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(a.nbytes for a in self.arrays)


def _is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
PARALLEL_COPY_MIN = 32 << 20


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="respawn-copy")
        return _POOL


def parallel_copy(dst_flat, src_flat, nbytes: int) -> None:
    """dst[:] = src[:] for flat arrays/tensors, split over a few threads: the copy is the whole stall of a
    periodic save, and one core's memcpy (~3 GB/s on a small VM) is slower than the machine's bandwidth.
    Both torch's copy_ and numpy's copyto release the GIL."""
    n = len(src_flat)
    workers = min(8, os.cpu_count() or 1)
    if nbytes < PARALLEL_COPY_MIN or workers < 2 or n < workers:
        _copy(dst_flat, src_flat)
        return
    step = -(-n // workers)
    futures = [_pool().submit(_copy, dst_flat[i:i + step], src_flat[i:i + step]) for i in range(0, n, step)]
    for f in futures:
        f.result()


def _copy(dst, src) -> None:
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
    else:
        dst.copy_(src)


def _torch_copy(buf, t) -> None:
    if t.device.type == "cuda":
        buf.copy_(t, non_blocking=True)
    elif t.is_contiguous():
        parallel_copy(buf.view(-1), t.view(-1), t.numel() * t.element_size())
    else:
        buf.copy_(t)


class SnapshotBuffers:
    """Host buffers reused between periodic snapshots, so that steady-state snapshots are a plain memcpy (fresh
    allocations page-fault at well under 1 GB/s; reused ones copy at memory bandwidth).

    A framework integration may also leave the copy of the parameters and optimizer state to a thread
    (copy_until_step): only an optimizer step changes them, so the copy overlaps the next step's forward and backward
    and the step waits for it only if it is not done by then."""

    def __init__(self) -> None:
        self._bufs: dict[int, Any] = {}
        self._copying: tuple[threading.Event, list, Any] | None = None
        self.blocked_s = 0.0  # how long optimizer steps waited for deferred copies, all saves together

    def _buffer(self, index: int, src):
        """The host buffer of array `index`, allocated anew when `src`'s type, shape or dtype changed (pinned for a
        CUDA tensor)."""
        torch = sys.modules.get("torch") if _is_torch_tensor(src) else None
        buf = self._bufs.get(index)
        if not (isinstance(buf, torch.Tensor if torch else np.ndarray) and buf.shape == src.shape
                and buf.dtype == src.dtype):
            buf = self._bufs[index] = (
                torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.device.type == "cuda") if torch
                else np.empty(src.shape, dtype=src.dtype))
        return buf

    def torch_copy(self, index: int, t):
        buf = self._buffer(index, t)
        _torch_copy(buf, t)
        return buf

    def copy_tree(self, obj: Any, index: Iterator[int], later: list | None = None,
                  stable: set[int] | None = None) -> Any:
        """A framework's state (nested dicts, lists, tuples) as it is now: each torch tensor copied into buffer
        next(index), containers rebuilt (a dict keeps its type; a named tuple is deep-copied whole), anything else
        deep-copied. The same state in the same order reuses the same buffers save after save. With `later` (a
        list), a CPU tensor whose data_ptr() is in `stable` (any, when None) is not copied yet: its (buffer, tensor)
        pair goes to `later`, for copy_until_step."""
        if _is_torch_tensor(obj):
            t = obj.detach()
            if later is not None and t.device.type == "cpu" and (stable is None or t.data_ptr() in stable):
                buf = self._buffer(next(index), t)
                later.append((buf, t))
                return buf
            return self.torch_copy(next(index), t)
        if isinstance(obj, dict):
            return type(obj)((key, self.copy_tree(value, index, later, stable)) for key, value in obj.items())
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            return type(obj)(self.copy_tree(value, index, later, stable) for value in obj)
        return copy.deepcopy(obj)

    def copy_until_step(self, pairs: list) -> None:
        """Copy (buffer, tensor) pairs on a thread; the next optimizer step (any torch optimizer's) and wait() wait
        for the copy to end. For tensors that only an optimizer step changes: parameters and optimizer state."""
        import time

        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.wait()
        done, errors = threading.Event(), []

        def copy_all() -> None:
            try:
                for buf, t in pairs:
                    _torch_copy(buf, t)
            except BaseException as exc:  # noqa: BLE001 - wait() raises it on the save's thread
                errors.append(exc)
            finally:
                done.set()

        def before_step(optimizer, args, kwargs) -> None:
            if not done.is_set():
                t0 = time.perf_counter()
                done.wait()
                self.blocked_s += time.perf_counter() - t0

        self._copying = (done, errors, register_optimizer_step_pre_hook(before_step))
        threading.Thread(target=copy_all, name="respawn-snapshot", daemon=True).start()

    def wait(self) -> None:
        """Every copy of the last snapshot done: the deferred ones (raising what failed) and the asynchronous
        device-to-host ones."""
        copying = self._copying
        if copying is not None:
            done, errors, hook = copying
            done.wait()
            hook.remove()
            self._copying = None
            if errors:
                raise errors[0]
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def numpy_copy(self, index: int, a: np.ndarray):
        buf = self._buffer(index, a)
        if a.flags.c_contiguous and a.ndim > 0:
            parallel_copy(buf.reshape(-1), a.reshape(-1), a.nbytes)
        else:
            np.copyto(buf, a)
        return buf

    def prepare(self, items: list["ArrayItem"]) -> None:
        """Allocate and pre-fault the buffers a snapshot of these arrays will use (run off the training loop)."""
        for index, item in enumerate(items):
            src = item.source
            if _is_torch_tensor(src):
                import torch

                self._buffer(index, src).reshape(-1).view(torch.uint8).zero_()  # every page now, not in the first save
            elif isinstance(src, np.ndarray):
                self._buffer(index, src).reshape(-1).view(np.uint8).fill(0)


def map_tree(x: Any, replace: Callable[[Any], Any]) -> Any:
    """Rebuild the containers of `x` (dicts and OrderedDicts, lists, tuples, namedtuples such as optimizer states)
    with every node for which `replace` returns something other than None replaced by that; anything else is kept
    as it is (and pickled whole)."""
    new = replace(x)
    if new is not None:
        return new
    t = type(x)
    if t is dict or (isinstance(x, dict) and t.__name__ == "OrderedDict"):
        return t((k, map_tree(v, replace)) for k, v in x.items())
    if t is list:
        return [map_tree(v, replace) for v in x]
    if t is tuple:
        return tuple(map_tree(v, replace) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return t(*(map_tree(v, replace) for v in x))
    return x


def flatten(state: Any, *, copy: bool, buffers: SnapshotBuffers | None = None) -> Payload:
    """Split `state` into skeleton + arrays. copy=True takes a snapshot the training loop may then mutate
    (periodic saves); copy=False references the live arrays (emergency saves: the loop is stopped)."""
    arrays: list[ArrayItem] = []
    seen = {"torch": False, "jax": False}
    bufs = buffers if buffers is not None else SnapshotBuffers()
    torch, jax = sys.modules.get("torch"), sys.modules.get("jax")
    cuda_used = False

    def take(x):
        nonlocal cuda_used
        index = len(arrays)
        if torch is not None and isinstance(x, torch.Tensor) and x.layout == torch.strided and not x.is_quantized:
            seen["torch"] = True
            src = x.detach()
            if copy:
                cuda_used = cuda_used or src.device.type == "cuda"
                src = bufs.torch_copy(index, src)
            meta = {"kind": "torch", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape)}
            arrays.append(ArrayItem(meta, src, x.numel() * x.element_size()))
            return ArrayRef(index)
        if jax is not None and isinstance(x, jax.Array):
            seen["jax"] = True
            key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            host = np.asarray(jax.random.key_data(x) if key else x)  # device-to-host; on the CPU backend a view
            kind, extra = ("jax_key", {"impl": str(jax.random.key_impl(x))}) if key else ("jax", {})
        elif isinstance(x, np.ndarray) and x.dtype != object:
            host, kind, extra = x, "numpy", {}
        else:
            return None
        meta = {"kind": kind, "dtype": host.dtype.name, "shape": list(host.shape), **extra}
        arrays.append(ArrayItem(meta, bufs.numpy_copy(index, host) if copy else host, host.nbytes))
        return ArrayRef(index)

    skeleton = map_tree(state, take)
    if cuda_used:
        torch.cuda.synchronize()  # the non_blocking copies must land before the loop mutates the source
    framework = "torch" if seen["torch"] else "jax" if seen["jax"] else "numpy"
    return Payload(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), arrays, framework)


def np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # bfloat16, float8_*: shipped with jax

        return np.dtype(getattr(ml_dtypes, name))


def fill_targets(skeleton: Any, like: Any) -> dict[int, Any]:
    """The arrays of `like` (the live state a restore replaces, e.g. a model's state_dict) that the restored bytes
    can go into in place: {index of the ArrayRef at the same place of the unpickled skeleton: like's array}, for
    writable contiguous host arrays of the saved kind, dtype and shape whose memory no other target shares (tied
    weights are read into fresh memory). Reading into them saves a restore faulting in a second copy of the state."""
    found: dict[int, Any] = {}

    def walk(saved, live):
        if isinstance(saved, ArrayRef):
            found[saved.index] = live
        elif isinstance(saved, dict) and isinstance(live, dict):
            for key, value in saved.items():
                if key in live:
                    walk(value, live[key])
        elif isinstance(saved, (list, tuple)) and isinstance(live, (list, tuple)) and len(saved) == len(live):
            for a, b in zip(saved, live):
                walk(a, b)

    walk(skeleton, like)
    spans = sorted((span, i) for i, x in found.items() if (span := _host_span(x)) is not None)
    keep, end = set(), -1
    for k, ((start, stop), i) in enumerate(spans):
        apart = start >= end and (k + 1 == len(spans) or stop <= spans[k + 1][0][0])
        if apart and stop > start:
            keep.add(i)
        end = max(end, stop)
    return {i: found[i] for i in keep}


def _host_span(x) -> tuple[int, int] | None:
    """[first, last) address of a writable, C-contiguous host array's bytes; None for anything else."""
    if _is_torch_tensor(x):
        torch = sys.modules["torch"]
        if x.device.type != "cpu" or x.layout != torch.strided or x.is_quantized or not x.is_contiguous():
            return None
        return x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
    if isinstance(x, np.ndarray) and x.flags.c_contiguous and x.flags.writeable and x.dtype != object:
        return x.ctypes.data, x.ctypes.data + x.nbytes
    return None


def _fits(meta: dict, x) -> bool:
    if meta["kind"] == "torch":
        return _is_torch_tensor(x) and str(x.dtype).removeprefix("torch.") == meta["dtype"] \
            and list(x.shape) == meta["shape"]
    return meta["kind"] == "numpy" and isinstance(x, np.ndarray) and x.dtype.name == meta["dtype"] \
        and list(x.shape) == meta["shape"]


def allocate(meta: dict, into: Any = None):
    """The array one manifest entry is read into, and a writable flat uint8 view of its bytes: `into` (a target
    fill_targets chose) where it has the entry's kind, dtype and shape, else a new empty array."""
    kind, shape = meta["kind"], tuple(meta["shape"])
    if into is not None and _fits(meta, into):
        if kind == "torch":
            import torch

            return into, into.detach().reshape(-1).view(torch.uint8).numpy()
        return into, into.reshape(-1).view(np.uint8)
    if kind == "torch":
        import torch

        t = torch.empty(shape, dtype=getattr(torch, meta["dtype"]))
        return t, t.reshape(-1).view(torch.uint8).numpy()
    a = np.empty(shape, dtype=np_dtype(meta["dtype"]))
    return a, a.reshape(-1).view(np.uint8)


def finish(meta: dict, arr):
    """Turn a loaded host array into what was saved (a JAX array or key for JAX entries)."""
    if meta["kind"] == "jax":
        import jax.numpy as jnp

        return jnp.asarray(arr)
    if meta["kind"] == "jax_key":
        import jax

        return jax.random.wrap_key_data(arr, impl=meta["impl"])
    return arr


def unflatten(skeleton: bytes, arrays: list) -> Any:
    return fill_in(pickle.loads(skeleton), arrays)


def fill_in(tree: Any, arrays: list) -> Any:
    """An unpickled skeleton with each ArrayRef replaced by its array."""
    return map_tree(tree, lambda x: arrays[x.index] if isinstance(x, ArrayRef) else None)
