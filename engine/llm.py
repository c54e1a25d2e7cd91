"""The one API every front end uses: text in, streamed text out, metrics on the side."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any, cast

from engine.config import EngineConfig
from engine.engine import Engine
from engine.gc_heap import paused_collector
from engine.loader import Progress
from engine.metrics import EngineMetrics
from engine.request import Req
from engine.sampling_params import MAX_N, SamplingParams
from engine.text import ChatPrompt, Prefix, Prompt, RequestOutput, TextState, encode_prompt, prompt_text
from engine.tokenizer import Message, sampling_defaults

__all__ = ["LLM", "Prompt", "RequestOutput"]

# generate() runs with Python's cyclic collector paused: on the H100 offline workload a full collection stalled
# 4 of 6 runs for 137-201 ms (benchmarks/gc_offline_ab.py); a switch only for that A/B.
PAUSE_COLLECTOR = True
# A running request's outputs hold Prefix views of its token lists instead of copies (benchmarks/output_snapshot_ab.py:
# LLM._output 2.0 -> 1.0 ms per step at 64 requests of ~1,000 tokens so far, CPU); a switch only for that A/B.
SNAPSHOT_VIEWS = True
# generate() adds token-id prompts as its steps need them: before its first step, those up to one step's token budget
# and request count, and before step k + 1, those up to k + 2 steps' (a step takes at most one of each, so the waiting
# queue holds what it would have taken with every prompt added: the same steps), each few while the GPU runs the steps
# queued before. The offline workload's 256 adds took ~21 ms before its first step on a CPU machine, time the GPU sat
# idle (on an H200 the runs spent 16-44 ms less outside the GPU's steps); a switch only for that A/B
# (benchmarks/step_profile.py's `adds-first`).
ADD_AS_NEEDED = True


class LLM:
    def __init__(
        self, config: EngineConfig | str | None = None, progress: Progress | None = None, **overrides: Any
    ) -> None:
        self.config, self.generation_config = engine_config(config, overrides)
        self.engine = Engine(self.config, progress)
        self.tokenizer = self.engine.loaded.tokenizer
        self._text: dict[str, TextState] = {}
        # generate() and stream() calls may run at once (threads, or one nested in another's callback): whichever
        # steps the engine posts each output to the inbox of the call that owns its request. Before, a call only
        # saw the outputs of the steps it ran itself, and waited forever for one another call's step had taken.
        self._lock = threading.RLock()  # held for each step, add and abort
        self._inbox: dict[str, list[RequestOutput]] = {}  # rid -> the owning call's inbox
        self._defaults: dict[str, Any] | None = None  # read at the first call without params, as vLLM's LLM does

    # ---- requests -------------------------------------------------------------------------------------
    def get_default_sampling_params(self) -> SamplingParams:
        """What a request given no SamplingParams runs with: the API's defaults, but the sampling fields and
        max_new_tokens (as max_tokens) of the model's generation_config.json (an HF directory's) take its values, as
        in vLLM's LLM and `minisgl serve`. Without this a model's recommended temperature / top_p / top_k were
        ignored: sampled at temperature 1. Read at the first call, not at the start: front ends that always pass
        params (serve's --generation-config none, chat, bench-offline) must not fail on a file they never use."""
        if self._defaults is None:
            self._defaults = sampling_defaults(self.config.model) if self.generation_config == "auto" else {}
        return SamplingParams(**self._defaults)

    def params_for(self, prompt_ids: list[int], params: SamplingParams | None) -> SamplingParams:
        """What a request of these prompt ids runs with: `params`, or given none the defaults, their max_tokens
        within what the context leaves after the prompt. vLLM's engine ends such a request at the context's end;
        here a max_tokens past it is refused, and the caller never asked for that one."""
        if params is not None:
            return params
        defaults = self.get_default_sampling_params()
        room = self.engine.limits.room(len(prompt_ids))
        defaults.max_tokens = room if defaults.max_tokens is None else min(defaults.max_tokens, room)
        return defaults

    def get_tokenizer(self) -> Any:
        """vLLM's: the model's Hugging Face tokenizer (apply_chat_template, decode, ...); a dummy model's byte
        tokenizer, which has no Hugging Face one, is this engine's own."""
        return self.tokenizer if self.tokenizer.hf is None else self.tokenizer.hf

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, rid: str | None = None) -> str:
        return self._add(prompt, params, rid, None)

    def _add(
        self, prompt: Prompt, params: SamplingParams | None, rid: str | None, box: list[RequestOutput] | None
    ) -> str:
        """add_request; with `box`, its outputs go there from the first step on, whoever runs it."""
        ids = self.encode(prompt)
        params = self.params_for(ids, params)
        with self._lock:
            req = self.engine.add_request(ids, params, rid)
            st = self._text[req.rid] = TextState.create(self.tokenizer, ids, req.params)  # its own copy, checked
            st.prompt = prompt_text(prompt)
            if box is not None:
                self._inbox[req.rid] = box
        return req.rid

    def abort(self, rid: str) -> None:
        with self._lock:
            self.engine.abort(rid)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> list[RequestOutput]:
        with self._lock:
            outs = self._outputs(self.engine.step(), running=True)
            self._post(outs)
        return outs

    def _post(self, outs: list[RequestOutput]) -> None:
        for out in outs:
            box = self._inbox.get(out.rid)
            if box is not None:
                box.append(out)

    def _receive(self, box: list[RequestOutput], running: bool) -> tuple[list[RequestOutput], tuple[int, int] | None]:
        """What `box` holds, stepping the engine first if it is empty; and (requests, tokens) of that step, if any."""
        with self._lock:
            counts = None
            if not box:
                tokens = self.engine.stats["generation_tokens"]
                reqs = self.engine.step()
                self._post(self._outputs(reqs, running))
                counts = (len(reqs), self.engine.stats["generation_tokens"] - tokens)
                if not box and not self.engine.has_work():
                    raise RuntimeError("the engine is idle but requests of this call never finished")
            got = box[:]
            box.clear()
        return got, counts

    def _outputs(self, reqs: list[Req], running: bool) -> list[RequestOutput]:
        """The outputs of the requests a step changed. running=False: a running request's output is built only where
        its text must be followed token by token (detokenize: stop strings, text faults); the others get theirs when
        they finish, with all their tokens (building 256 outputs took ~1.2 ms of host time per step, CPU)."""
        return [
            o for r in reqs if (running or r.finished or r.params.detokenize) and (o := self._output(r)) is not None
        ]

    def _output(self, req: Req) -> RequestOutput | None:
        st = self._text.get(req.rid)
        if st is None:
            return None  # already reported finished (e.g. a stop string ended it a step earlier)
        new_ids = req.output_ids[st.n_ids :]
        delta, reason, error = st.advance(new_ids, req.finish_reason, req.error)
        if reason and not req.finished:
            self.engine.abort(req.rid, reason, error)  # a stop string or a text fault: free its pages next step
        finished = reason is not None
        if finished:
            del self._text[req.rid]
        # A running request's output holds Prefix views (the lists only grow); the final one copies them once.
        snap: Callable[[list[Any]], Sequence[Any]] = list if finished or not SNAPSHOT_VIEWS else Prefix
        return RequestOutput(
            req.rid,
            req.prompt_ids,
            snap(req.output_ids),
            st.text[: st.emitted],
            delta,
            new_ids,
            finished,
            reason,
            error,
            req.cache_hit_tokens,
            req.arrival,
            req.first_token_time,
            snap(req.token_times),
            snap(req.logprobs) if req.params.logprobs is not None else None,
            snap(req.prompt_logprobs) if req.params.prompt_logprobs is not None else None,
            st.stop_reason,
            st.prompt,
            self.tokenizer.token_texts if req.params.detokenize else None,
        )

    # ---- conveniences -------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,  # vLLM's order: generate(prompts, sampling_params, use_tqdm)
        *,
        lora_request: None = None,
        priority: int | None = None,
        on_output: Callable[[RequestOutput], object] | None = None,
        on_step: Callable[[list[RequestOutput]], object] | None = None,
        on_progress: Callable[[int, int], object] | None = None,
    ) -> list[RequestOutput]:
        """Run a batch to completion; outputs in prompt order. `prompts` is a list of prompts, or one prompt (a
        string, a token-id list, a conversation), which gives a list of one output. on_step(outputs) sees each
        step's outputs at once; on_progress(requests, tokens) only counts them (how many requests the step changed,
        how many tokens it produced), so without on_step and on_output no output is built for a running request that
        needs no text. use_tqdm (vLLM's name): a progress bar of the finished requests on stderr where it is a
        terminal. Token-id prompts are added as the steps need them, while the GPU runs the steps before (ADD_AS_NEEDED;
        the steps are the same).
        If the call fails (a bad prompt, a callback raising, KeyboardInterrupt), the requests it added are
        withdrawn: none runs on, none holds KV pages. Calls may overlap (threads, or one inside another's callback or
        stream loop): the engine steps for all of them, and each call sees the outputs of its own requests only."""
        # a string, token ids or one conversation: a batch of one
        batch = [cast(Prompt, prompts)] if _one_prompt(prompts) else cast(Sequence[Prompt], prompts)
        if not isinstance(use_tqdm, bool) and not callable(use_tqdm):
            raise TypeError(f"use_tqdm must be True, False or a tqdm factory (got {type(use_tqdm).__name__})")
        # vLLM's tqdm factory draws its own bar; here it means a bar (ours), as True does: no result depends on it
        _no_lora_no_priority(lora_request, priority, "generate")
        params = sampling_params
        plist: list[SamplingParams | None]
        if params is None or isinstance(params, SamplingParams):
            plist = [params] * len(batch)  # None: each prompt's defaults (params_for)
        elif isinstance(params, Sequence) and not isinstance(params, (str, bytes)):  # any sequence, not only a list
            plist = list(params)
        else:  # a dict of fields (as an OpenAI body has them) was iterated as its keys
            hint = ": SamplingParams(**fields) takes a dict" if isinstance(params, dict) else ""
            raise TypeError(
                "sampling_params must be a SamplingParams, a list of them (one per prompt) or None "
                f"(got {type(params).__name__}{hint})"
            )
        if len(plist) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(plist)} sampling params")
        final: dict[str, RequestOutput] = {}
        # The pause covers the adds too: a collection due from the previous run's objects hit them (171 ms once).
        with paused_collector() if PAUSE_COLLECTOR else nullcontext():
            rids: list[str] = []
            n_choices: list[int] = []  # each prompt's number of choices (its requests, in rids in order)
            box: list[RequestOutput] = []
            bar = None
            added, taken = 0, (0, 0)  # prompts added so far, and their tokens and requests (as needed)

            def add(upto: int) -> None:
                nonlocal added, taken
                for p, sp in zip(batch[added:upto], plist[added:upto]):
                    choices = choice_requests(sp)
                    rids.extend(self._add(p, c, None, box) for c in choices)
                    n_choices.append(len(choices))
                    size = _size(p, sp) or (0, 0)
                    added, taken = added + 1, (taken[0] + size[0], taken[1] + size[1])

            steps = 0  # steps this call has run (as needed: the first step's prompts, then two steps' ahead)
            as_needed = ADD_AS_NEEDED and not self.engine.has_work()  # else its steps take other calls' requests

            def needed(steps: int) -> int:  # prompts that `steps` steps could take, counted on from those added
                return self._prompts_for(batch, plist, steps, added, taken) if as_needed else len(batch)

            try:
                add(needed(1))  # the first step's own: the next steps' are added while it runs
                running = on_step is not None or on_output is not None
                if use_tqdm and sys.stderr.isatty():
                    bar = ProgressBar(sum(_choices(sp) for sp in plist))
                while added < len(batch) or len(final) < len(rids):
                    outs, counts = self._receive(box, running)
                    steps += counts is not None
                    if added < len(batch):
                        add(needed(steps + 2))
                    if on_progress is not None and counts is not None:
                        on_progress(*counts)
                    if on_step is not None:
                        on_step(outs)
                    for out in outs:
                        if on_output is not None:
                            on_output(out)
                        if out.finished:
                            final[out.rid] = out
                            if bar is not None:
                                bar.add(out)
            except BaseException:
                # A bad prompt, a callback or the step raised, or the caller interrupted: what this call added and
                # has not finished must not run on in a later call, nor hold its pages.
                self._withdraw([r for r in rids if r not in final])
                raise
            finally:
                for rid in rids:
                    self._inbox.pop(rid, None)
                if bar is not None:
                    bar.close()
            self._drain(rids)  # a stop string ended some: their pages go back now
        outs, i = [], 0
        for n in n_choices:  # each prompt's first choice, holding all of its choices (vLLM's outputs) where n > 1
            first = final[rids[i]]
            first.other_choices = [final[r] for r in rids[i + 1 : i + n]]
            outs.append(first)
            i += n
        return outs

    def chat(
        self,
        messages: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        lora_request: None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation or a list of them, laid out by the model's chat template (or the Jinja
        `chat_template` given) with the assistant's turn opened (or, with continue_final_message, the last message
        left open to be continued); generate() with the conversations, plus the template's own variables (Qwen3's
        enable_thinking=False). vLLM's keywords at the values this engine has (no LoRA; no tools: they would change
        the answer; content parts read as text: `auto` or `string`) are taken, any other is refused."""
        _no_lora_no_priority(lora_request, None, "chat")
        if tools:
            raise ValueError("tools are not supported (tool calling would change the answer): leave tools out")
        if chat_template_content_format not in ("auto", "string"):
            why = "content parts are read as their text here ('auto' or 'string')"
            raise ValueError(f"chat_template_content_format {chat_template_content_format!r}: {why}")
        convs = [messages] if _one_prompt(messages) else messages
        kw = dict(chat_template_kwargs or {})
        # vLLM lays its call's switches out first and chat_template_kwargs over them: they may set these two
        add_generation_prompt = kw.pop("add_generation_prompt", add_generation_prompt)
        continue_final_message = kw.pop("continue_final_message", continue_final_message)
        layout = (kw, add_generation_prompt, continue_final_message, chat_template)
        ids = [ChatPrompt(cast(list[Message], c), *layout).encode(self.tokenizer) for c in convs]
        outs = self.generate(ids, sampling_params, use_tqdm=use_tqdm)
        for out, p in zip(outs, ids):  # the conversation as the template laid it out (vLLM's chat outputs' prompt)
            out.prompt = self.tokenizer.decode(p, skip_special_tokens=False)
        return outs

    def _prompts_for(
        self,
        batch: Sequence[Prompt],
        plist: Sequence[SamplingParams | None],
        steps: int,
        start: int = 0,
        taken: tuple[int, int] = (0, 0),
    ) -> int:
        """How many of `batch`'s prompts `steps` steps could take (ADD_AS_NEEDED): token-id prompts up to `steps`
        times the step's token budget and request count (_size); all of them if one before that is text (its length is
        known only once encoded). Counted on from prompt `start`, the prompts before it taking `taken` (tokens,
        requests): generate() scans each prompt once or twice, not once per step."""
        cfg, (tokens, reqs) = self.engine.config, taken
        for i in range(start, len(batch)):
            if tokens >= steps * cfg.max_batch_tokens or reqs >= steps * cfg.max_running_requests:
                return i
            size = _size(batch[i], plist[i])
            if size is None:
                return len(batch)
            tokens, reqs = tokens + size[0], reqs + size[1]
        return len(batch)

    def _withdraw(self, rids: list[str]) -> None:
        for rid in rids:
            self.abort(rid)
        self._drain(rids)

    def _drain(self, rids: list[str]) -> None:
        """Step until none of `rids` is in the engine (ended ones return their pages at the next step)."""
        while True:
            with self._lock:
                if self.engine.failed or not (self.engine.has_work() and any(r in self.engine.reqs for r in rids)):
                    return  # (a failed engine's pages no longer matter: it runs no more steps)
                self.step()

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Drive the engine until this request finishes, yielding its outputs (other requests progress too)."""
        box: list[RequestOutput] = []
        rid = self._add(prompt, params, None, box)
        done = False
        try:
            while not done:
                for out in self._receive(box, running=True)[0]:
                    done = out.finished
                    yield out
        finally:
            self._inbox.pop(rid, None)
            if not done:
                self.abort(rid)
            self._drain([rid])  # also when a stop string ended it

    def reset_prefix_cache(self) -> bool:
        """vLLM's: the prefix cache's pages that no request holds are dropped now (a benchmark's next run starts
        cold; running requests keep theirs). True once done, False for an engine that has stopped."""
        with self._lock:
            if self.engine.failed is not None:
                return False
            self.engine.clear_cache()
            self.step()  # applied at a step's start: this one (any running request takes its step too)
        return True

    def shutdown(self) -> None:
        """Ends the engine (and, under TP, its follower ranks): requests still running end as aborted, later ones
        are refused."""
        with self._lock:  # not inside another thread's step
            self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics()

    def describe(self) -> dict[str, str]:
        e = self.engine
        return {
            "model": e.model_cfg.name or str(self.config.model),
            "device": str(e.device),
            "dtype": str(e.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(e.kv_dtype).removeprefix("torch."),
            "attention": e.backend_name,
            "tp": str(self.config.tp),
        }


# vLLM's LLM(...) keywords that are EngineConfig fields under another name (code written for vllm.LLM passes them)
VLLM_NAMES = {
    "tensor_parallel_size": "tp",
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "max_batch_tokens",
    "enable_prefix_caching": "radix_cache",
    "block_size": "page_size",
}
VLLM_DTYPES = {"half": "float16", "float": "float32"}  # vLLM's other names of ours (its _STR_DTYPE_TO_TORCH_DTYPE)
# vLLM's keywords that cannot change what runs here, whatever their value: taken and dropped
VLLM_MOOT = (
    "trust_remote_code",  # no model code is ever loaded from a model's files here
    "disable_log_stats",  # vLLM's periodic stats lines in its log; llm.metrics() reads them here
    "swap_space",  # CPU room for preempted requests' KV in vLLM's V0: here a preempted request is recomputed
    "disable_custom_all_reduce",  # tensor-parallel sums are NCCL's (torch.distributed) here, the only way
)
# vLLM's keywords with no field here: the values that mean what this engine does are taken (None is vLLM's own default
# for most); any other would change what runs or need a download, so it is refused, naming what to use instead
LOCAL = "a local model directory or .gguf file (nothing is downloaded here)"
POOLING = "a generative model: there are no pooling runners (embed, classify, score, reward) here"
VLLM_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "gpu_memory_utilization": ((), "kv_cache_gb (the KV pool's size) or memory_fraction (of free GPU memory, for KV)"),
    "tokenizer": ((None,), "a model directory holding its tokenizer"),
    "quantization": ((None,), "a GGUF file (its quantized blocks run as they are on a CPU)"),
    "tokenizer_mode": ((None, "auto", "hf"), "'auto' or 'hf': the model's Hugging Face tokenizer (fast if it has one)"),
    "task": ((None, "auto", "generate"), POOLING),
    "runner": ((None, "auto", "generate"), POOLING),
    "cpu_offload_gb": ((None, 0), "device='cpu', or tp= over GPUs: no weights are offloaded to the CPU here"),
    "download_dir": ((None,), LOCAL),
    "hf_token": ((None, False), LOCAL),
    "revision": ((None,), f"{LOCAL}, of that revision"),
    "enable_chunked_prefill": ((None, True), "max_batch_tokens (prompts are always prefilled in chunks here)"),
    "pipeline_parallel_size": ((None, 1), "tp= over the GPUs (no pipeline parallelism here)"),
}


