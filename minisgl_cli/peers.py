"""The engines bench-offline runs beside minisgl on the same workload: one small interface, two implementations
(transformers in `hf_peer.py`, vLLM in `vllm_peer.py`). Neither is a dependency of the project: a peer whose
package does not import is a clear error (PeerUnavailable), not a traceback."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

PEERS = ("transformers", "vllm")
# The engine flags (minisgl_cli/options.py) each peer's run reads from the run's EngineConfig; the others set
# minisgl's engine alone (max_model_len: the workload's context check, and vLLM's own limit).
PEER_ENGINE_FLAGS = {
    "transformers": ("model", "device", "dtype", "kv_cache_dtype", "max_model_len"),
    "vllm": ("model", "device", "dtype", "kv_cache_dtype", "max_model_len", "tp"),
}
OnDone = Callable[[int], None]  # called with each finished request's output token count


class PeerUnavailable(Exception):
    """The peer cannot run here (its package is missing, or the model or device is one it cannot take)."""


@dataclass(slots=True)
class PeerRun:
    api: str  # how the peer batched the requests, e.g. "generate_batch", "generate", "LLM.generate"
    output_lens: list[int]  # tokens each completed request produced
    duration: float
    failed: int = 0


class Peer(Protocol):
    def generate(
        self,
        prompts: Sequence[list[int]],
        output_lens: Sequence[int],
        temperature: float,
        on_done: OnDone | None = None,
    ) -> PeerRun:
        """One timed pass over the prompts, each with its own output length (EOS ignored); every pass starts with
        no cached prefixes from an earlier one."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON fields of the run besides the figures: model, device, dtype and the engine's settings."""
        ...

    def close(self) -> None: ...


def open_peer(
    name: str,
    config,
    peer_api: str = "auto",
    peer_batch_size: int = 64,
    vllm_args: dict[str, Any] | None = None,
    quiet: bool = False,
) -> Peer:
    """Load the named peer with `config`'s model (its start-up is the caller's to time); vllm_args: the vLLM
    peer's engine-argument overrides; quiet: the peer loads without progress bars."""
    if name == "transformers":
        from minisgl_cli.hf_peer import TransformersPeer

        return TransformersPeer(config, peer_api, peer_batch_size, quiet)
    if name == "vllm":
        from minisgl_cli.vllm_peer import VllmPeer

        return VllmPeer(config, vllm_args, quiet)
    raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")


@contextmanager
def no_tqdm_bars(quiet: bool) -> Iterator[None]:
    """While a peer loads under --quiet: no tqdm bar, in this process or a process it starts. Both peers' packages
    draw bars no switch of theirs reaches: vLLM 0.26's graph capture in its engine core (vllm/v1/worker/gpu/
    cudagraph_utils.py; its use_tqdm_on_load does not), transformers' GGUF conversion (its weight bar has a switch,
    and is tqdm too). TQDM_DISABLE is read when tqdm is imported, and this process imported it before (the engine's
    GGUF reader): so tqdm's bars are disabled meanwhile, which a forked process (vLLM's engine core) inherits, and
    TQDM_DISABLE is set for one that is spawned (a fresh tqdm import)."""
    if not quiet:
        yield
        return
    import tqdm.std  # type: ignore[import-untyped]

    cls = tqdm.std.tqdm
    raw, init, env = cls.__dict__["__init__"], cls.__init__, os.environ.get("TQDM_DISABLE")

    def disabled_init(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "disable": True})

    cls.__init__ = disabled_init
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        cls.__init__ = raw
        if env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = env
