"""The one process-wide context: this rank's place in the tensor-parallel group."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C functions (ctrl_c_after_step)
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(slots=True)
class TPContext:
    rank: int = 0
    size: int = 1
    # gloo group for the control plane (commands), so it never waits on the GPU stream
    cpu_group: dist.ProcessGroup | None = None
    # the group's rendezvous store (torchrun's, under this group's prefix), while this rank is in the group: a rank
    # whose engine start failed leaves its reason there for the others (leave_failed_start)
    store: dist.Store | None = None

    @property
    def enabled(self) -> bool:
        return self.size > 1

    # On CPUs (gloo) each rank sends its tensor to every other, and an all-reduce of up to p2p_max_bytes sums the parts
    # in rank order (every rank adds the same parts in the same order: equal results everywhere). On a 2-core machine
    # gloo's all_reduce took 2-4x as long up to 256 x 576 floats, and its all_gather up to 3x as long at every size
    # (benchmarks/gloo_collectives.py); its all_reduce wins above ~1 MiB (a prefill's).
    p2p: bool = False
    p2p_max_bytes: int = 1 << 20

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        if not self.p2p or x.numel() * x.element_size() > self.p2p_max_bytes:
            dist.all_reduce(x)
            return x
        parts = self._from_every_rank(x.contiguous())
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return x.copy_(total)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        if self.p2p:
            return torch.cat(self._from_every_rank(x.contiguous()), dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def _from_every_rank(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `x` (same shape and dtype on each), in rank order; this rank's is `x` itself."""
        parts = [x if r == self.rank else torch.empty_like(x) for r in range(self.size)]
        pending = []
        for r in range(self.size):
            if r != self.rank:  # all posted before any wait: no rank blocks on a peer that has not posted yet
                pending += [dist.isend(x, r), dist.irecv(parts[r], r)]
        for work in pending:
            cast(dist.Work, work).wait()  # None only for a rank outside the group
        return parts


TP = TPContext()
_GROUPS_JOINED = 0  # process groups this process has joined (init_tp)