def _no_lora_no_priority(lora_request: object, priority: object, method: str) -> None:
    """vLLM's generate()/chat() keywords at the values that mean this engine's way (as AsyncLLM.generate takes them)."""
    if lora_request is not None:
        raise TypeError(f"{method}() takes lora_request=None only: there are no LoRA adapters here")
    if priority not in (None, 0):
        raise TypeError(f"{method}() takes priority=0 (or None) only: requests are served in arrival order here")


def engine_config(
    config: EngineConfig | str | None, overrides: dict[str, Any], who: str = "LLM()"
) -> tuple[EngineConfig, str]:
    """LLM()'s arguments (vLLM's names or ours; AsyncEngineArgs' too, `who` naming it in errors) as the EngineConfig
    they ask for and the generation_config setting ("auto" or "vllm"). A keyword neither vLLM's nor ours is a
    TypeError."""
    if isinstance(config, str):  # vLLM's LLM("org/model"): a bare TypeError from dataclasses.replace before
        if "model" in overrides:
            raise TypeError(f"{who} got the model twice: as its first argument and as model=")
        config, overrides = None, {"model": config, **overrides}
    if config is not None and not isinstance(config, EngineConfig):
        raise TypeError(f"{who} takes an EngineConfig or a model name first (got {type(config).__name__})")
    overrides = dict(overrides)
    # vLLM's: "auto" reads the sampling defaults of the model's generation_config.json, "vllm" keeps the API's
    generation_config = overrides.pop("generation_config", "auto")
    if generation_config not in ("auto", "vllm"):
        raise ValueError(
            "generation_config must be 'auto' (the model's generation_config.json) or 'vllm' (the API's sampling "
            f"defaults); got {generation_config!r}"
        )
    overrides = _engine_names(overrides, who)
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    for name in overrides:  # the TypeError named EngineConfig.__init__, which the caller never called
        if name not in known:
            raise TypeError(f"{who} got an unexpected keyword argument {name!r} (neither vLLM's nor this engine's)")
    # beside a config, the keywords change it (they were dropped without a word: num_pages=8 ran with the config's)
    fields = EngineConfig(**overrides) if config is None else dataclasses.replace(config, **overrides)
    return fields, generation_config


