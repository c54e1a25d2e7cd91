"""POST /v1/completions and /v1/chat/completions: one path for both, streaming (SSE) or not, for any number of
prompts (completions take a list) times n choices each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.logprobs import TokenLogprob
from engine.sampling_params import SamplingParams
from engine.streams import EngineDeadError
from engine.text import ChatPrompt, Prompt, RequestOutput
from engine.tokenizer import Tokenizer
from minisgl_cli.server.engine_client import EngineClient, Job, JobSpec
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.logprobs import chat_logprobs, completion_logprobs
from minisgl_cli.server.protocol import (
    SAMPLING_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    Reply,
    usage,
)

T = TypeVar("T")

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    prompts: list[Prompt] = list(body.prompts())
    return await _generate(request, body, prompts, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    return await _generate(request, body, [body.chat_prompt()], chat=True)


def _naming(param: str, e: Exception) -> str:
    return str(e) if param in str(e) else f"{param}: {e}"


# ValueErrors of the engine's checks (RequestLimits) that start with one of these name it as the request's parameter
_NAMED = (
    "logit_bias",
    "stop_token_ids",
    "n",
    "best_of",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
)


def _refusal(e: Exception, chat: bool) -> APIError:
    return refusal(e, "messages" if chat else "prompt")


def refusal(e: Exception, prompt_param: str) -> APIError:
    """The engine refused the prompt (vocabulary, context length, KV capacity: 400, naming the field the message
    starts with where it is one of _NAMED, else `prompt_param`) or its loop is gone (503)."""
    if isinstance(e, EngineDeadError):
        return APIError(503, str(e))
    first = str(e).replace("=", " ").replace(":", " ").split(" ", 1)[0]
    param = first if first in _NAMED else prompt_param
    return APIError(
        400, _naming(param, e), param=param, code="context_length_exceeded" if "exceeds" in str(e) else None
    )


def sampling_params(
    given: dict[str, Any], max_tokens: int | None, max_name: str, defaults: dict[str, Any], room: int
) -> SamplingParams:
    """A request's SamplingParams: the fields it gave over `defaults` (the model's generation_config), its length
    limit under the name the endpoint gives it (`max_name`); a bad value is a 400 naming that field. max_tokens None
    (not given): the model's max_new_tokens within `room` (what the context leaves after the prompt), else all of
    `room`, as vLLM's get_max_tokens."""
    if max_tokens is None:
        max_tokens = min(defaults.get("max_tokens", room), room)
    try:
        return SamplingParams(**{**defaults, **given, "max_tokens": max_tokens})
    except ValueError as e:  # SamplingParams names the field first: "top_p must be in (0, 1] (got 2.0)"
        name, _, rest = str(e).partition(" ")
        if name == "max_tokens":
            name = max_name
        raise APIError(400, f"{name} {rest}", param=name if name in (*SAMPLING_FIELDS, max_name) else None) from e


@dataclass(slots=True)
class _Prompt:
    ids: list[int]
    echo: str | None  # completions' echo: the prompt's text, put before each of its choices' text
    first: Job | None = None  # the job of its first choice, which carries the prompt's log-probabilities


