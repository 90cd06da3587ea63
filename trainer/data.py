"""The data position of a torch DataLoader, restored exactly (shuffle included) by TrainingLoop.

    from respawn.ckpt.data import ResumableSampler, forever

    loader = DataLoader(dataset, batch_size=32, sampler=ResumableSampler(dataset, seed=0), num_workers=2)
    with TrainingLoop(total_steps, every=500, model=model, optimizer=opt, data=loader) as loop:
        batches = forever(loader)              # pass after pass; each pass is the sampler's next epoch
        for step in loop:
            x, y = next(batches)

- ResumableSampler: the DistributedSampler permutation (seed + epoch, this rank's share), which counts its own
  epochs and restores its position (state_dict()/load_state_dict()).
- LoaderPosition: the loop's view of a DataLoader among its objects. With ResumableSampler, the position saved is
  the batches the DataLoader has yielded (the steps consumed them), not the sampler's own count, which worker
  prefetch runs ahead of. A torchdata StatefulDataLoader keeps its own state; both restore the first iterator made
  after the restore without drawing from torch's global RNG (the restored RNG stays what the saved run had).
  Any other DataLoader, or an IterableDataset without state, is named in one WARNING at start (check_data) and
  saved as None.
- forever(loader): the loader's batches, one pass after another.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, Sized

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from . import _log

_TORCH_RANDOM_SAMPLERS = (torch.utils.data.RandomSampler, torch.utils.data.SubsetRandomSampler,
                          torch.utils.data.WeightedRandomSampler)


class ResumableSampler(Sampler[int]):
    """Indices of `data_source` (a sized dataset, or its length) for rank `rank` of `world_size`, epoch after
    epoch: each `iter()` is the next epoch, shuffled with `seed + epoch` exactly as
    `torch.utils.data.DistributedSampler` with `set_epoch(epoch)` shuffles (the same indices, padded by repeating
    or, with drop_last, trimmed, so that every rank gets `len(self)`).

    `state_dict()` -> {"epoch", "position" (samples of the epoch consumed, over all ranks), "seed", "shuffle",
    "length", "world_size"}; `load_state_dict(state)` makes the next `iter()` continue there (the position is
    per rank times world_size, so that a restore at another world size resumes near it). On its own the sampler
    counts the indices it has handed out; in a DataLoader with workers those run ahead of the batches trained on:
    pass the DataLoader to TrainingLoop (or save LoaderPosition(loader)), which counts the batches it yielded.

    Every rank restores rank 0's state: the state holds no rank. `set_epoch(e)` is there for DistributedSampler
    loops; it starts epoch `e` from its first index unless `e` is the epoch a restored position continues.
    """

    def __init__(self, data_source: Sized | int, *, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = False) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"ResumableSampler needs 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        self.length = data_source if isinstance(data_source, int) else len(data_source)
        self.shuffle, self.seed, self.rank, self.world_size, self.drop_last = (
            shuffle, seed, rank, world_size, drop_last)
        if drop_last and self.length % world_size:
            self.num_samples = math.ceil((self.length - world_size) / world_size)
        else:
            self.num_samples = math.ceil(self.length / world_size)
        self._next = (0, 0)  # (epoch, per-rank start) of the pass the next iter() runs
        self._pass: list[int] | None = None  # [epoch, start, handed out] of the pass iter() began last
        self._passes = 0  # iter() calls: which pass is current (LoaderPosition)
        self._restored = False  # a loaded position that the next iter() continues

    @property
    def epoch(self) -> int:
        """The epoch of the current pass, or of the next one before any."""
        return self._pass[0] if self._pass is not None else self._next[0]

    def __len__(self) -> int:
        return self.num_samples

    def indices(self, epoch: int) -> list[int]:
        """This rank's indices of `epoch`, in order."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            order = torch.randperm(self.length, generator=g).tolist()
        else:
            order = list(range(self.length))
        total = self.num_samples * self.world_size
        if total > len(order):
            pad = total - len(order)
            order += (order * math.ceil(pad / len(order)))[:pad]
        return order[self.rank:total:self.world_size]

    def __iter__(self) -> Iterator[int]:
        # Eager (not a generator function): the pass begins when iter() is called, which LoaderPosition relies on.
        epoch, start = self._next
        self._next, self._restored = (epoch + 1, 0), False
        self._pass = current = [epoch, start, 0]
        self._passes += 1
        return self._run(self.indices(epoch)[start:], current)

    @staticmethod
    def _run(indices: list[int], current: list[int]) -> Iterator[int]:
        for i in indices:
            current[2] += 1
            yield i

    def set_epoch(self, epoch: int) -> None:
        """The next iter() runs `epoch` from its first index (a pass under way is not changed)."""
        if not (self._restored and epoch == self._next[0]):
            self._next, self._restored = (epoch, 0), False

    def position(self) -> tuple[int, int]:
        """(epoch, per-rank samples handed out) of the current pass, or the next pass's start."""
        if self._pass is None:
            return self._next
        epoch, start, out = self._pass
        return epoch, start + out

    def state_dict(self) -> dict[str, Any]:
        return self.state_at(*self.position())

    def state_at(self, epoch: int, rank_position: int, begun: bool | None = None) -> dict[str, Any]:
        """The state of this sampler at (epoch, per-rank position). begun: whether the pass's DataLoader iterator
        exists already (LoaderPosition; its RNG draw is then part of the saved run)."""
        state = {"epoch": epoch, "position": min(rank_position, self.num_samples) * self.world_size,
                 "seed": self.seed, "shuffle": self.shuffle, "length": self.length, "world_size": self.world_size}
        if begun is not None:
            state["begun"] = begun
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        changed = {k: (state[k], v) for k, v in (("seed", self.seed), ("shuffle", self.shuffle),
                                                  ("length", self.length)) if state.get(k) != v}
        if changed:
            _log.warning("ResumableSampler restored with other settings: the order from here on is not the saved "
                         "run's", **{k: f"saved {a}, now {b}" for k, (a, b) in changed.items()})
        self._next = (int(state["epoch"]), min(int(state["position"]) // self.world_size, self.num_samples))
        self._pass, self._restored = None, True


class LoaderPosition:
    """state_dict()/load_state_dict() of a DataLoader's data position: what TrainingLoop saves for a DataLoader
    among its objects (usable by any loop that saves a Stateful). Save it at a step boundary, when the batches
    the DataLoader has yielded are the ones trained on.

    With a ResumableSampler (`sampler=`, or inside a plain BatchSampler) the state is the sampler's at the batches
    yielded; a StatefulDataLoader's is its own state_dict(). Either way, the first iterator the DataLoader makes
    after load_state_dict() leaves torch's global RNG as it was (a DataLoader iterator draws its workers' base
    seed from it: the saved run drew it when that pass began). `problem`: why the position cannot be restored
    (None when it can); state_dict() is then None and load_state_dict() does nothing.
    """

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.sampler, self.per_batch = _resumable_sampler(loader)
        self.stateful = callable(getattr(loader, "state_dict", None)) and callable(
            getattr(loader, "load_state_dict", None))
        self.problem = _problem(loader, self.stateful, self.sampler)
        self._torchdata = self.stateful and hasattr(loader, "next_iter_state")  # a torchdata StatefulDataLoader
        self._iterator: Callable[[], Any] = lambda: None  # a weak reference: the iterator dies as without Respawn
        self._passes_before = 0  # the sampler's pass count when the iterator was made
        self._keep_rng = False
        if self.problem is None:
            loader._get_iterator = _made_by(loader, self)  # what both kinds of DataLoader make iterators with

    def state_dict(self) -> Any:
        if self.problem is not None:
            return None
        if self.stateful:
            # StatefulDataLoader.state_dict() makes an iterator (starting its workers) when it has none; the loop
            # asks before the first batch (the restore's template, the snapshot buffers): the pending state then.
            if self._torchdata and self.loader._iterator is None:
                return self.loader.next_iter_state or {}
            return self.loader.state_dict()
        s, it = self.sampler, self._iterator()
        if it is None:  # no iterator since the start or the restore: the next one starts the pending pass
            return s.state_at(*s.position(), begun=False)
        if s._pass is not None and s._passes > self._passes_before:  # its pass has begun (workers fetch at once)
            epoch, start, _ = s._pass
            return s.state_at(epoch, start + it._num_yielded * self.per_batch, begun=True)
        return s.state_at(*s._next, begun=True)  # made, not started yet (no workers): it runs the next pass

    def load_state_dict(self, state: Any) -> None:
        if self.problem is not None or state is None:
            return
        if self.stateful:
            self.loader.load_state_dict(state)
            self._keep_rng = state != {}  # {}: saved before its first iterator; the next one begins a pass
        else:
            self.sampler.load_state_dict(state)
            self._keep_rng = bool(state.get("begun"))
        self._iterator = lambda: None

    def _made(self, make: Callable[[], Any]) -> Any:
        passes = self.sampler._passes if self.sampler is not None else 0
        if self._keep_rng:
            self._keep_rng = False
            rng = torch.get_rng_state()
            try:
                it = make()
            finally:
                torch.set_rng_state(rng)
        else:
            it = make()
        self._iterator, self._passes_before = weakref.ref(it), passes
        return it


def _made_by(loader: DataLoader, position: LoaderPosition) -> Callable[[], Any]:
    """The DataLoader's _get_iterator, reporting to its LoaderPosition. Holds neither strongly: a reference cycle
    would leave the DataLoader's iterator to the garbage collector, which can close the workers' queues before
    the iterator stops them (each worker then takes a 5 s join timeout)."""
    inner = loader.__dict__.get("_get_iterator")  # another LoaderPosition's (the class's method otherwise)
    make_of_class = type(loader)._get_iterator
    loader_ref, position_ref = weakref.ref(loader), weakref.ref(position)

    def make():
        return inner() if inner is not None else make_of_class(loader_ref())

    def get_iterator():
        p = position_ref()
        return make() if p is None else p._made(make)

    return get_iterator


def _resumable_sampler(loader: DataLoader) -> tuple[ResumableSampler | None, int]:
    """The ResumableSampler that orders `loader` and how many of its indices a batch takes, or (None, 0)."""
    batches = loader.batch_sampler
    if batches is None:
        sampler, per_batch = loader.sampler, 1
    elif type(batches) is BatchSampler:  # a subclass may group indices otherwise
        sampler, per_batch = batches.sampler, batches.batch_size
    else:
        return None, 0
    return (sampler, per_batch) if isinstance(sampler, ResumableSampler) else (None, 0)


def _problem(loader: DataLoader, stateful: bool, sampler: ResumableSampler | None) -> str | None:
    """Why `loader`'s position cannot be restored exactly, or None."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        if stateful or callable(getattr(dataset, "state_dict", None)):
            return None if stateful else ("a plain DataLoader does not save its IterableDataset's state: a "
                                          "restart reads it from the beginning")
        return "its IterableDataset has no state_dict(): a restart reads it from the beginning"
    batches = loader.batch_sampler  # with batch_sampler= given, loader.sampler is a default that orders nothing
    order = loader.sampler if batches is None else getattr(batches, "sampler", batches)
    if stateful:
        if isinstance(order, _TORCH_RANDOM_SAMPLERS):  # torchdata's own RandomSampler is not one of these
            return (f"its sampler ({type(order).__name__}) has no state: a restart skips ahead in another "
                    "shuffle")
        return None
    if sampler is not None:
        return None
    if batches is not None and type(batches) is not BatchSampler:
        order = batches
    return f"its {type(order).__name__} has no position: a restart begins the epoch again"


class _Unsaved:
    """What the loop saves for data whose position it cannot restore: nothing."""

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: Any) -> None:
        pass


def check_data(name: str, data: DataLoader | IterableDataset) -> Any:
    """The Stateful TrainingLoop saves for a DataLoader or an IterableDataset among its objects: its position, or
    nothing after one WARNING that names it and what to do (the run goes on: this is not an error)."""
    if isinstance(data, DataLoader):
        position = LoaderPosition(data)
        if position.problem is None:
            return position
        problem = position.problem
    elif callable(getattr(data, "state_dict", None)) and callable(getattr(data, "load_state_dict", None)):
        return data
    else:
        problem = "an IterableDataset without state_dict(): a restart reads it from the beginning"
    _log.warning(f"{name}={type(data).__name__} cannot resume its data position exactly ({problem}); the run goes "
                 "on. Use sampler=respawn.ckpt.data.ResumableSampler(dataset, shuffle=True, seed=0) in a DataLoader, "
                 "or torchdata's StatefulDataLoader (over a dataset with state_dict() if it is an IterableDataset)",
                 object=name)
    return _Unsaved()


def forever(loader: Any) -> Iterator[Any]:
    """The batches of `loader`, one pass after another (with a ResumableSampler or a StatefulDataLoader each
    pass is the next epoch, and the first after a restore continues the saved one). Raises ValueError when two
    passes in a row yield nothing (an empty loader would loop for ever)."""
    empty = 0
    while True:
        got = False
        for batch in loader:
            got = True
            yield batch
        empty = 0 if got else empty + 1
        if empty == 2:  # one may be the rest of a pass saved at its end
            raise ValueError(f"forever(): {type(loader).__name__} yields no batches")