def _engine_names(kw: dict[str, Any], who: str = "LLM()") -> dict[str, Any]:
    """LLM()'s keywords as EngineConfig fields: vLLM's names taken under ours, enforce_eager as no CUDA graphs, vLLM's
    dtype names as ours, the moot ones dropped, the others of vLLM's at the values that mean this engine's way."""
    out = {k: v for k, v in kw.items() if k not in VLLM_MOOT}
    for name in (*VLLM_NAMES, "max_logprobs"):  # None: the engine decides (vLLM's default for these, argparse's)
        if name in out and out[name] is None:
            del out[name]
    for theirs, ours in VLLM_NAMES.items():
        if theirs in out:
            if ours in out:
                raise TypeError(f"{who} got {theirs}= and {ours}= (vLLM's name for it): give one")
            out[ours] = out.pop(theirs)
    if out.pop("enforce_eager", False):
        out.update(cuda_graph_max_bs=0, piecewise_graph_tokens=0)
    if type(out.get("dtype")).__module__ == "torch":  # vLLM takes a torch.dtype too
        out["dtype"] = str(out["dtype"]).removeprefix("torch.")
    if isinstance(out.get("dtype"), str):
        out["dtype"] = VLLM_DTYPES.get(out["dtype"], out["dtype"])
    for name, (taken, instead) in VLLM_ONLY.items():
        if name not in out:
            continue
        value = out.pop(name)
        if value not in taken:
            raise TypeError(f"{who} has no {name}={value!r:.60} (vLLM's): use {instead}")
    return out


