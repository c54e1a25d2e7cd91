"""What the chat front ends talk to: the local engine (local.py) or any OpenAI-compatible server
(server_backend.py over remote.py). Both stream an answer as Pieces and report the load behind the panel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from engine.sampling_params import SamplingParams
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.turn import Piece


class BackendError(RuntimeError):
    """The backend cannot take requests at all (the engine stopped, the server is unreachable)."""


def too_long(
    reason: str, messages: list[dict[str, str]], prompt_tokens: int | None = None, limit: int | None = None
) -> str:
    """The chat's one message for a turn whose conversation plus answer does not fit the model (its context, or the
    KV pool's capacity): the backend's `reason`, then what to do. `prompt_tokens` / `limit` when known (the local
    engine): whether a shorter answer could still fit."""
    if prompt_tokens is not None and limit is not None and prompt_tokens < limit:
        shorter = f"/max-tokens {limit - prompt_tokens} or less leaves room for a shorter answer"
    elif prompt_tokens is None:
        shorter = "a smaller /max-tokens may leave room for an answer"
    else:
        shorter = ""
    if any(m["role"] == "assistant" for m in messages):
        what, fix = "conversation too long", "/reset starts a new chat (unless this message alone is too long)"
    else:
        what, fix = "message too long", "a shorter message (or a shorter /system prompt) fits"
    return f"{what}: {reason}; " + (f"{shorter}, or {fix}" if shorter else fix)


class Answer(Protocol):
    """One answer in flight. Iterate it on the event loop it was started on; the last Piece has finished=True
    (finish_reason "error" with the reason when the engine or server failed)."""

    started: float  # time.perf_counter() when it was sent
    opens_in_thinking: bool  # the prompt already ends in <think>: the answer starts inside the thinking

    def __aiter__(self) -> AsyncIterator[Piece]: ...

    def stop(self) -> None:
        """Ask for the answer to end early; it then finishes with finish_reason "abort"."""


class ChatBackend(Protocol):
    title: str  # for the header: model and where it runs
    model: str  # saved with each session
    context_limit: int | None  # the model's context in tokens, when known
    thinking_switch: bool | None  # the chat template has enable_thinking (None: cannot tell, a server)
    switches_models: bool  # use_model may take another model (a server); the local engine runs the one it loaded

    async def ready(self) -> None:
        """Get ready on the event loop the chat runs on, before its first answer or load."""
        ...

    def start(self, messages: list[dict[str, str]], params: SamplingParams, thinking: bool | None) -> Answer:
        """Send a conversation (call on the running event loop). ValueError: this request is refused (too long,
        bad input); BackendError: nothing can be sent."""
        ...

    async def load(self) -> Load | None:
        """The KV cache and scheduler numbers now; None when they cannot be had (a server without known metrics)."""
        ...

    async def models(self) -> list[str]:
        """The models this backend may answer with: a server's /v1/models (BackendError: the list cannot be had now),
        the local engine's one."""
        ...

    def use_model(self, model: str) -> None:
        """Answer with `model` from the next turn on; `model`, `title` and `context_limit` follow. ValueError says why
        not (a model the server does not serve; the local engine, which runs the model it loaded)."""
        ...

    async def aclose(self) -> None:
        """Release what the front end's event loop holds (connections); the engine itself belongs to its owner."""
        ...
