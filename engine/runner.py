"""Model runner: turns a scheduled Batch into device tensors, runs the model, samples the next tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from engine import cpu_graph
from engine.cache_paths import cache_root
from engine.distributed import TP
from engine.layers import CPU_MATMUL_MAX_ROWS
from engine.models.llama import LlamaForCausalLM
from engine.request import Req
from engine.sampler import Logprobs, Sampler
from engine.scheduler import Batch
from kernels.attention import AttnMeta, create_backend
from kernels.attention.torch_backend import TorchBackend
from kvcache.pool import KVPool

if TYPE_CHECKING:
    from engine.cpu_graph import CpuDecodeGraphs
    from engine.cuda_graph import DecodeGraphs

# A batch's KV after its step, per row: length, page table; and each decode row's slot for its new token.
KVLayout = tuple[list[int], list[list[int]], list[int]]


@dataclass(slots=True)
class PromptLogprobs:
    """Log-probabilities of a request's prompt tokens start+1 .. start+len(tokens), computed in one prefill chunk."""

    req: Req
    start: int
    tokens: list[int]
    logprobs: Logprobs


@dataclass(slots=True)
class StepOutput:
    tokens: torch.Tensor  # [n_sampled] on the CPU (pinned on CUDA), valid once `ready` has completed
    ready: torch.cuda.Event | None
    # for the sampled requests that asked (their indices among the sampled), valid once `ready` has completed
    logprob_rows: list[int] = field(default_factory=list)
    logprobs: Logprobs | None = None
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)

    def wait(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.tokens.tolist()


# Run the LM head at every row count while the engine starts (_warm_up_lm_head); off only for its A/B.
WARM_UP_LM_HEAD = True


class ModelRunner:
    PROMPT_LOGITS_BLOCK = 512  # prompt positions whose full-vocabulary logits are held at once

    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: KVPool,
        backend_name: str,
        device: torch.device,
        max_slots: int,
        cuda_graph_max_bs: int = 0,
        scratch_page: int = -1,
        max_request_tokens: int | None = None,  # the most tokens one request spans; default: the whole pool
        piecewise_max_tokens: int = 0,  # prefill/mixed steps of up to this many tokens replay piecewise graphs
        cpu_ops: bool = False,  # the model computes through kernels/cpu_ops.py (the loader switched it)
    ):
        cfg = model.cfg
        self.model, self.pool, self.device = model, pool, device
        self.scratch_page = scratch_page  # a pool page no request owns (padded CUDA-graph rows write there)
        self.backend = create_backend(
            backend_name,
            pool,
            cfg.num_heads // TP.size,
            cfg.num_kv_heads // TP.size,
            cfg.head_dim,
            device,
            cfg.sliding_window,
            kernel_cache=cache_root() / "cuda" if device.type == "cuda" else None,
        )
        if scratch_page >= 0:
            self._warm_up_prefill_attention()
        self.sampler = Sampler(cfg.vocab_size, max_slots, device)
        # Last sampled token per request slot: decode reads its input here, so under overlap scheduling the
        # CPU never has to wait for step N's tokens before launching step N+1.
        self.next_tokens = torch.zeros(max_slots, dtype=torch.int64, device=device)
        self.keep_logits = False  # tests read self.last_logits
        self.last_logits: torch.Tensor | None = None
        self.graphs: DecodeGraphs | CpuDecodeGraphs | None = None
        if device.type == "cuda" and cuda_graph_max_bs > 0:
            from engine.cuda_graph import DecodeGraphs

            longest = max_request_tokens or pool.num_pages * pool.page_size
            self.graphs = DecodeGraphs(self, min(cuda_graph_max_bs, max_slots), longest)
        if cpu_ops and isinstance(self.backend, TorchBackend):
            # its decode attention through the C kernel too (not over an fp8 pool or a sliding window: it checks)
            self.backend.cpu_ops = True
            if cpu_graph.enabled() and not pool.quantized and cfg.sliding_window is None:
                self.graphs = cpu_graph.CpuDecodeGraphs(self, min(CPU_MATMUL_MAX_ROWS, max_slots))
        self.pieces = None
        if device.type == "cuda" and piecewise_max_tokens > 0:
            from engine.piecewise_graph import MixedGraphs

            self.pieces = MixedGraphs(self, piecewise_max_tokens)
        self.sampler.warm_up(pool.compute_dtype)
        if device.type == "cuda" and WARM_UP_LM_HEAD:
            self._warm_up_lm_head(max_slots)

    @property
    def graph_capture_seconds(self) -> float:
        return sum(g.capture_seconds for g in (self.graphs, self.pieces) if g is not None)

    def release_graphs(self) -> None:
        """Destroy the captured graphs now (before the NCCL communicator some of them captured goes)."""
        graphs, pieces, self.graphs, self.pieces = self.graphs, self.pieces, None, None
        for g in (graphs, pieces):
            if g is not None:
                g.release()

    def _warm_up_prefill_attention(self) -> None:
        """A one-token fresh prompt, then a 256-token chunk after one token of KV, through the attention backend
        alone on the scratch page, so kernels that only prefill uses are built and loaded now rather than in a
        request's step (FlashInfer's fa3 module, a JIT build of its own on a machine without its cache, whose ragged
        kernel takes fresh prompts and whose paged kernel chunks of 128+ tokens; FA4's prefill)."""
        be, dev, dtype = self.backend, self.device, self.pool.compute_dtype
        slot = torch.tensor([self.scratch_page * self.pool.page_size], dtype=torch.int64, device=dev)
        be.plan(AttnMeta(False, [1], [1], [[self.scratch_page]], slot))
        q = torch.zeros(1, be.num_heads, be.head_dim, dtype=dtype, device=dev)
        kv = torch.zeros(1, be.num_kv_heads, be.head_dim, dtype=dtype, device=dev)
        be.forward(0, q, kv, kv)
        n = 256  # every page of its table the scratch page; stored: nothing is written
        pages = [self.scratch_page] * -(-(n + 1) // self.pool.page_size)
        be.plan(AttnMeta(False, [n], [n + 1], [pages], slot.expand(n)))
        be.forward(0, torch.zeros(n, be.num_heads, be.head_dim, dtype=dtype, device=dev), None, None, stored=True)

    def _warm_up_lm_head(self, max_rows: int) -> None:
        """The LM head runs eagerly at each step's sampled row count. cuBLAS picks its kernel by the row count and
        loads each kernel at its first launch, which waits for the GPU to go idle (benchmarks/lm_head_first_call.py):
        in a saturated replay every such step took 20-36 ms to launch. So every count a step can sample (one row per
        running request) runs once now. The layers' GEMMs in prefill and mixed steps run in the piecewise graphs
        (steps up to --piecewise-graph-tokens, FlashInfer), whose capture loads their kernels."""
        h = torch.zeros(max_rows, self.model.cfg.hidden_size, dtype=self.pool.compute_dtype, device=self.device)
        for m in range(1, max_rows + 1):
            self.model.logits(h[:m])

    def _slots(self, pages: list[int], start: int, n: int) -> torch.Tensor:
        ps = self.pool.page_size
        pos = torch.arange(start, start + n)
        return torch.tensor(pages, dtype=torch.int64)[pos // ps] * ps + pos % ps

    def kv_layout(self, batch: Batch) -> KVLayout:
        """Per row: KV length after this step and its page table; and each decode row's KV slot for its new token."""
        ps, nd = self.pool.page_size, batch.num_decode
        kv_lens = [s + n for s, n in zip(batch.starts, batch.q_lens)]
        tables = [r.pages[: -(-kv // ps)] for r, kv in zip(batch.reqs, kv_lens)]
        decode_slots = [t[s // ps] * ps + s % ps for t, s in zip(tables[:nd], batch.starts[:nd])]
        return kv_lens, tables, decode_slots

    def prepare(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, AttnMeta]:
        dev, nd = self.device, batch.num_decode
        kv_lens, tables, decode_slots = self.kv_layout(batch)
        # Decode rows: one token each, read from the device-side token table (under overlap scheduling the CPU
        # does not know it yet). Prefill rows: their prompt (or recomputed) tokens, from the CPU.
        out = [torch.tensor(decode_slots, dtype=torch.int64)]
        pos = [torch.tensor(batch.starts[:nd], dtype=torch.int64)]
        rows = batch.prefill_rows
        out += [self._slots(batch.reqs[i].pages, batch.starts[i], batch.q_lens[i]) for i in rows]
        pos += [torch.arange(batch.starts[i], batch.starts[i] + batch.q_lens[i]) for i in rows]
        ids = []
        if nd:
            slot_idx = torch.tensor([r.slot for r in batch.reqs[:nd]], dtype=torch.int64)
            ids.append(self.next_tokens[slot_idx.to(dev, non_blocking=True)])
        if rows:
            prompt = [
                t for i in rows for t in batch.reqs[i].all_ids[batch.starts[i] : batch.starts[i] + batch.q_lens[i]]
            ]
            ids.append(torch.tensor(prompt, dtype=torch.int64).to(dev, non_blocking=True))
        meta = AttnMeta(batch.is_decode, batch.q_lens, kv_lens, tables, torch.cat(out).to(dev, non_blocking=True))
        return torch.cat(ids) if len(ids) > 1 else ids[0], torch.cat(pos).to(dev, non_blocking=True), meta

    @torch.inference_mode()
    def run(self, batch: Batch) -> StepOutput:
        last = torch.tensor(batch.q_lens).cumsum(0) - 1
        sample_rows = [i for i, s in enumerate(batch.sample) if s]
        slots = None  # the sampled requests' slots on the device, where a graph's inputs already hold them
        if self.graphs is not None and self.graphs.can_run(batch):
            hidden, slots = self.graphs.run(batch, self.kv_layout(batch))
            if len(sample_rows) != len(batch.reqs):
                slots = None
        else:
            ids, pos, meta = self.prepare(batch)
            # a decode batch gets here where its graph cannot run it (more rows than captured, a fixed split)
            if self.pieces is not None and self.pieces.can_run(batch.num_tokens):
                hidden = self.pieces.run(ids, pos, meta)
            else:
                self.backend.plan(meta)
                hidden = self.model(ids, pos, self.backend)
        sampled = [batch.reqs[i] for i in sample_rows]
        prompt_lps = self._prompt_logprobs(batch, hidden, last)
        if not sampled:
            return self._output(torch.empty(0, dtype=torch.int64, device=self.device), prompt_lps=prompt_lps)
        h = (
            hidden[last[sample_rows].to(self.device, non_blocking=True)]
            if batch.num_tokens != len(sample_rows)
            else hidden
        )
        logits = self.model.logits(h)
        if self.keep_logits:
            self.last_logits = logits
        for i in sample_rows:
            if i >= batch.num_decode:
                self.sampler.start(batch.reqs[i])  # (re)build penalty state from the full token history
        tokens = self.sampler.sample(logits, sampled)
        if TP.size > 1:  # every rank must continue with rank 0's token, whatever its own RNG drew
            dist.broadcast(tokens, src=0)
        if slots is None:
            slots = torch.tensor([r.slot for r in sampled]).to(self.device, non_blocking=True)
        self.next_tokens[slots] = tokens
        rows = [j for j, r in enumerate(sampled) if r.params.logprobs is not None]
        lps = None
        if rows:  # from the logits as the model produced them: the sampler changed only its own copies
            idx = torch.tensor(rows).to(self.device, non_blocking=True)
            lps = Logprobs.compute(logits[idx], tokens[idx], [sampled[j].params.logprobs or 0 for j in rows])
        return self._output(tokens, rows, lps, prompt_lps)

    def _output(
        self,
        tokens: torch.Tensor,
        rows: list[int] | None = None,
        lps: Logprobs | None = None,
        prompt_lps: list[PromptLogprobs] | None = None,
    ) -> StepOutput:
        """The step's results, their host copies queued behind its kernels, with an event to wait for them."""
        ready = None
        if self.device.type == "cuda":
            cpu = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            cpu.copy_(tokens, non_blocking=True)
            tokens, ready = cpu, torch.cuda.Event()
            ready.record()
        return StepOutput(tokens, ready, rows or [], lps, prompt_lps or [])

    def _prompt_logprobs(self, batch: Batch, hidden: torch.Tensor, last: torch.Tensor) -> list[PromptLogprobs]:
        """For prefill rows that asked for prompt logprobs: each fed position p < prompt length - 1 scores the
        prompt token at p + 1 (the last prompt position's distribution is the first output token's)."""
        out: list[PromptLogprobs] = []
        for i in batch.prefill_rows:
            req = batch.reqs[i]
            if not req.needs_prompt_logprobs:
                continue
            start, end = batch.starts[i], min(batch.starts[i] + batch.q_lens[i], len(req.prompt_ids) - 1)
            first = int(last[i]) - batch.q_lens[i] + 1  # the row's first position in `hidden`
            k = req.params.prompt_logprobs or 0
            for a in range(start, end, self.PROMPT_LOGITS_BLOCK):
                b = min(a + self.PROMPT_LOGITS_BLOCK, end)
                targets = req.prompt_ids[a + 1 : b + 1]
                logits = self.model.logits(hidden[first + a - start : first + b - start])
                ids = torch.tensor(targets).to(self.device, non_blocking=True)
                out.append(PromptLogprobs(req, a, targets, Logprobs.compute(logits, ids, [k] * (b - a))))
        return out