class ProgressBar:
    """generate()'s bar (vLLM's use_tqdm): requests finished, and the output tokens/s they make, on stderr."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("Processed prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[speed]}"),
            console=Console(stderr=True),
            # stdout stays the caller's (tqdm's way, vLLM's bar): rich's default sent what a callback or another
            # thread printed meanwhile to the bar's console, stderr, so `script > out.txt` lost it to the terminal
            redirect_stdout=False,
        )
        self.task = self.progress.add_task("", total=total, speed="")
        self.start, self.tokens = time.perf_counter(), 0
        self.progress.start()

    def add(self, finished: RequestOutput) -> None:
        self.tokens += len(finished.token_ids)
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        self.progress.update(self.task, advance=1, speed=f"output {rate:,.0f} tok/s")

    def close(self) -> None:
        self.progress.stop()


def _choices(params: SamplingParams | None) -> int:
    """The requests a prompt's params make (choice_requests), for a progress bar's total; a bad n counts as one (its
    add refuses it)."""
    n = getattr(params, "n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_N else 1


def _size(prompt: Prompt, params: SamplingParams | None) -> tuple[int, int] | None:
    """The prompt tokens and requests a token-id prompt brings a step (a prompt of n choices n times); None for text,
    whose length is known only once encoded."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else prompt
    if not isinstance(ids, list):
        return None
    n = _choices(params)
    return n * len(ids), n


