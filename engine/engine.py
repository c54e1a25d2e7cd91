"""The engine core: requests in token ids, one step() at a time. No text here (see engine.llm)."""

from __future__ import annotations

import gc
import random
import resource
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.distributed import (
    TP,
    broadcast_objects,
    check_same_settings,
    ctrl_c_after_step,
    init_tp,
    leave_failed_group,
    leave_failed_start,
    leave_tp_group,
    refused_on_every_rank,
    start_checkpoint,
)
from engine.gc_heap import collect_if_idle, frozen_heap
from engine.limits import RequestLimits
from engine.loader import Progress, load_model
from engine.metrics import EngineMetrics
from engine.model_config import ModelConfig
from engine.request import Req, Status
from engine.runner import ModelRunner, StepOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Batch, Scheduler
from engine.step_log import StepRecord
from kvcache.manager import CacheManager
from kvcache.pool import KVPool


class Engine:
    def __init__(self, config: EngineConfig, progress: Progress | None = None):
        try:
            self._start(config, progress)
        except BaseException as e:
            in_group = TP.store is not None  # a failure every rank made alike has left the group already
            if in_group and "runner" in self.__dict__:
                self.runner.release_graphs()  # before the group goes (_leave_group)
            # The start's frames in the traceback hold the weights and the KV pool (85% of free GPU memory) for as
            # long as the error lives: a REPL's last error, a test's pytest.raises. Another engine started in the same
            # process found no memory for its KV cache. Its locals go now (the executing frames keep theirs: this one's
            # only `self`, emptied here).
            self.__dict__.clear()
            traceback.clear_frames(e.__traceback__)
            first = leave_failed_start(e) if in_group else None
            if first is not None:
                raise first from e
            raise

    def _start(self, config: EngineConfig, progress: Progress | None) -> None:
        self.config = config
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device)
        self.kv_dtype = config.torch_kv_dtype(self.dtype)
        init_tp(config.tp, self.device.type)
        if TP.size > 1:
            check_same_settings(config)
        if self.device.type == "cuda" and TP.size > 1:
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.manual_seed(config.seed)
        # the noise keys of unseeded requests (the GPU sampler's): as torch's generator on a CPU, from --seed, so a run
        # of unseeded requests repeats in a new process (they were Python's unseeded random: every run differed)
        self._noise_keys = random.Random(config.seed)
        if self.device.type == "cuda":
            # An engine dropped without shutdown() in a reference cycle holds its KV pool until a collection. Collected
            # only at the budget, after this engine's load, half of it stayed reserved by torch's allocator through
            # empty_cache() (32.7 GiB on an H200, twice in the GPU suite; why was not found): so before the load.
            gc.collect()
            torch.cuda.empty_cache()
        self.loaded = load_model(config.model, self.device, self.dtype, progress, with_tokenizer=TP.rank == 0)
        mc = self.loaded.cfg
        self.model_cfg = mc
        if config.max_model_len is not None and config.max_model_len > mc.max_position_embeddings:
            too_long = ValueError(  # as vLLM: a longer context than the model was trained on is refused, not capped
                f"max_model_len {config.max_model_len} exceeds the model's context length "
                f"(max_position_embeddings {mc.max_position_embeddings})"
            )
            raise refused_on_every_rank(too_long)
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        num_pages = self._num_pages(mc)
        self.pool = self._create_pool(mc, num_pages)
        self.cache = CacheManager(num_pages, config.page_size, config.radix_cache)
        start_checkpoint()  # the pools are there on every rank: the runner's warm-up and graphs run collectives
        # -1: the whole vocabulary, as vLLM's; a larger setting allows no more than it (top-k of the vocabulary)
        max_logprobs = mc.vocab_size if config.max_logprobs == -1 else min(config.max_logprobs, mc.vocab_size)
        self.limits = RequestLimits(mc.vocab_size, self.max_model_len, num_pages * config.page_size, max_logprobs)
        self.scheduler = Scheduler(
            self.cache,
            config.max_running_requests,
            config.max_batch_tokens,
            config.mixed_batch,
            config.max_running_tokens,
            config.mixed_prefill_tokens,
        )
        t0 = time.perf_counter()
        self.runner = ModelRunner(
            self.loaded.model,
            self.pool,
            config.attention_backend,
            self.device,
            config.max_running_requests,
            config.cuda_graph_max_bs,
            scratch_page=num_pages,
            max_request_tokens=self.limits.max_request_tokens,
            piecewise_max_tokens=min(config.piecewise_graph_tokens, config.max_batch_tokens),
            cpu_ops=self.loaded.cpu_ops,
        )
        start_checkpoint()  # every rank started: none returns to run a step that a failed rank would never join
        self.startup_seconds = {"load": self.loaded.load_seconds, "runner": time.perf_counter() - t0}
        self.overlap = config.use_overlap(self.device)
        self.reqs: dict[str, Req] = {}
        self._commands: list[tuple[Any, ...]] = []
        self._inflight: tuple[Batch, StepOutput] | None = None
        self._counter = 0
        self._finished_now: list[Req] = []
        self._shutdown = False
        # Why a step raised (TP=1; under TP the rank leaves the group instead). A step cut short leaves the requests
        # it scheduled advanced with no token, so no later step can be trusted: every later step and request is
        # refused with this reason, where other callers' requests would otherwise wait forever.
        self.failed: str | None = None
        self.timing = dict(schedule=0.0, launch=0.0, process=0.0)
        self.step_records: list[StepRecord] | None = None  # set to [] to record every step
        self._alloc_counts = (0, 0)  # the allocator's device allocations and retries at the last record (CUDA)
        self._switches = (0, 0)  # the engine thread's context switches at the last record
        self._waited = self._processed_at = 0.0
        self.stats = dict(prompt_tokens=0, cache_hit_tokens=0, generation_tokens=0, finished=0, steps=0, mixed_steps=0)

    @property
    def backend_name(self) -> str:
        return type(self.runner.backend).__name__.removesuffix("Backend").lower()

    def _num_pages(self, mc: ModelConfig) -> int:
        """The pages the allocator hands out: --num-pages, or what the memory budget holds; one count on every rank."""
        num_pages = self.config.num_pages or self._pages_from_budget(mc)
        if TP.size > 1:  # all ranks must agree on the pool size (free memory may differ slightly)
            t = torch.tensor([num_pages])  # gloo: a rank that left ends it at once (NCCL may wait for its timeout)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=TP.cpu_group)
            num_pages = int(t.item())
        if num_pages < 2:  # the ranks' smallest count: every rank is here
            raise refused_on_every_rank(
                ValueError("not enough memory for a KV cache: raise --kv-cache-gb / --memory-fraction")
            )
        return num_pages

    def _create_pool(self, mc: ModelConfig, num_pages: int) -> KVPool:
        """The KV pool, with one page more than the allocator hands out: a scratch page for padded CUDA-graph rows.
        A pool this machine cannot hold (--kv-cache-gb 100000, --num-pages 10000000000) is refused naming the flags:
        it was numpy's MemoryError (or torch's OutOfMemoryError) with a traceback."""
        try:
            return KVPool.create(
                mc.num_layers,
                num_pages + 1,
                self.config.page_size,
                mc.num_kv_heads // TP.size,
                mc.head_dim,
                self.dtype,
                self.device,
                self.kv_dtype,
            )
        except (MemoryError, torch.OutOfMemoryError) as e:
            per_token = mc.kv_bytes_per_token(self.kv_dtype.itemsize, TP.size)
            gib = (num_pages + 1) * self.config.page_size * per_token / 2**30
            raise ValueError(
                f"not enough memory for a KV cache of {num_pages:,} pages ({gib:,.1f} GiB on {self.device}): "
                "lower --kv-cache-gb / --num-pages"
            ) from e

    def _pages_from_budget(self, mc: ModelConfig) -> int:
        per_token = mc.kv_bytes_per_token(self.kv_dtype.itemsize, TP.size)
        if self.config.kv_cache_gb is not None:
            budget = int(self.config.kv_cache_gb * 2**30)
        elif self.device.type == "cuda":
            torch.cuda.empty_cache()  # the load's freed temporaries (_start collected what earlier engines left)
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = 2 * 2**30 + self.config.max_batch_tokens * mc.vocab_size * 4  # activations, logits
            budget = int(free - (1 - self.config.memory_fraction) * total) - reserve
        else:
            budget = 2**30
        return KVPool.pages_for_budget(budget, per_token, self.config.page_size)

    # ---- requests ---------------------------------------------------------------------------------
    def new_rid(self) -> str:
        """A request id no running request has: a caller's own rid may be one of the form this makes ("req-1"), and
        the generated one collided with it ("already in use")."""
        self._counter += 1
        while f"req-{self._counter}" in self.reqs:
            self._counter += 1
        return f"req-{self._counter}"

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """The request's own checked copy of `params` (RequestLimits.check)."""
        return self.limits.check(prompt_ids, params)

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid: str | None = None,
        eos_ids: frozenset[int] | None = None,
    ) -> Req:
        if TP.rank != 0:  # its commands would never be broadcast: rank 0's requests ran with this rank's prompt ids
            raise RuntimeError(
                f"rank {TP.rank} of a tensor-parallel group takes no requests: submit them on rank 0 only; ranks > 0 "
                "follow its steps (engine.tp_follower.run_tp_follower(llm))"
            )
        if self._shutdown:
            raise RuntimeError("the engine has been shut down; it takes no more requests")
        if self.failed is not None:
            raise RuntimeError(f"the engine stopped: an earlier step failed ({self.failed}); it takes no more requests")
        params = self.validate(prompt_ids, params)
        rid = rid or self.new_rid()
        if rid in self.reqs:
            raise ValueError(f"request id {rid!r} is already in use")
        eos = eos_ids if eos_ids is not None else self.loaded.tokenizer.eos_ids
        req = Req(rid, list(prompt_ids), params, eos, noise_key=self._noise_keys.getrandbits(64))
        self.reqs[rid] = req
        self._commands.append(("add", rid, req.prompt_ids, params, req.eos_ids))
        return req

    def abort(self, rid: str, reason: str = "abort", error: str | None = None) -> None:
        """Ends a request at the next step (on every rank), returning its pages. A request that has already finished
        (or was never added) is left alone now: the command is resolved by rid when it is applied, and a request added
        meanwhile under the same rid (the caller's own ids) was ended in its place, while a second copy of it ran on
        unseen."""
        if rid not in self.reqs:
            return
        self._commands.append(("finish", rid, reason, error))

    def clear_cache(self) -> None:
        """Drop the radix cache's unused pages at the next step, on every rank (their trees must stay equal)."""
        self._commands.append(("evict_all",))

    def _sync_commands(self) -> list[tuple[Any, ...]]:
        cmds, self._commands = self._commands, []
        if TP.size > 1:  # rank 0 decides; every rank applies the same adds/aborts at the same step
            cmds = broadcast_objects(cmds)
        return cmds

    def _apply(self, cmds: list[tuple[Any, ...]]) -> None:
        for cmd in cmds:
            if cmd[0] == "add":
                _, rid, ids, params, eos = cmd
                req = self.reqs.get(rid) or Req(rid, ids, params, eos)
                self.reqs[rid] = req
                self.scheduler.add(req)
            elif cmd[0] == "finish":
                _, rid, reason, error = cmd
                found = self.reqs.get(rid)
                if found is not None and not found.finished:
                    self._finish(found, reason, error)
            elif cmd[0] == "evict_all":
                self.cache.evict_all()
            elif cmd[0] == "shutdown":
                self._shutdown = True

    def _finish(self, req: Req, reason: str, error: str | None = None) -> None:
        self.scheduler.finish(req, reason, error)
        self.stats["finished"] += 1
        self.reqs.pop(req.rid, None)
        self._finished_now.append(req)

    def shutdown(self) -> None:
        """Every request still here ends (aborted, its pages returned: at TP=1 they stayed, and a later step() ran
        them on); rank 0 also releases the follower ranks (they leave their step loop) and leaves the group."""
        if self._shutdown:
            return
        try:
            if TP.rank == 0 and (TP.size > 1 or (self.failed is None and self.reqs)):
                for rid in list(self.reqs):
                    self.abort(rid)
                if TP.size > 1:
                    self._commands.append(("shutdown",))
                self.step()
        finally:
            self._shutdown = True
        if TP.size > 1:
            self._leave_group()

    def run_follower(self) -> None:
        """Ranks > 0: mirror rank 0's steps until it shuts down, the heap held as rank 0's step loop holds its own (a
        follower's full collection would hold every rank at the next collective)."""
        with frozen_heap():
            while not self._shutdown:
                self.step()
                collect_if_idle(self.has_work())
        self._leave_group()

    def _leave_group(self) -> None:
        # CUDA graphs that captured NCCL all-reduces must be gone before their communicator is: otherwise
        # destroy_process_group can hang (pytorch/pytorch#115388); ranks on 2xH200 and 4xH200 did not exit.
        self.runner.release_graphs()
        leave_tp_group()  # every rank is here after the shutdown step (a failed group exits elsewhere)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._inflight is not None or bool(self._commands)

    # ---- the loop -----------------------------------------------------------------------------------
    def step(self) -> list[Req]:
        """One scheduling step. Returns requests that received a token or finished this step."""
        if self.failed is not None:
            raise RuntimeError(f"the engine stopped: an earlier step failed ({self.failed})")
        if TP.size == 1:
            with ctrl_c_after_step():  # a step cut short leaves its other requests scheduled, never processed
                try:
                    return self._step()
                except BaseException as e:  # a second Ctrl-C too: its requests are out of step with the batch
                    self.failed = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    raise
        try:
            with ctrl_c_after_step():  # and the ranks stay in lockstep
                return self._step()
        except Exception as e:
            leave_failed_group(e)  # the group cannot go on: every rank ends, none hangs

    def _step(self) -> list[Req]:
        t0 = time.perf_counter()
        self._apply(self._sync_commands())
        batch = self.scheduler.schedule()
        t1, c1 = time.perf_counter(), time.thread_time()
        out = self.runner.run(batch) if batch else None
        t2, c2 = time.perf_counter(), time.thread_time()
        if batch is not None:
            self.stats["steps"] += 1
            self.stats["mixed_steps"] += batch.is_mixed
            for i in batch.prefill_rows:
                req = batch.reqs[i]
                if batch.starts[i] == req.cache_hit_tokens and req.num_preemptions == 0:  # its first prefill chunk
                    self.stats["prompt_tokens"] += len(req.prompt_ids)
                    self.stats["cache_hit_tokens"] += req.cache_hit_tokens
                self.cache.publish(req)
        changed: list[Req] = []
        processed: Batch | None = None
        if self.overlap:
            # Step N+1 is already queued on the GPU; only now wait for step N's tokens.
            if self._inflight is not None:
                processed = self._inflight[0]
                changed = self._process(*self._inflight)
            self._inflight = (batch, out) if batch is not None and out is not None else None
        elif batch is not None and out is not None:
            processed = batch
            changed = self._process(batch, out)
        t3 = time.perf_counter()
        # CPU seconds spent scheduling, launching (building inputs + enqueueing kernels), and waiting/processing.
        for key, dt in (("schedule", t1 - t0), ("launch", t2 - t1), ("process", t3 - t2)):
            self.timing[key] += dt
        if self.step_records is not None and processed is not None:
            self._record(processed, t1 - t0, t2 - t1, t3 - t2, c2 - c1)
        if self.config.check_invariants:
            self.check()
        done, self._finished_now = self._finished_now, []
        return changed + [r for r in done if r not in changed]

    def _record(self, b: Batch, schedule: float, launch: float, process: float, launch_cpu: float) -> None:
        assert self.step_records is not None
        prefill = b.q_lens[b.num_decode :]
        ms = (1e3 * schedule, 1e3 * launch, 1e3 * self._waited, 1e3 * (process - self._waited))
        allocs, retries = 0, 0
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            now = (int(stats.get("num_device_alloc", 0)), int(stats.get("num_alloc_retries", 0)))
            allocs, retries = now[0] - self._alloc_counts[0], now[1] - self._alloc_counts[1]
            self._alloc_counts = now
        switches = (0, 0)
        if hasattr(resource, "RUSAGE_THREAD"):
            ru = resource.getrusage(resource.RUSAGE_THREAD)
            switches = (ru.ru_nvcsw - self._switches[0], ru.ru_nivcsw - self._switches[1])
            self._switches = (ru.ru_nvcsw, ru.ru_nivcsw)
        rec = StepRecord(
            self._processed_at,
            b.num_decode,
            len(prefill),
            sum(prefill),
            b.context_tokens,
            *ms,
            allocs,
            retries,
            1e3 * launch_cpu,
            *switches,
            decode_context_tokens=b.decode_context_tokens,
            prefill_key_pairs=b.prefill_key_pairs,
        )
        self.step_records.append(rec)

    def _process(self, batch: Batch, out: StepOutput) -> list[Req]:
        t0 = time.perf_counter()
        tokens = out.wait()
        now = time.perf_counter()
        self._waited, self._processed_at = now - t0, now
        changed = []
        for p in out.prompt_logprobs:
            for j, rec in enumerate(p.logprobs.records(p.tokens)):
                if p.start + j == len(p.req.prompt_logprobs):  # a recomputed chunk repeats positions already kept
                    p.req.prompt_logprobs.append(rec)
        sampled = [r for r, s in zip(batch.reqs, batch.sample) if s]
        logprobs = {}
        if out.logprobs is not None:
            logprobs = dict(zip(out.logprob_rows, out.logprobs.records([tokens[j] for j in out.logprob_rows])))
        for j, (req, tok) in enumerate(zip(sampled, tokens)):
            if req.finished:
                continue  # ended (EOS, abort) while this step was in flight
            if j in logprobs:
                req.logprobs.append(logprobs[j])
            req.output_ids.append(tok)
            req.token_times.append(now)
            if req.first_token_time is None:
                req.first_token_time = now
            self.stats["generation_tokens"] += 1
            reason = req.check_token_finish(tok)
            if reason:
                self._finish(req, reason)
            changed.append(req)
        return changed

    def check(self) -> None:
        self.cache.check(self.scheduler.live)
        for r in self.scheduler.live:
            assert r.status is Status.RUNNING and r.device_len <= r.max_device_len, (r.rid, r.device_len)

    def metrics(self) -> EngineMetrics:
        c = self.cache
        return EngineMetrics(
            running=len(self.scheduler.live),
            waiting=len(self.scheduler.waiting),
            kv_pages_total=c.num_pages,
            kv_pages_in_use=c.num_in_use,
            kv_pages_cached=c.num_evictable,
            kv_pages_free=c.num_free,
            page_size=c.page_size,
            prompt_tokens=self.stats["prompt_tokens"],
            cache_hit_tokens=self.stats["cache_hit_tokens"],
            generation_tokens=self.stats["generation_tokens"],
            finished_requests=self.stats["finished"],
            preemptions=self.scheduler.num_preemptions,
            steps=self.stats["steps"],
            mixed_steps=self.stats["mixed_steps"],
        )
