"""The one API every front end uses: text in, streamed text out, metrics on the side."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from engine.config import EngineConfig
from engine.engine import Engine, Progress
from engine.metrics import EngineMetrics
from engine.request import Req
from engine.sampling_params import SamplingParams
from engine.tokenizer import IncrementalDetokenizer, Message

Prompt = str | list[int] | list[Message]


@dataclass(slots=True)
class RequestOutput:
    rid: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    cache_hit_tokens: int = 0
    arrival: float = 0.0
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies (TBT) in seconds."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(slots=True)
class _TextState:
    detok: IncrementalDetokenizer
    stop: list[str]
    text: str = ""
    emitted: int = 0  # characters already handed out
    n_ids: int = 0  # output ids already detokenized
    finish_reason: str | None = None

    @property
    def hold(self) -> int:
        """Characters held back while they could still be the start of a stop string."""
        return max((len(s) for s in self.stop), default=1) - 1

    def feed(self, new_ids: list[int]) -> None:
        for t in new_ids:
            start = max(len(self.text) - self.hold, 0)
            self.text += self.detok.add(t)
            for s in self.stop:
                i = self.text.find(s, start)
                if i >= 0:
                    self.text, self.finish_reason = self.text[:i], "stop"
                    return


class LLM:
    def __init__(self, config: EngineConfig | None = None, progress: Progress | None = None, **overrides):
        self.config = config or EngineConfig(**overrides)
        self.engine = Engine(self.config, progress)
        self.tokenizer = self.engine.loaded.tokenizer
        self._text: dict[str, _TextState] = {}

    # ---- requests -------------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.encode_chat(prompt)  # type: ignore[arg-type]
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)  # type: ignore[arg-type]
        raise ValueError("prompt must be a string, a list of token ids, or a list of chat messages")

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, rid: str | None = None) -> str:
        params = params or SamplingParams()
        ids = self.encode(prompt)
        req = self.engine.add_request(ids, params, rid)
        self._text[req.rid] = _TextState(IncrementalDetokenizer(self.tokenizer, ids), list(params.stop))
        return req.rid

    def abort(self, rid: str) -> None:
        self.engine.abort(rid)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> list[RequestOutput]:
        return [o for r in self.engine.step() if (o := self._output(r)) is not None]

    def _output(self, req: Req) -> RequestOutput | None:
        st = self._text.get(req.rid)
        if st is None:
            return None  # already reported finished (e.g. a stop string ended it a step earlier)
        new_ids = req.output_ids[st.n_ids :]
        st.n_ids = len(req.output_ids)
        reason, error = req.finish_reason, req.error
        try:
            st.feed(new_ids)
        except Exception as e:  # a fault in one request's text handling ends that request only
            reason, error = "error", f"detokenization failed: {e}"
        if st.finish_reason and not req.finished:
            reason = st.finish_reason
        if reason and not req.finished:
            self.engine.abort(req.rid, reason, error)  # free its pages at the next step
        finished = reason is not None
        upto = len(st.text) if finished else max(len(st.text) - st.hold, st.emitted)
        delta, st.emitted = st.text[st.emitted : upto], upto
        if finished:
            del self._text[req.rid]
        return RequestOutput(
            req.rid,
            req.prompt_ids,
            list(req.output_ids),
            st.text[:upto],
            delta,
            new_ids,
            finished,
            reason,
            error,
            req.cache_hit_tokens,
            req.arrival,
            req.first_token_time,
            list(req.token_times),
        )

    # ---- conveniences -------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        on_output=None,
        on_step=None,
    ) -> list[RequestOutput]:
        """Run a batch to completion; outputs in prompt order. on_step(outputs) sees each step's outputs at once."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(rids):
            outs = self.step()
            if on_step is not None:
                on_step(outs)
            for out in outs:
                if on_output is not None:
                    on_output(out)
                if out.finished:
                    final[out.rid] = out
        while any(r in self.engine.reqs for r in rids):  # a stop string ended some: their pages go back now
            self.step()
        return [final[r] for r in rids]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Drive the engine until this request finishes, yielding its outputs (other requests progress too)."""
        rid = self.add_request(prompt, params)
        done = False
        try:
            while not done:
                for out in self.step():
                    if out.rid == rid:
                        done = out.finished
                        yield out
        finally:
            if not done:
                self.abort(rid)
            while self.engine.has_work() and rid in self.engine.reqs:  # also when a stop string ended it
                self.step()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics()

    def describe(self) -> dict[str, str]:
        e = self.engine
        return {
            "model": e.model_cfg.name or str(self.config.model),
            "device": str(e.device),
            "dtype": str(e.dtype).removeprefix("torch."),
            "attention": e.backend_name,
            "tp": str(self.config.tp),
        }