@dataclass(slots=True)
class _Choice:
    """One sample of one prompt, and where its stream stands."""

    index: int  # in the response; best_of's extra samples get theirs once the best are picked
    prompt: _Prompt
    job: Job
    discard: bool  # max_tokens 0 with echo: the one token generated (as vLLM does) is not part of the answer
    started: bool = False  # streaming: its first chunk went out
    tokens: int = 0  # streaming: its completion tokens so far
    logprobs_sent: int = 0
    text_offset: int = 0


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the answer holds beyond text, and how to write it."""

    reply: Reply
    tokenizer: Tokenizer | None  # None: tokens are named "token_id:ID"
    logprobs: int | None  # alternatives per token; None: no log-probabilities

    def logprobs_of(self, ch: _Choice, out: RequestOutput, start: int, end: int, echo: bool) -> dict[str, Any] | None:
        """The log-probabilities of output tokens [start, end) of `out`, and of the prompt first if `echo`."""
        if self.logprobs is None:
            return None
        own = (out.logprobs or [])[start:end]
        if self.reply.chat:
            return chat_logprobs(self.tokenizer, own)
        ids = out.token_ids[start:end]
        records: list[TokenLogprob | None] = list(own)
        if echo:
            first = ch.prompt.first
            prompt = first.prompt_logprobs if first is not None else None
            ids = [*ch.prompt.ids, *ids]
            before: list[TokenLogprob | None] = [None] * len(ch.prompt.ids)  # the first token is scored by nothing
            if prompt:
                before[1:] = prompt
            records = before + records
        body, ch.text_offset = completion_logprobs(self.tokenizer, ids, records, ch.text_offset)
        return body


# Tokenizing a long text takes seconds (a 12 MB prompt: 10 s on a 2-core CPU); on the event loop that stalled every
# stream and /health until the length check refused it. The tokenizer releases the GIL, so a long prompt goes to a
# thread; short ones, nearly every request, stay inline, without the hop.
INLINE_PROMPT_CHARS = 16384


def _text_chars(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, ChatPrompt):
        prompt = prompt.messages
    return sum(len(str(m.get("content", ""))) for m in prompt if isinstance(m, dict))


async def _generate(request: Request, body: GenerationRequest, prompts: list[Prompt], chat: bool):
    client: EngineClient = request.app.state.client
    client.check_model(body.model)
    body.check_supported(client.limits)
    try:
        if sum(map(_text_chars, prompts)) <= INLINE_PROMPT_CHARS:
            encoded = [client.encode(p) for p in prompts]
        else:
            encoded = await asyncio.to_thread(lambda: [client.encode(p) for p in prompts])
        for ids in encoded:  # ids given by the client: checked before the echo decodes them (an OverflowError, a 500)
            client.limits.check_prompt(ids)
    except ValueError as e:
        raise _refusal(e, chat) from e
    max_name, max_tokens = "max_tokens", body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_name, max_tokens = "max_completion_tokens", body.max_completion_tokens
    echo, k = body.echo_prompt, body.top_logprobs_count
    discard = echo and max_tokens == 0
    if discard:  # the prompt alone (lm-evaluation-harness scores log-likelihoods so): one token is made, not shown
        max_tokens = 1
    n, samples = body.num_choices, body.num_samples
    rank_logprobs = 0 if samples > n and k is None else k  # best_of ranks samples by their tokens' log-probability
    count, limit = len(prompts) * samples, client.admission_limit
    if limit is not None and count > limit:  # more than even an idle server admits: a 400, not a 429 to retry
        choices_name = "best_of" if samples > n else "n"
        param = "prompt" if len(prompts) > limit or samples == 1 else choices_name
        what = f"{choices_name}={samples}" if samples > 1 else ""
        if len(prompts) > 1:
            what = f"{len(prompts)} prompts" + (f" x {what}" if what else "")
        most = f"{client.limits_flags} = {limit}"
        raise APIError(400, f"{what}: {count} generations at once, more than this server ever admits ({most})", param)
    specs: list[JobSpec] = []
    states: list[_Prompt] = []
    for p, ids in zip(prompts, encoded):
        room = client.limits.room(len(ids))
        params = sampling_params(body.sampling_kwargs(), max_tokens, max_name, client.sampling_defaults, room)
        # the default is a ceiling the choices share as they grow, not room each must have at once
        asked = None if max_tokens is None else params.max_tokens
        try:
            client.limits.check_choices(len(ids), asked, samples, "best_of" if samples > n else "n")
        except ValueError as e:
            raise _refusal(e, chat) from e
        # a token-id prompt echoes as transformers' decode reads it by default, special tokens included (vLLM's)
        shown = p if isinstance(p, str) else client.remote.tokenizer.decode(ids, skip_special_tokens=False)
        states.append(_Prompt(ids, shown if echo else None))
        for j in range(samples):
            try:
                choice = params.choice(j)  # seeded choices: each its own seed (vLLM's rule); validated below
                choice.logprobs, choice.prompt_logprobs = rank_logprobs, k if echo and j == 0 else None
                choice.validate()  # seed 2^64 - 1 with n 2: choice 1's seed is past the range
            except ValueError as e:
                raise APIError(400, str(e), param=str(e).split(" ")[0]) from e
            specs.append(JobSpec(ids, choice, None if j == 0 else len(specs) - j))
    try:
        jobs = client.start(request, specs)
    except (ValueError, EngineDeadError) as e:
        raise _refusal(e, chat) from e
    choices = []
    for i, job in enumerate(jobs):
        state = states[i // samples]
        if i % samples == 0:
            state.first = job
        choices.append(_Choice((i // samples) * n + i % samples, state, job, discard))
    shape = _Shape(
        Reply(
            ("chatcmpl-" if chat else "cmpl-")
            + (request.headers.get("X-Request-Id") or body.request_id or jobs[0].rid),
            client.model_name,
            chat,
            include_usage=bool(body.stream) and body.include_usage,
            continuous_usage=bool(body.stream) and body.continuous_usage,
        ),
        None if body.return_tokens_as_token_ids else client.remote.tokenizer,
        k,
    )
    prompt_tokens = sum(len(ids) for ids in encoded)
    if body.stream:
        return StreamingResponse(
            _sse(shape, choices, prompt_tokens),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        finals = [await final_output(job, "messages" if chat else "prompt") for job in jobs]
    finally:
        for job in jobs:  # one failed: the others are not waited for
            if not job.finished:
                job.abort()
    if samples > n:  # best_of: each prompt's n samples of highest mean token log-probability, best first
        for g in range(0, len(choices), samples):
            group = sorted(range(g, g + samples), key=lambda i: -_mean_logprob(finals[i]))
            for rank, i in enumerate(group):
                choices[i].index = (g // samples) * n + rank if rank < n else -1
    bodies = [
        _choice_body(shape, ch, out)
        for ch, out in sorted(zip(choices, finals), key=lambda c: c[0].index)
        if ch.index >= 0
    ]
    completion_tokens = sum(0 if ch.discard else len(out.token_ids) for ch, out in zip(choices, finals))
    return JSONResponse(shape.reply.body(bodies, usage(prompt_tokens, completion_tokens, _cached(choices))))


def _cached(choices: list[_Choice]) -> int:
    """The prompt tokens read from the prefix cache, each prompt's once (by its first choice's prefill; the others
    read the whole prompt from the cache, as `prompt_tokens` counts each prompt once)."""
    return sum(min(ch.job.cache_hit_tokens, len(ch.prompt.ids)) for ch in choices if ch.job is ch.prompt.first)


async def final_output(job: Job, prompt_param: str) -> RequestOutput:
    """A job's last output, once it is done (the generation endpoints' non-streamed answers): a refusal or the
    engine's end as refusal() says them, a failed step as a 500."""
    try:
        final = [out async for out in job.outputs()][-1]
    except (ValueError, EngineDeadError) as e:
        raise refusal(e, prompt_param) from e
    if final.finish_reason == "error":
        raise APIError(500, f"generation failed: {final.error}")
    return final


