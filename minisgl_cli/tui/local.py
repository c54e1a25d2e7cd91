"""The in-process engine as a chat backend: requests go to an AsyncLLM, whose thread runs the engine loop; the
answer is the engine's own RequestStream, with the engine's token times."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from engine.async_llm import AsyncLLM, EngineDeadError, RequestStream
from engine.sampling_params import SamplingParams
from minisgl_cli.tui.backend import BackendError
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.thinking import OPEN
from minisgl_cli.tui.turn import Piece


class LocalAnswer:
    def __init__(self, engine: AsyncLLM, stream: RequestStream, opens_in_thinking: bool = False) -> None:
        self.engine, self.stream = engine, stream
        self.started = time.perf_counter()
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
            yield Piece(finished=True, finish_reason="error", error=str(e) or self.engine.error or "engine stopped")

    def stop(self) -> None:
        self.engine.abort(self.stream.rid)


class LocalBackend:
    METRICS_TIMEOUT = 5.0  # seconds; a read waits for the engine's current step

    def __init__(self, engine: AsyncLLM) -> None:
        self.engine = engine
        info = engine.llm.describe()
        self.model = info["model"]
        kv = f" · KV {info['kv_cache_dtype']}" if info["kv_cache_dtype"] != info["dtype"] else ""
        self.title = f"{info['model']} · {info['device']} · {info['dtype']}{kv}"
        self.title += f" · attention {info['attention']} · TP {info['tp']}"
        self.context_limit: int | None = engine.llm.engine.max_model_len
        self.thinking_switch: bool | None = engine.llm.tokenizer.thinking_switch

    def start(self, messages: list[dict[str, str]], params: SamplingParams, thinking: bool | None) -> LocalAnswer:
        tok = self.engine.llm.tokenizer
        kwargs = {"enable_thinking": thinking} if thinking is not None and self.thinking_switch else {}
        prompt = tok.chat_prompt(messages, **kwargs)
        try:
            stream = self.engine.submit(tok.encode_chat(messages, **kwargs), params, loop=asyncio.get_running_loop())
        except EngineDeadError as e:
            raise BackendError(str(e)) from e
        return LocalAnswer(self.engine, stream, prompt.rstrip().endswith(OPEN))

    async def load(self) -> Load | None:
        if not self.engine.alive:
            return None
        try:
            m = await asyncio.to_thread(self.engine.call, lambda llm: llm.metrics(), self.METRICS_TIMEOUT)
        except Exception:  # a busy or stopped engine: the next poll tries again
            return None
        return Load.from_engine(m)

    async def aclose(self) -> None:
        pass
