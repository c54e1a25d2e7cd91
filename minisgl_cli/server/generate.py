"""POST /generate: SGLang's native endpoint (its `bench_serving --backend sglang` and scripts written for an SGLang
server call it). `text` or `input_ids` (one prompt, or a list answered as a list), `sampling_params` in SGLang's names,
`stream` as SGLang streams it: each event holds the whole text so far and `meta_info` with the token counts (a list's
prompts interleaved as their tokens come, each event with its prompt's `index`). What SGLang offers here that would
change the answer (log-probabilities, constrained decoding, LoRA, images) is refused by name."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from engine.sampling_params import SamplingParams
from engine.text import RequestOutput
from minisgl_cli.server.completions import final_output, merged, refusal, sse_data
from minisgl_cli.server.engine_client import EngineClient, Job, JobSpec
from minisgl_cli.server.errors import APIError
from minisgl_cli.server.protocol import refuse_unknown, refuse_unsupported, unsupported

router = APIRouter()

SGLANG_MAX_NEW_TOKENS = 128  # SGLang's default max_new_tokens
# SGLang's sampling_params names -> SamplingParams fields
SAMPLING_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "logit_bias": "logit_bias",
    "sampling_seed": "seed",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
}
# SGLang sampling fields that would change the answer and have no equivalent here: refused unless at their default
SAMPLING_REFUSED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "json_schema": (None,),
    "regex": (None,),
    "ebnf": (None,),
    "structural_tag": (None,),
    "no_stop_trim": (None, False),
    "custom_params": (None,),
}


class GenerateRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    REFUSED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "return_logprob": (None, False),
        "top_logprobs_num": (None, 0),
        "token_ids_logprob": (None,),
        "return_hidden_states": (None, False),
        "image_data": (None,),
        "video_data": (None,),
        "audio_data": (None,),
        "lora_path": (None,),
        "lora_id": (None,),  # SGLang's other name for the adapter
        "session_params": (None,),  # SGLang's sessions: the prompt continues a stored one
        "custom_logit_processor": (None,),
        "input_embeds": (None,),
        "positional_embed_overrides": (None,),
        "max_thinking_tokens": (None,),  # a reasoning model's thinking cut short
        # more in the answer: the MoE routing, the indexer's top-k, the entropy, an image's bytes
        "return_routed_experts": (None, False),
        "return_indexer_topk": (None, False),
        "return_entropy": (None, False),
        "return_bytes": (None, False),
        "require_reasoning": (None, False),  # a hybrid reasoning model made to think
        "background": (None, False),
        "multi_item_delimiter_indices": (None,),  # multi-item scoring
    }
    # SGLang's fields that change nothing a client gets here (options of refused log-probabilities and images,
    # routing, scheduling, caching, logging and tracing hints), accepted at any value; any other is a 400
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {
            "logprob_start_len",
            "return_text_in_logprobs",
            "use_audio_in_video",
            "modalities",
            "max_dynamic_patch",
            "min_dynamic_patch",
            "image_max_dynamic_patch",
            "video_max_dynamic_patch",
            "routed_experts_start_len",
            "log_metrics",
            "bootstrap_host",
            "bootstrap_port",
            "bootstrap_room",
            "bootstrap_pair_key",
            "decode_tp_size",
            "routed_dp_rank",
            "disagg_prefill_dp_rank",
            "data_parallel_rank",
            "conversation_id",
            "priority",
            "extra_key",
            "routing_key",
            "no_logs",
            "custom_labels",
            "external_trace_header",
            "received_time",
        }
    )

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool | None = False
    rid: str | list[str] | None = None  # the caller's ids: echoed in meta_info.id

    def prompts(self) -> list[str | list[int]]:
        if (self.text is None) == (self.input_ids is None):
            raise APIError(400, "give text or input_ids, one of the two", param="text")
        if self.text is not None:
            prompts: list[str | list[int]] = [self.text] if isinstance(self.text, str) else list(self.text)
        else:
            ids = self.input_ids or []
            prompts = list(ids) if ids and isinstance(ids[0], list) else [ids]
        if not prompts:  # an empty list: nothing to answer (an empty prompt is refused by the engine's check)
            raise APIError(400, f"{self.prompt_field} is an empty list", param=self.prompt_field)
        return prompts

    @property
    def prompt_field(self) -> str:
        return "text" if self.text is not None else "input_ids"

    @property
    def batch(self) -> bool:
        return isinstance(self.text, list) or bool(self.input_ids and isinstance(self.input_ids[0], list))


def _params(given: dict[str, Any], defaults: dict[str, Any], room: int) -> SamplingParams:
    for name, accepted in SAMPLING_REFUSED.items():
        if given.get(name) not in accepted:
            raise unsupported(f"sampling_params.{name}", given[name], accepted, param="sampling_params")
    unknown = sorted(set(given) - set(SAMPLING_NAMES) - set(SAMPLING_REFUSED))
    if unknown:
        why = f"sampling_params.{unknown[0]} is not a sampling parameter this server knows"
        raise APIError(400, why, param="sampling_params")
    kw = {SAMPLING_NAMES[k]: v for k, v in given.items() if k in SAMPLING_NAMES and v is not None}
    # SGLang's SamplingParams sets a greedy request's (temperature below 1e-6) top_k to 1, then verify() refuses a
    # top_k below 1 but -1 (all tokens): 0, which ours reads as all tokens, is refused unless the request is greedy
    temperature = kw.get("temperature", defaults.get("temperature"))
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and 0 <= temperature < 1e-6:
        kw["top_k"] = 1
    elif kw.get("top_k") == 0 and not isinstance(kw["top_k"], bool):
        why = "sampling_params.top_k must be -1 (all tokens) or at least 1 (got 0)"
        raise APIError(400, why, param="sampling_params")
    # SGLang's scheduler reads an explicit null max_new_tokens as no limit but the context's; left out, it is 128
    kw.setdefault("max_tokens", room if "max_new_tokens" in given else min(SGLANG_MAX_NEW_TOKENS, room))
    try:
        return SamplingParams(**{**defaults, **kw})
    except ValueError as e:  # SamplingParams names its field first: say it in SGLang's name
        ours, _, rest = str(e).partition(" ")
        theirs = next((k for k, v in SAMPLING_NAMES.items() if v == ours), ours)
        raise APIError(400, f"sampling_params.{theirs} {rest}", param="sampling_params") from e


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    client: EngineClient = request.app.state.client
    refuse_unsupported(body, body.REFUSED)
    refuse_unknown(body, body.REFUSED.keys() | body.IGNORED)
    prompts = body.prompts()
    plist = (
        body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params or {}] * len(prompts)
    )
    if len(plist) != len(prompts):
        raise APIError(400, f"{len(prompts)} prompts but {len(plist)} sampling_params", param="sampling_params")
    try:
        encoded = await asyncio.to_thread(lambda: [client.encode(p) for p in prompts])
    except ValueError as e:
        raise refusal(e, body.prompt_field) from e
    specs = [
        JobSpec(ids, _params(sp, client.sampling_defaults, client.limits.room(len(ids))))
        for ids, sp in zip(encoded, plist)
    ]
    limit = client.admission_limit
    if limit is not None and len(specs) > limit:
        raise APIError(400, f"{len(specs)} prompts at once, more than this server ever admits ({limit})", "text")
    try:
        jobs = client.start(request, specs)
    except Exception as e:
        if isinstance(e, APIError):
            raise
        raise refusal(e, body.prompt_field) from e
    rids: list[str | None]
    if isinstance(body.rid, str) and body.batch:  # SGLang's: one id given for a batch prefixes each prompt's own
        rids = [f"{body.rid}_{i}" for i in range(len(jobs))]
    else:
        rids = list(body.rid) if isinstance(body.rid, list) else [body.rid] * len(jobs)
    if len(rids) != len(jobs):
        for job in jobs:
            job.abort()
        raise APIError(400, f"{len(jobs)} prompts but {len(rids)} rids", param="rid")
    replies = [_Reply(job, rid or job.rid, body.input_ids is not None) for job, rid in zip(jobs, rids)]
    if body.stream:
        return StreamingResponse(
            _events(replies, body.batch), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        finals = [await r.final() for r in replies]
    finally:
        for job in jobs:
            if not job.finished:
                job.abort()
    return JSONResponse(finals if body.batch else finals[0])


class _Reply:
    def __init__(self, job: Job, rid: str, ids_in: bool) -> None:
        self.job, self.rid, self.ids_in = job, rid, ids_in
        self.prompt_field = "input_ids" if ids_in else "text"  # what a refusal names
        self.start = time.perf_counter()

    def body(self, out: RequestOutput) -> dict[str, Any]:
        """SGLang's answer: the text so far and meta_info (finish_reason null while it runs)."""
        reason: dict[str, Any] | None = None
        if out.finished:
            if out.finish_reason == "length":
                reason = {"type": "length", "length": len(out.token_ids)}
            elif out.finish_reason == "stop":
                reason = {"type": "stop", "matched": out.stop_reason}  # null for EOS (SGLang: the EOS id)
            else:
                reason = {"type": "abort", "message": out.error or out.finish_reason}
        meta = {
            "id": self.rid,
            "finish_reason": reason,
            "prompt_tokens": len(self.job.prompt_ids),
            "completion_tokens": len(out.token_ids),
            "cached_tokens": min(out.cache_hit_tokens, len(self.job.prompt_ids)),
            "e2e_latency": time.perf_counter() - self.start,
        }
        body: dict[str, Any] = {"text": out.text, "meta_info": meta}
        if self.ids_in:  # SGLang gives the output ids where the prompt came as ids
            body["output_ids"] = list(out.token_ids)
        return body

    async def final(self) -> dict[str, Any]:
        return self.body(await final_output(self.job, self.prompt_field))

    async def events(self, index: int | None) -> AsyncIterator[str]:
        """This prompt's events; `index`: its place in a list of prompts (SGLang's events of a list carry it)."""
        where = {} if index is None else {"index": index}
        try:
            async for batch in self.job.batches():
                yield sse_data({**self.body(batch[-1]), **where})
        except Exception as e:  # the engine refused it or went away mid-answer: the list's other prompts go on
            yield sse_data({**refusal(e, self.prompt_field).body(), **where})
        finally:
            if not self.job.finished:
                self.job.abort()


async def _events(replies: list[_Reply], batch: bool) -> AsyncIterator[str]:
    """The prompts' events as they come, then one [DONE]. Leaving early (the client gone) aborts those still running."""
    async for _, event in merged([r.events(i if batch else None) for i, r in enumerate(replies)]):
        yield event
    yield "data: [DONE]\n\n"