def _mean_logprob(out: RequestOutput) -> float:
    lps = [r.logprob for r in out.logprobs or []]
    return sum(lps) / len(lps) if lps else 0.0


def _choice_body(shape: _Shape, ch: _Choice, out: RequestOutput) -> dict[str, Any]:
    end = 0 if ch.discard else len(out.token_ids)
    text = (ch.prompt.echo or "") + ("" if ch.discard else out.text)
    reason, stop = ("length", None) if ch.discard else (out.finish_reason, out.stop_reason)
    lp = shape.logprobs_of(ch, out, 0, end, ch.prompt.echo is not None)
    return shape.reply.choice(ch.index, text, reason, lp, stop)


# json.dumps(ensure_ascii=False) leaves U+0085, U+2028 and U+2029 raw, but str.splitlines() (so httpx's iter_lines and
# many SSE readers) ends a line there and cuts the event's JSON in two: escape them, JSON reads them back the same.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False).translate(_LINE_BREAKS)}\n\n"


def _text_event_parts(reply: Reply, index: int) -> tuple[str, str]:
    """The text chunk's event split around its text, so each token's event is one small json.dumps, not the
    whole chunk's (the front end's hot path; the result is the same bytes)."""
    mark = "\ue000"
    event = sse_data(reply.chunk(mark, index=index))
    head, tail = event.split(json.dumps(mark, ensure_ascii=False), 1)
    return head, tail


