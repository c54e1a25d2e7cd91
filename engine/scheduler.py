"""Continuous batching. With mixed batches (the default) a step carries every running request's next decode token,
then prefill chunks of admitted prompts up to the per-step token budget, and at most `mixed_prefill_tokens` of them
while requests decode, so an arriving prompt never holds the running streams for long. Without, a step is either
prefill (chunked under the budget, and first whenever there is any) or decode."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.request import Req, Status
from kvcache.manager import CacheManager


@dataclass(slots=True)
class Batch:
    reqs: list[Req]  # decode rows first, then prefill rows
    num_decode: int  # rows [0, num_decode) feed one token each from the device-side token table
    starts: list[int]  # first position fed this step, per request
    q_lens: list[int]  # tokens fed this step, per request
    sample: list[bool]  # does this step produce the request's next token?

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def is_decode(self) -> bool:
        return self.num_decode == len(self.reqs)

    @property
    def is_mixed(self) -> bool:
        return 0 < self.num_decode < len(self.reqs)

    @property
    def prefill_rows(self) -> range:
        return range(self.num_decode, len(self.reqs))

    # What the step's attention reads and computes (the step log; benchmarks/schedule_sim.py's step-time laws)
    @property
    def context_tokens(self) -> int:
        """KV tokens every row attends over, its new tokens included."""
        return sum(self.starts) + self.num_tokens

    @property
    def decode_context_tokens(self) -> int:
        return sum(self.starts[: self.num_decode]) + self.num_decode

    @property
    def prefill_key_pairs(self) -> int:
        """Query-key pairs of the prefill rows' causal attention: a chunk of q tokens after s has q * s + q(q+1)/2."""
        chunks = zip(self.starts[self.num_decode :], self.q_lens[self.num_decode :])
        return sum(q * s + q * (q + 1) // 2 for s, q in chunks)


def join(decode: Batch | None, prefill: Batch | None) -> Batch | None:
    if decode is None or prefill is None:
        return decode or prefill
    return Batch(
        decode.reqs + prefill.reqs,
        decode.num_decode,
        decode.starts + prefill.starts,
        decode.q_lens + prefill.q_lens,
        decode.sample + prefill.sample,
    )


class Scheduler:
    def __init__(
        self,
        cache: CacheManager,
        max_running: int,
        max_batch_tokens: int,
        mixed: bool = False,
        max_running_tokens: int | None = None,
        mixed_prefill_tokens: int | None = None,
    ):
        self.cache = cache
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.mixed = mixed
        self.max_running_tokens = max_running_tokens
        self.mixed_prefill_tokens = mixed_prefill_tokens or max_batch_tokens
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []  # admitted, prompt not fully in the KV cache yet
        self.running: list[Req] = []  # decoding, oldest first
        self.free_slots = list(range(max_running - 1, -1, -1))
        self.num_preemptions = 0

    @property
    def live(self) -> list[Req]:
        return self.prefilling + self.running

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def schedule(self) -> Batch | None:
        if not self.mixed:
            return self._prefill(self.max_batch_tokens) or self._decode()
        # Decode first: running requests get their next page before new prompts are admitted into what is left.
        preempted = self.num_preemptions
        decode = self._decode()
        budget = self.max_batch_tokens
        if decode:  # a prefill chunk lengthens the step every decoding stream waits on
            budget = min(budget - decode.num_tokens, self.mixed_prefill_tokens)
        # A step that had to preempt admits nobody: there is no room, and a victim re-admitted at once would be
        # sized without its last token, still in flight under overlap scheduling.
        admit = self.num_preemptions == preempted
        return join(decode, self._prefill(budget, admit) if budget > 0 else None)

    def _prefill(self, budget: int, admit: bool = True) -> Batch | None:
        reqs, starts, lens, sample = [], [], [], []
        candidates = list(self.prefilling)
        context = sum(r.num_tokens for r in self.live) if self.max_running_tokens else 0
        while admit and self.waiting and len(self.live) < self.max_running:
            if sum(r.num_tokens - r.device_len for r in candidates) >= budget:
                break  # the chunks already fill this step: admit (and give pages to) no request it cannot feed
            req = self.waiting[0]
            if self.max_running_tokens and self.live and context + req.num_tokens > self.max_running_tokens:
                break  # every decode step reads the whole context of every running request: keep steps short
            use_cache = not req.needs_prompt_logprobs
            if not self.cache.admit(req, len(self.running), use_cache, up_to=req.max_device_len):
                break
            self.waiting.popleft()
            context += req.num_tokens
            req.status, req.slot = Status.RUNNING, self.free_slots.pop()
            if req.num_preemptions == 0:
                req.cache_hit_tokens = req.cached_len
            self.prefilling.append(req)
            candidates.append(req)
        for req in candidates:
            if budget <= 0:
                break
            n = min(req.num_tokens - req.device_len, budget)
            reqs.append(req)
            starts.append(req.device_len)
            lens.append(n)
            budget -= n
            req.device_len += n
            done = req.device_len == req.num_tokens
            sample.append(done)
            if done:
                self.prefilling.remove(req)
                self.running.append(req)
        return Batch(reqs, 0, starts, lens, sample) if reqs else None

    def _decode(self) -> Batch | None:
        batch: list[Req] = []
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.device_len >= req.max_device_len:
                continue
            while not self.cache.grow(req, req.device_len + 1, up_to=req.max_device_len):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is Status.RUNNING:
                batch.append(req)
        if not batch:
            return None
        starts = [r.device_len for r in batch]
        for r in batch:
            r.device_len += 1
        return Batch(batch, len(batch), starts, [1] * len(batch), [True] * len(batch))

    def preempt(self, req: Req) -> None:
        """Free a running request's pages and requeue it first; its tokens are kept and recomputed later."""
        self.running.remove(req)
        self._release(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Req, reason: str, error: str | None = None) -> None:
        if req.status is Status.FINISHED:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.prefilling:
            self.prefilling.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.slot >= 0:
            self._release(req)
        req.status, req.finish_reason, req.error = Status.FINISHED, reason, error

    def _release(self, req: Req) -> None:
        self.cache.release(req)
        self.free_slots.append(req.slot)
        req.slot = -1
