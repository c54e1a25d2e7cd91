"""The local engine as a chat backend. Its loop runs apart from the chat (engine_loop.EngineLoop: `minisgl chat` runs
it in the parent process, the chat in a child; tests run it in a thread) and the chat reaches it through RemoteLLM,
which tokenizes and detokenizes here. Apart, because the chat's UI shares no interpreter with the engine: in one
process, Textual's redraws and the engine's step took turns at the GIL and a 2-core CPU streamed at a third of the
engine's speed (docs/benchmarks.md, "What the TUI costs")."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from engine.ipc import EngineInfo
from engine.limits import ContextOverflow
from engine.remote_llm import RemoteLLM
from engine.sampling_params import SamplingParams
from engine.streams import EngineDeadError, RequestStream
from minisgl_cli.tui.backend import BackendError, too_long
from minisgl_cli.tui.session import sampling_given
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.thinking import OPEN
from minisgl_cli.tui.turn import Piece

_rids = itertools.count()


class LocalAnswer:
    def __init__(
        self, remote: RemoteLLM, stream: RequestStream, opens_in_thinking: bool = False, started: float | None = None
    ) -> None:
        self.remote, self.stream = remote, stream
        self.started = time.perf_counter() if started is None else started  # when it was sent
        self.opens_in_thinking = opens_in_thinking

    async def __aiter__(self) -> AsyncIterator[Piece]:
        seen = 0
        try:
            async for out in self.stream:
                times, seen = list(out.token_times[seen:]), len(out.token_times)
                yield Piece(
                    out.delta_text,
                    "",
                    times,
                    out.finished,
                    out.finish_reason,
                    out.error,
                    len(out.prompt_token_ids),
                    out.cache_hit_tokens,
                    len(out.token_ids),
                )
        except EngineDeadError as e:
            # shut down (a closing terminal's SIGHUP reached the engine's process before the chat's): stopped, as the
            # chat's own exit would save it; a crash: failed
            reason = "abort" if e.stopped else "error"
            yield Piece(finished=True, finish_reason=reason, error=str(e) or self.remote.error or "engine stopped")

    def stop(self) -> None:
        self.remote.abort(self.stream.rid)


class LocalBackend:
    switches_models = False
    METRICS_TIMEOUT = 5.0  # seconds; a read waits for the engine's current step

    ENGINE_WATCH_S = 0.5

    def __init__(
        self,
        remote: RemoteLLM,
        info: EngineInfo,
        engine_pid: int | None = None,
        sampling_defaults: dict[str, Any] | None = None,
    ) -> None:
        """`engine_pid`: the engine's process is this one's parent (`minisgl chat`), watched from ready() on.
        `sampling_defaults`: the model's generation_config.json values (engine.tokenizer.sampling_defaults), which a
        turn takes for the fields its chat leaves unset, as `serve` gives them to a request that leaves them out (the
        local chat sampled Qwen3 with top_k off where `chat --url` to `minisgl serve` got its 20); the temperature and
        max_tokens are always the chat's own (it sends both to a server too)."""
        self.remote, self.engine_pid = remote, engine_pid
        own = ("temperature", "max_tokens")
        self.sampling_defaults = {k: v for k, v in (sampling_defaults or {}).items() if k not in own}
        self._last: Load | None = None
        self._watch: asyncio.Task[None] | None = None
        self.model = info.model
        kv = f" · KV {info.kv_cache_dtype}" if info.kv_cache_dtype not in ("", info.dtype) else ""
        self.title = f"{info.model} · {info.device} · {info.dtype}{kv} · attention {info.attention} · TP {info.tp}"
        # what one request may span: the model's context, or the KV pool's capacity where that is smaller
        self.context_limit: int | None = info.limits.max_request_tokens
        self.thinking_switch: bool | None = remote.tokenizer.thinking_switch

    async def ready(self, timeout: float = 60.0) -> None:
        """Greet the engine from the event loop the chat runs on (RemoteLLM lives on one loop); before any answer."""
        await self.remote.start(timeout)
        if self.engine_pid is not None:
            self._watch = asyncio.create_task(self._watch_engine(self.engine_pid))

    async def _watch_engine(self, pid: int) -> None:
        """An engine killed outright sends no last word: its open answers and the next ones end with this error."""
        while os.getppid() == pid:
            await asyncio.sleep(self.ENGINE_WATCH_S)
        self.remote.fail_all(f"the engine process (pid {pid}) exited")

    def start(self, messages: list[dict[str, str]], params: SamplingParams, thinking: bool | None) -> LocalAnswer:
        given = sampling_given(params)
        unset = {k: v for k, v in self.sampling_defaults.items() if k not in given}
        if unset:
            params = dataclasses.replace(params, **unset)
        tok = self.remote.tokenizer
        kwargs: dict[str, Any] = {"enable_thinking": thinking} if thinking is not None and self.thinking_switch else {}
        prompt = tok.chat_prompt(messages, **kwargs)
        ids = tok.encode_chat(messages, **kwargs)
        started = time.perf_counter()  # before the submit: the engine may stamp the first token before it returns
        try:
            stream = self.remote.submit(ids, params, f"chat-{next(_rids)}")
        except EngineDeadError as e:
            raise BackendError(str(e)) from e
        except ContextOverflow as e:
            raise ValueError(too_long(str(e), messages, e.prompt_tokens, e.limit)) from e
        return LocalAnswer(self.remote, stream, prompt.rstrip().endswith(OPEN), started)

    async def load(self) -> Load | None:
        """The engine's load; the last one, marked stale, while a step outlasts the read (a long prompt's prefill on
        a CPU: the panel once went blank as if the engine were gone); None once the engine is gone."""
        m = await self.remote.metrics(self.METRICS_TIMEOUT)
        if m is not None:
            self._last = Load.from_engine(m)
            return self._last
        if self._last is None or not self.remote.alive:
            return None
        return dataclasses.replace(self._last, stale=True)

    async def models(self) -> list[str]:
        return [self.model]

    def use_model(self, model: str) -> None:
        raise ValueError(
            f"this chat's engine runs {self.model}: another model needs a restart (minisgl chat --model {model})"
        )

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self.remote.close()