async def merged(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(stream index, item) from every stream as items arrive (a stream's exception is raised here). Leaving early
    cancels the streams still running: a job's batches() aborts its job when cancelled before its end."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T | Exception | None]] = asyncio.Queue()

    async def drain(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(drain(i, stream)) for i, stream in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, got = await queue.get()
            if got is None:
                left -= 1
            elif isinstance(got, Exception):
                raise got
            else:
                yield i, got
    finally:
        for t in tasks:
            t.cancel()


async def _sse(shape: _Shape, choices: list[_Choice], prompt_tokens: int) -> AsyncIterator[str]:
    reply = shape.reply
    # the text-only chunks' fast path; not with log-probabilities or continuous usage, which differ chunk to chunk
    fast = shape.logprobs is None and not reply.continuous_usage
    templates = [_text_event_parts(reply, ch.index) for ch in choices] if fast else []

    def event(
        ch: _Choice,
        text: str,
        reason: str | None = None,
        lp: dict[str, Any] | None = None,
        role: bool = False,
        stop: str | int | None = None,
    ) -> str:
        so_far = (len(ch.prompt.ids), ch.tokens)
        chunk = reply.chunk(text, reason, role=role, index=ch.index, logprobs=lp, so_far=so_far, stop_reason=stop)
        return sse_data(chunk)

    try:
        if reply.chat:
            yield "".join(event(ch, "", role=True) for ch in choices)
        async for i, batch in merged([ch.job.batches() for ch in choices]):
            ch, events = choices[i], []
            for out in batch:
                if out.finish_reason == "error":
                    events.append(sse_data(APIError(500, f"generation failed: {out.error}").body()))
                    continue
                if not ch.started:
                    ch.started = True
                    if ch.prompt.echo is not None:
                        lp = shape.logprobs_of(ch, out, 0, 0, echo=True)
                        events.append(event(ch, ch.prompt.echo, lp=lp))
                if ch.discard:
                    if out.finished:
                        events.append(event(ch, "", "length"))
                    continue
                ch.tokens += len(out.delta_token_ids)
                lp = None
                if shape.logprobs is not None and out.delta_token_ids:
                    start = ch.logprobs_sent
                    ch.logprobs_sent += len(out.delta_token_ids)
                    lp = shape.logprobs_of(ch, out, start, ch.logprobs_sent, echo=False)
                if out.finished:
                    events.append(event(ch, out.delta_text, out.finish_reason, lp, stop=out.stop_reason))
                elif lp is not None or (out.delta_text and not fast):
                    events.append(event(ch, out.delta_text, lp=lp))
                elif out.delta_text:  # tokens that complete no character yet send nothing
                    head, tail = templates[i]
                    events.append(head + json.dumps(out.delta_text, ensure_ascii=False).translate(_LINE_BREAKS) + tail)
            if events:
                yield "".join(events)
        if reply.include_usage:
            yield sse_data(reply.usage_chunk(usage(prompt_tokens, sum(ch.tokens for ch in choices), _cached(choices))))
    except (ValueError, EngineDeadError) as e:
        yield sse_data(_refusal(e, reply.chat).body())
    yield "data: [DONE]\n\n"