def init_tp(size: int, device: str) -> TPContext:
    """Join the torchrun group (if any). Sizes and ranks come from torchrun's environment."""
    import os
    from datetime import timedelta

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1 and world > 1:  # --tp left out under torchrun: "--tp 1 needs exactly 1 processes" named no fix
        raise ValueError(f"this run has {world} processes (torchrun, WORLD_SIZE={world}): add --tp {world}")
    if size != world:
        raise ValueError(
            f"--tp {size} needs exactly {size} processes (torchrun --nproc-per-node {size}); "
            f"this run has WORLD_SIZE={world}"
        )
    if size > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        timeout = timedelta(seconds=float(os.environ.get("MINISGL_DIST_TIMEOUT", "600")))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        global _GROUPS_JOINED
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        store.set_timeout(timeout)
        # The first group's keys under the prefix init_process_group's own env:// path gives them ("default_pg"). A
        # later engine in this process (the previous one's shutdown destroyed its group) takes one of its own: torch
        # names the default group's rendezvous keys by a count that destroy_process_group resets, so a second group
        # on torchrun's store read the first group's stale addresses (a gloo connect timeout or "Connection
        # refused", or a hang for MINISGL_DIST_TIMEOUT).
        store = dist.PrefixStore("default_pg" if _GROUPS_JOINED == 0 else f"minisgl-{_GROUPS_JOINED}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        _GROUPS_JOINED += 1
        TP.store = store
        TP.cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
    TP.rank = dist.get_rank() if size > 1 else 0
    TP.size = size
    TP.p2p = size > 1 and dist.get_backend() == "gloo"
    return TP


# Settings each rank may hold its own value of: the KV pool's size is the smallest any rank can hold (an all-reduce
# MIN at the start), and rank 0 samples every token (its seed is the one that counts).
PER_RANK_SETTINGS = frozenset({"num_pages", "kv_cache_gb", "memory_fraction", "seed", "check_invariants"})


def check_same_settings(config: Any) -> None:
    """Every rank must run rank 0's engine settings: each builds its own batches from them, so a rank with another
    --page-size, --no-radix-cache or --max-running-requests fell out of lockstep at its first differing decision (a
    gloo "Connection reset by peer" mid-serving), and one with another --model of the same shapes served a mix of two
    models without a word. Raised on every rank, naming the settings that differ."""
    import dataclasses

    mine = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # an EngineConfig
    every: list[dict[str, Any] | None] = [None] * TP.size
    dist.all_gather_object(every, mine, group=TP.cpu_group)
    bad = [
        f"rank {r}: {k}={theirs[k]!r} (rank 0: {every[0][k]!r})"
        for r, theirs in enumerate(every[1:], 1)
        if theirs is not None and every[0] is not None
        for k in theirs
        if k not in PER_RANK_SETTINGS and theirs[k] != every[0][k]
    ]
    if bad:  # every rank found the same: they leave the group together before raising
        leave_tp_group()
        raise ValueError(
            "the tensor-parallel ranks were started with different engine settings (every rank needs the same "
            "flags): " + "; ".join(bad)
        )


def refused_on_every_rank(err: Exception) -> Exception:
    """`err`, for a start every rank refuses alike (a check of the model's config or of the pool's agreed size): under
    tensor parallelism the ranks leave their group together first, as check_same_settings's do; a group kept until
    interpreter exit could abort a rank there (torchrun then reported the SIGABRT, not the refusal: CI at 84e109b)."""
    if TP.size > 1:
        leave_tp_group()
    return err


def leave_tp_group() -> None:
    """Every rank of the group is here (a shutdown, or a start every rank refused): meet, then tear the group down.
    TP.cpu_group may be the default group itself: a reference left to it kept its gloo threads alive until interpreter
    exit, where their destructor could run in any order and abort the rank ("terminate called without an active
    exception"; after a refused start, 3 of 12 CPU runs of tests/tp_api.py)."""
    if dist.is_initialized():
        dist.barrier(group=TP.cpu_group)
        dist.destroy_process_group()
    TP.cpu_group = TP.store = None


class TPStartFailed(RuntimeError):
    """Another rank of the tensor-parallel group failed to start its engine (named, with its error); this rank has
    left the group too."""


_START_FAILED = "minisgl-start-failed"  # the store key of the first rank whose start failed, and why


def start_checkpoint() -> None:
    """Every rank's start got this far: a rank whose start failed before it has left the group, so the others' wait
    here ends at once in an error (leave_failed_start names that rank), not in a later collective that no rank whose
    start failed would reach (over NCCL, one inside a CUDA graph capture)."""
    if TP.size > 1:
        dist.barrier(group=TP.cpu_group)


def leave_failed_start(err: BaseException) -> TPStartFailed | None:
    """This rank's engine start failed under tensor parallelism, while the other ranks may still be in theirs (a
    failure every rank makes alike has left the group already: refused_on_every_rank). If another rank's start failed
    first (the error here was that rank leaving: "Connection closed by peer"), returns a TPStartFailed naming it;
    otherwise this rank's failure is the first: it tells the others why through the group's store. Either way this
    rank leaves the group now, without meeting the others: its sockets close, so the others' collectives fail at
    once. A rank that kept its group held them in the start's all-reduce for MINISGL_DIST_TIMEOUT (600 s), and if
    it ended first they died of a bare gloo error naming no rank."""
    store, TP.store, TP.cpu_group = TP.store, None, None
    first = None
    try:
        if store is not None and store.check([_START_FAILED]):
            first = store.get(_START_FAILED).decode()
        elif store is not None:
            why = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
            store.set(_START_FAILED, f"rank {TP.rank} failed to start its engine ({why})")
    except Exception:  # the store is gone with torchrun: the others learn of it from torchrun, or their timeout
        pass
    if dist.is_initialized():
        dist.destroy_process_group()
    # a Ctrl-C reaches every rank under torchrun: each one's stays a KeyboardInterrupt
    return TPStartFailed(first) if first is not None and isinstance(err, Exception) else None


def broadcast_objects(obj: T) -> T:
    """Rank 0's object on every rank (control plane, over gloo)."""
    box = [obj if TP.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=TP.cpu_group)
    return cast(T, box[0])


@contextmanager
def ctrl_c_after_step() -> Iterator[None]:
    """An engine step (rank 0's under TP): a Ctrl-C (KeyboardInterrupt) that arrives during it is raised once it is
    done. Raised inside, it cut the step short: the requests it had scheduled were never processed, and those of
    another caller (a second thread's generate()) then waited forever for that step's token; under TP, it stopped
    rank 0 between two collectives, the followers waited in the next one and rank 0 in another (`bench-offline --tp
    2` stopped by Ctrl-C hung until torchrun killed both ranks 30 s later, with no results). A second Ctrl-C during
    the same step is raised at once. Only where Python's own handler is in place, in the main thread: `serve`'s engine
    loop has its own, which acts between steps already, and the followers ignore SIGINT. The handlers are swapped
    through signal's C functions (_signal): its Python wrappers turn each handler into an enum through a caught
    ValueError: 19 us a step against 2 (2-core CPU machine)."""
    if threading.current_thread() is not threading.main_thread() or (
        _signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if caught:  # a second Ctrl-C while a step hangs (a peer gone, before the collective times out): now
            raise KeyboardInterrupt
        caught.append(signum)

    _signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        _signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def leave_failed_group(err: BaseException) -> NoReturn:
    """A step failed under tensor parallelism: a peer died, stopped answering (the collective timed out after
    MINISGL_DIST_TIMEOUT seconds) or raised, so the ranks are out of lockstep for good. Any further collective,
    the shutdown broadcast and destroy_process_group included, could block as long again, so this rank leaves at
    once with a message naming it; torchrun sees a non-zero exit and ends the other ranks."""
    import os
    import sys

    print(
        f"minisgl: rank {TP.rank}: tensor-parallel group failed ({type(err).__name__}: {err}); exiting",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(1)
