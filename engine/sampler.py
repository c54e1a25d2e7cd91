"""Batched sampling on the device: penalties, logit bias, min_tokens, temperature, top-k / top-p / min-p,
per-request seeds; and the log-probabilities requests ask for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.layers import fused_ops
from engine.logprobs import TokenLogprob
from engine.request import Req
from engine.sampling_params import SamplingParams


def _dev(values: list[Any], device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list on the device without a stream sync (a blocking copy would stall overlap scheduling)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy on the host, queued behind the step's kernels (pinned, so it does not sync); read it
    only once the step's event has completed."""
    if not t.is_cuda:
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


@dataclass(slots=True)
class Logprobs:
    """Log-probabilities of some rows' tokens under the raw model distribution, and each row's top `ks[i]`
    alternatives, on the host (see _host)."""

    chosen: torch.Tensor  # [n]
    ranks: torch.Tensor  # [n]: how many tokens are at least as likely as the chosen one (vLLM's rank)
    top_ids: torch.Tensor  # [n, max(ks)]
    top_logprobs: torch.Tensor  # [n, max(ks)]
    ks: list[int]

    @staticmethod
    def compute(logits: torch.Tensor, tokens: torch.Tensor, ks: list[int]) -> Logprobs:
        """logits: [n, V] as the model produced them; tokens: [n], the token whose log-probability each row wants."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        chosen = lp.gather(1, tokens[:, None]).squeeze(1)
        ranks = (lp >= chosen[:, None]).sum(dim=-1)
        top_lp, top_ids = lp.topk(max(ks), dim=-1)
        return Logprobs(_host(chosen), _host(ranks), _host(top_ids), _host(top_lp), ks)

    def records(self, tokens: list[int]) -> list[TokenLogprob]:
        chosen, ranks = self.chosen.tolist(), self.ranks.tolist()
        ids, lps = self.top_ids.tolist(), self.top_logprobs.tolist()
        return [
            TokenLogprob(t, c, r, tuple(zip(i[:k], lp[:k])))
            for t, c, r, i, lp, k in zip(tokens, chosen, ranks, ids, lps, self.ks)
        ]


class Sampler:
    def __init__(self, vocab_size: int, max_slots: int, device: torch.device):
        self.vocab, self.max_slots, self.device = vocab_size, max_slots, device
        self.seen: torch.Tensor | None = None  # [slots, V] tokens in prompt or output (repetition penalty)
        self.counts: torch.Tensor | None = None  # [slots, V] output token counts (presence/frequency)

    # ---- penalty state, only allocated once some request asks for a penalty ----------------------------
    def start(self, req: Req) -> None:
        if not req.params.has_penalties:
            return
        if self.seen is None:
            self.seen = torch.zeros(self.max_slots, self.vocab, dtype=torch.bool, device=self.device)
            self.counts = torch.zeros(self.max_slots, self.vocab, dtype=torch.int32, device=self.device)
        assert self.counts is not None
        self.seen[req.slot].zero_()
        self.counts[req.slot].zero_()
        self.seen[req.slot, _dev(req.all_ids, self.device)] = True
        if req.output_ids:
            out = _dev(req.output_ids, self.device)
            self.counts[req.slot].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def _penalize(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        rows = [i for i, r in enumerate(reqs) if r.params.has_penalties]
        if not rows or self.seen is None or self.counts is None:
            return logits
        idx = _dev(rows, self.device)
        slots = _dev([reqs[i].slot for i in rows], self.device)
        p = [reqs[i].params for i in rows]
        rep = _dev([x.repetition_penalty for x in p], self.device)[:, None]
        freq = _dev([x.frequency_penalty for x in p], self.device)[:, None]
        pres = _dev([x.presence_penalty for x in p], self.device)[:, None]
        sub, seen, cnt = logits[idx], self.seen[slots], self.counts[slots].float()
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - freq * cnt - pres * (cnt > 0).float()
        logits = logits.clone()
        logits[idx] = sub
        return logits

    def _record(self, tokens: torch.Tensor, reqs: list[Req]) -> None:
        if self.seen is None or self.counts is None:
            return
        rows = [i for i, r in enumerate(reqs) if r.params.has_penalties]
        if rows:
            slots = _dev([reqs[i].slot for i in rows], self.device)
            toks = tokens[_dev(rows, self.device)]
            self.seen[slots, toks] = True
            self.counts[slots, toks] += 1

    def warm_up(self, dtype: torch.dtype) -> None:
        """Compile the fused sampler now, for the model's logits and for float32 ones (penalties), rather than
        in the first steps that sample: a fresh H100 stalled a saturated replay for about a second there."""
        ops = fused_ops() if self.device.type == "cuda" else None
        if ops is None:
            return
        for dt in {dtype, torch.float32}:
            logits = torch.zeros(2, self.vocab, dtype=dt, device=self.device)
            ops.sample_gumbel(logits, _dev([0.0, 1.0], self.device), _dev([1, 2], self.device, torch.int64))

    # ---- sampling -----------------------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """logits: [B, V] (one row per request). Returns [B] int64 token ids on the device."""
        params = [r.params for r in reqs]
        ops = fused_ops() if logits.is_cuda else None
        # float32 wherever a row changes the logits (vLLM does all of it in float32): a bf16 sum lost a logit_bias
        # of 0.1 at logit 40, and only when no top-k/top-p/min-p row in the step had made the copy float32
        if ops is None or any(p.has_penalties or p.logit_bias for p in params):
            logits = logits.float()
        if any(p.logit_bias or p.min_tokens for p in params):  # before the penalties, as vLLM (and HF) apply them
            logits = self._bias(logits, reqs)
        logits = self._penalize(logits, reqs)
        if ops is None:
            tokens = self._torch_sample(logits, reqs)
        else:
            # Per row, not per batch: a row without top-k/top-p/min-p always takes the fused kernel, whose noise is a
            # pure function of (seed, position), whatever else shares the step (a top_p neighbour sent the whole
            # batch to the torch path, and a seeded request drew other tokens than alone).
            filtered = [p.has_filters for p in params]
            if not any(filtered):
                tokens = self._fused(ops, logits, reqs)
            else:
                tokens = torch.empty(len(reqs), dtype=torch.int64, device=logits.device)
                rows_t = [i for i, f in enumerate(filtered) if f]
                rows_f = [i for i, f in enumerate(filtered) if not f]
                idx_t = _dev(rows_t, self.device)
                tokens[idx_t] = self._torch_sample(logits[idx_t].float(), [reqs[i] for i in rows_t])
                if rows_f:
                    idx_f = _dev(rows_f, self.device)
                    tokens[idx_f] = self._fused(ops, logits[idx_f], [reqs[i] for i in rows_f])
        self._record(tokens, reqs)
        return tokens

    def _fused(self, ops: Any, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """The fused Gumbel kernel (GPU): its noise is a function of (seed, position) alone."""
        tokens: torch.Tensor = ops.sample_gumbel(
            logits,
            _dev([0.0 if r.params.greedy else r.params.temperature for r in reqs], self.device),
            _dev([self._row_seed(r) for r in reqs], self.device, torch.int64),
        )
        return tokens

    def _torch_sample(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """float32 logits of rows the fused kernel does not take (top-k/top-p/min-p), or of every row on a CPU."""
        params = [r.params for r in reqs]
        if all(p.greedy for p in params):
            return logits.argmax(-1)
        greedy = _dev([p.greedy for p in params], self.device)
        temps = _dev([p.temperature if not p.greedy else 1.0 for p in params], self.device)
        scaled = logits / temps[:, None]
        probs = torch.softmax(scaled, dim=-1)
        if any(p.has_filters for p in params):
            probs = self._filter(scaled, probs, params)
        # Exp(1) noise as -log(U): on a CPU 4x faster than exponential_ (5.4 vs 20.5 ms for 16 x 49152).
        noise = torch.empty_like(probs).uniform_()
        for i, r in enumerate(reqs):  # seeded requests draw from their own generator: batch-independent
            if r.params.seed is not None and not r.params.greedy:
                noise[i].uniform_(generator=self._generator(r))
        noise.log_().neg_()  # U in [0, 1): noise in (0, inf], and p / inf = 0 never wins
        # argmax(p / Exp(1)) is a draw from p (the exponential race); no renormalisation needed.
        return torch.where(greedy, logits.argmax(-1), (probs / noise).argmax(-1))

    def _bias(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """logit_bias, and min_tokens: the tokens that would end a request (EOS, stop_token_ids) are masked while
        its output is shorter. device_len - prompt length is the index of the token sampled now, also under overlap
        scheduling, where output_ids lags a step behind."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for i, r in enumerate(reqs):
            p = r.params
            for t, b in p.logit_bias.items():
                rows.append(i)
                cols.append(t)
                vals.append(b)
            if r.device_len - len(r.prompt_ids) < p.min_tokens:
                for t in set(p.stop_token_ids) | (set() if p.ignore_eos else r.eos_ids):
                    rows.append(i)
                    cols.append(t)
                    vals.append(-float("inf"))
        if not rows:
            return logits
        logits = logits.clone()
        index = (_dev(rows, self.device), _dev(cols, self.device))
        logits.index_put_(index, _dev(vals, self.device, logits.dtype), accumulate=True)
        return logits

    @staticmethod
    def _row_seed(req: Req) -> int:
        """Noise seed for the token at position device_len: fixed by (request seed, position), so overlap
        scheduling, CUDA graphs, batching and preemption cannot change a seeded request's samples."""
        return (req.noise_key + req.device_len * 0x9E3779B97F4A7C15) & 0xFFFFFFFF  # the kernel keys on 32 bits

    def _generator(self, req: Req) -> torch.Generator:
        if req.rng is None:
            req.rng = torch.Generator(device=self.device)
            req.rng.manual_seed(req.noise_key)  # called for seeded requests only
        return req.rng

    def _filter(self, scaled: torch.Tensor, probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """probs = softmax(scaled), scaled the logits over the temperature. vLLM's order (apply_top_k_top_p, after
        min-p): min-p and top-k first (they commute), then top-p over what they left, renormalised; transformers'
        TopK -> TopP warpers too."""
        top_k = _dev([p.top_k if p.top_k > 0 else probs.shape[-1] for p in params], self.device)
        top_p = _dev([p.top_p for p in params], self.device)
        min_p = _dev([p.min_p for p in params], self.device)
        # sorted by the logits, not the probabilities, whose exp can round two logits into one value
        sorted_l, order = scaled.sort(dim=-1, descending=True)
        sorted_p = probs.gather(-1, order)
        # top-k keeps every token tied with the k-th (vLLM's `logits_sort < kth`, transformers' TopK): kept by its
        # sort position alone, one of two tied tokens (bf16 logits tie often) was never drawn
        kth = sorted_l.gather(-1, (top_k.clamp(max=probs.shape[-1]) - 1)[:, None])
        drop = sorted_l < kth
        drop |= sorted_p < (min_p[:, None] * sorted_p[:, :1])
        kept = sorted_p.masked_fill(drop, 0.0)
        # top-p: drop a token once the less likely ones and itself hold at most 1 - top_p of what is left (vLLM's
        # `cumsum <= 1 - p` over the ascending sort, transformers' too): the smallest set reaching top_p. Summed from
        # the tail, as there, the small probabilities are not lost in a float32 sum already near 1 (summed from the
        # head, a top_p 1 row dropped tail tokens); and a token whose predecessors hold exactly top_p goes
        rest = kept.flip(-1).cumsum(-1).flip(-1)
        drop |= rest <= (1 - top_p[:, None]) * rest[:, :1]
        drop[:, 0] = False
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        return torch.zeros_like(probs).scatter_(-1, order, sorted_p)
