"""The wire between the engine process and the HTTP front end: two ZeroMQ PUSH/PULL pipes over Unix sockets,
msgpack-encoded lists. The front end sends commands; the engine answers with one message per step.

Front end -> engine:            Engine -> front end:
  ["hello"]                       ["hello", info]                 (EngineInfo as a dict)
  ["add", rid, ids, params]       ["step", [[rid, new_ids, token_times, finish_reason, error, cache_hit_tokens(,
                                              logprobs, prompt_logprobs: only for requests that asked)], ...]]
  ["abort", rid, reason]          ["refused", rid, message]       (the engine's own check refused an add)
  ["metrics", seq]                ["reply", seq, metrics]          (EngineMetrics as a dict)
  ["clear_cache", seq]            ["reply", seq, true]             (after the step that dropped the unheld cached pages)
                                  ["dead", why, stopped]           (the loop ended: EngineLoop.stop() or its watch
                                                                    (stopped: true), or a crash (false); nothing
                                                                    more follows)

token_times are the engine's time.perf_counter() when each new token was made. Both ends run on one host (the pipes
are Unix sockets), where that clock is one monotonic clock for every process, so the front end takes them as they are:
a front end busy elsewhere (a TUI redrawing) reads several steps at once, and stamping them on arrival would report
gaps of zero between tokens the engine made milliseconds apart.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar, cast

import msgpack
import zmq

from engine.limits import RequestLimits
from engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class Addresses:
    commands: str  # front end -> engine
    outputs: str  # engine -> front end

    @staticmethod
    def temporary() -> Addresses:
        """A fresh directory for the two sockets, under $TMPDIR; where that path would not fit a Unix socket's
        address (107 bytes: a long HPC or CI scratch TMPDIR), under /tmp, so that the bind does not fail after the
        model has loaded."""
        limit = getattr(zmq, "IPC_PATH_MAX_LEN", 107)
        where = tempfile.mkdtemp(prefix="minisgl-")
        if len(f"{where}/commands") > limit:
            os.rmdir(where)
            where = tempfile.mkdtemp(prefix="minisgl-", dir="/tmp")  # OSError if /tmp is unusable: before the load
            if len(f"{where}/commands") > limit:  # a symlinked /tmp cannot be this
                os.rmdir(where)
                raise OSError(f"no directory for the engine's Unix sockets: {tempfile.gettempdir()} is too long a path")
        _sweep_dead(os.path.dirname(where))
        return Addresses(f"ipc://{where}/commands", f"ipc://{where}/outputs")

    def remove(self) -> None:
        shutil.rmtree(os.path.dirname(self.commands.removeprefix("ipc://")), ignore_errors=True)


STALE_AFTER_S = 120.0  # a folder this old whose engine socket refuses connections belongs to no live engine


def _sweep_dead(parent: str) -> None:
    """Remove this user's socket folders that no engine serves any more: an engine killed outright (SIGKILL to the
    process group, docker kill, the OOM killer) leaves its folder, and hundreds piled up in /tmp. A folder is dead
    when its commands socket refuses a connection; a young one may belong to an engine still starting."""
    import errno
    import socket
    import time

    try:
        names = [n for n in os.listdir(parent) if n.startswith("minisgl-")]
    except OSError:
        return
    for name in names:
        d = os.path.join(parent, name)
        try:
            st = os.lstat(d)
            if st.st_uid != os.getuid() or time.time() - st.st_mtime < STALE_AFTER_S:
                continue
            if not set(os.listdir(d)) <= {"commands", "outputs"}:  # not one of ours
                continue
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(os.path.join(d, "commands"))  # a live engine's zmq accepts (and drops the stranger)
        except OSError as e:
            # refused: bound once, its engine gone. A folder without its socket may be an engine still loading
            # its model (it binds after the load: minutes on a GPU), and stays.
            if e.errno == errno.ECONNREFUSED:
                shutil.rmtree(d, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the front end needs to know about the engine it serves."""

    model: str
    device: str
    dtype: str
    attention: str
    tp: int
    max_running_requests: int
    limits: RequestLimits
    kv_cache_dtype: str = ""  # where it differs from dtype (fp8)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_wire(d: dict[str, Any]) -> EngineInfo:
        return EngineInfo(**{**d, "limits": RequestLimits(**d["limits"])})


def params_to_wire(p: SamplingParams) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in fields(p)}


def params_from_wire(d: dict[str, Any]) -> SamplingParams:
    """SamplingParams(**d), validated, with the seed taken literally: a user's -1 was read as "no seed" where it was
    given, so a -1 here is a choice's own seed (n > 1 from seed -2 gives choice 1 seed -1, as vLLM's children)."""
    p = SamplingParams(**d)
    p.seed = d.get("seed")
    return p


def pack(msg: list[Any]) -> bytes:
    return cast(bytes, msgpack.packb(msg, use_bin_type=True))


def unpack(raw: bytes) -> list[Any]:
    return cast(list[Any], msgpack.unpackb(raw, raw=False, strict_map_key=False))


S = TypeVar("S", bound=zmq.Socket)  # type: ignore[type-arg]  # plain or asyncio socket, whatever its frame type


def connect(s: S, address: str, bind: bool) -> S:
    s.setsockopt(zmq.LINGER, 0)
    # No high-water mark: the engine must never block on a slow reader; one message per step stays small.
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.bind(address) if bind else s.connect(address)
    return s