def choice_requests(params: SamplingParams | None) -> list[SamplingParams | None]:
    """A prompt's n choices as requests of one choice each (SamplingParams.choice: choice j seeded seed + j); None
    (the defaults) is one choice."""
    if not isinstance(params, SamplingParams) or params.n == 1:
        return [params]  # (anything but None is refused by the engine's check, naming it)
    # n assigned after construction was never checked: 0 added no request, so the next prompt's output was returned
    # for this one; 200 ran past MAX_N; 2.5 was a bare TypeError
    params = params.clone()
    params.validate()
    return [params.choice(j) for j in range(params.n)]


def _one_prompt(prompts: object) -> bool:
    """A single prompt where generate() takes a list of them: a string (iterated, each character became a prompt of
    its own), or a non-empty list of token ids or of chat messages (a list of prompts holds no ints, and its dicts
    are vLLM's prompt dicts, {"prompt": ...} or {"prompt_token_ids": ...}, where a chat message has neither key)."""
    if isinstance(prompts, (str, dict)):  # a dict is one prompt ({"prompt": ...}) or refused by encode_prompt
        return True
    if not isinstance(prompts, list) or not prompts:
        return False
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompts) or all(
        isinstance(m, dict) and "prompt" not in m and "prompt_token_ids" not in m for m in prompts
    )
