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

    async def aclose(self) -> None:
        """Release what the front end's event loop holds (connections); the engine itself belongs to its owner."""
        ...
