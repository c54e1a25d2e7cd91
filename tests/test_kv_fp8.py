"""An fp8 KV cache (`--kv-cache-dtype fp8`: e4m3, scale 1, saturating) against transformers with its K/V rounded the
same way: the attention sees every key and value as stored, the prompt's own included."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.model_config import PRESETS
from engine.sampling_params import SamplingParams
from kernels.attention.base import create_backend
from kvcache.pool import FP8, KVPool
from tests.conftest import make_llm
from tests.hf_reference import hf_greedy, hf_model_from_config, save_hf
from tests.test_engine import prompts_with_shared_prefix, tiny_dir  # noqa: F401
from tests.test_hf_equivalence import PROMPTS


def _fp8(x: torch.Tensor) -> torch.Tensor:
    """x as an e4m3 pool holds it, back in x's dtype."""
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype)


@pytest.fixture(scope="module")
def fp8_attention():
    """transformers' SDPA attention with K/V rounded to e4m3 first (`model.config._attn_implementation = "fp8kv"`)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def fp8_sdpa(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(module, query, _fp8(key), _fp8(value), *args, **kwargs)

    AttentionInterface.register("fp8kv", fp8_sdpa)
    return "fp8kv"


def test_pool_stores_e4m3_saturated_and_reads_it_back_in_the_compute_dtype():
    pool = KVPool.create(2, 4, 4, 2, 8, torch.float32, "cpu", kv_dtype=FP8)
    assert pool.dtype == FP8 and pool.quantized and pool.k[0].element_size() == 1
    k = torch.randn(3, 2, 8) * torch.tensor([1.0, 1e3, 1e-3]).view(3, 1, 1)  # in range, saturating, subnormal
    v = torch.randn(3, 2, 8)
    slots = torch.tensor([5, 0, 14])
    pool.store(1, slots, k, v)
    got_k, got_v = pool.gather(1, slots)
    assert got_k.dtype == torch.float32
    assert torch.equal(got_k, _fp8(k)) and torch.equal(got_v, _fp8(v))
    assert got_k[1].abs().max() == 448 and not torch.equal(got_k, k)
    written = pool.k[1].view(torch.uint8).count_nonzero()  # nothing outside the three slots
    assert pool.k[0].view(torch.uint8).count_nonzero() == 0
    assert written == k.clamp(-448, 448).to(FP8).view(torch.uint8).count_nonzero()
    with pytest.raises(ValueError, match="stores its compute dtype or"):
        KVPool.create(1, 4, 4, 2, 8, torch.float32, "cpu", kv_dtype=torch.float16)


def test_fp8_pool_spends_one_byte_per_value_of_its_budget():
    pages = {d: make_llm(kv_cache_gb=0.01, kv_cache_dtype=d).metrics().kv_pages_total for d in ("auto", "fp8")}
    cfg, page = PRESETS["tiny-llama"], 16
    per_token_fp32 = cfg.kv_bytes_per_token(4)
    assert pages["auto"] == int(0.01 * 2**30) // (per_token_fp32 * page)
    assert pages["fp8"] == int(0.01 * 2**30) // (per_token_fp32 // 4 * page)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_tiny_random_matches_transformers_with_e4m3_kv(preset, tmp_path, fp8_attention):
    hf = hf_model_from_config(PRESETS[preset])
    save_hf(hf, tmp_path / preset)
    llm = make_llm(str(tmp_path / preset), page_size=4, num_pages=256, kv_cache_dtype="fp8")
    llm.engine.runner.keep_logits = True
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(5, 40))] for _ in range(6)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    unquantized = []
    for prompt, out in zip(prompts, outs):
        hf.config._attn_implementation = "sdpa"
        unquantized.append(out.token_ids == hf_greedy(hf, prompt, 24)[0])
        hf.config._attn_implementation = fp8_attention
        assert out.token_ids == hf_greedy(hf, prompt, 24)[0]
    assert not all(unquantized)  # the rounding shows in these tokens: the test sees it
    llm.generate([prompts[0]], SamplingParams(max_tokens=1, temperature=0))
    _, ref_logits = hf_greedy(hf, prompts[0], 1)
    torch.testing.assert_close(llm.engine.runner.last_logits[0], ref_logits, rtol=1e-4, atol=1e-4)


def test_smollm_with_e4m3_kv_scores_tokens_as_transformers_does(fp8_attention, hf_smollm):
    """On the real SmolLM2, float noise moves a few values across an e4m3 rounding step, and each moves the layers
    after it, so tokens are not bit-identical to the reference. Scored token by token (prompt logprobs over the
    reference's own greedy text), the engine must sit far closer to transformers-with-e4m3-K/V than the rounding
    itself moves transformers."""
    hf = hf_smollm
    llm = make_llm(None, max_running_requests=8, kv_cache_dtype="fp8")

    def hf_logprobs(seq: list[int], impl: str) -> torch.Tensor:
        hf.config._attn_implementation = impl
        with torch.no_grad():
            lp = hf(input_ids=torch.tensor([seq])).logits[0].float().log_softmax(-1)
        return lp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0]

    impl = hf.config._attn_implementation  # the session's model: set back for the tests after this one
    try:
        seqs = []
        hf.config._attn_implementation = fp8_attention
        for text in PROMPTS[:4]:
            prompt = llm.encode([{"role": "user", "content": text}])
            seqs.append(prompt + hf_greedy(hf, prompt, 24)[0])
        outs = llm.generate(seqs, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
        ours_err, rounding = [], []
        for seq, out in zip(seqs, outs):
            ours = torch.tensor([t.logprob for t in out.prompt_token_logprobs])
            ref = hf_logprobs(seq, fp8_attention)
            ours_err.append((ours - ref).abs().mean())
            rounding.append((hf_logprobs(seq, "sdpa") - ref).abs().mean())
    finally:
        hf.config._attn_implementation = impl
    assert max(ours_err) < 0.5 * min(rounding), (ours_err, rounding)
    answer = llm.generate(seqs[:1], SamplingParams(max_tokens=8, temperature=0))[0]
    assert answer.cache_hit_tokens > 0  # the same prefix, read back from the fp8 pages the radix cache kept


@pytest.mark.parametrize("mixed", [True, False])
def test_fp8_tokens_do_not_depend_on_batching_chunking_cache_or_preemption(tiny_dir, mixed):  # noqa: F811
    """Each request alone on a large pool is the reference; batched, chunked (7-token steps), on the radix cache and
    preempted in a tiny pool, every request's tokens are the same (fp32 on CPU, pages checked after every step)."""
    prompts = prompts_with_shared_prefix(8)
    p = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    alone = make_llm(tiny_dir, kv_cache_dtype="fp8", max_running_requests=1, radix_cache=False)
    ref = [alone.generate([pr], p)[0].token_ids for pr in prompts]
    for kw in (
        dict(max_batch_tokens=7, mixed_prefill_tokens=3),
        dict(num_pages=34, page_size=4, max_batch_tokens=64),  # preempts: 8 requests of up to 130 tokens
    ):
        llm = make_llm(tiny_dir, kv_cache_dtype="fp8", mixed_batch=mixed, **kw)
        assert [o.token_ids for o in llm.generate(prompts, p)] == ref, kw
        assert llm.metrics().kv_pages_in_use == 0
        if "num_pages" in kw:
            assert llm.engine.scheduler.num_preemptions > 0


def test_what_reads_no_fp8_cache_says_so():
    pool = KVPool.create(1, 4, 4, 2, 8, torch.bfloat16, "cpu", kv_dtype=FP8)
    with pytest.raises(ValueError, match="reads no fp8 KV cache"):
        create_backend("fa", pool, 4, 2, 8, torch.device("cpu"))
    from minisgl_cli.hf_peer import TransformersPeer
    from minisgl_cli.peers import PeerUnavailable

    with pytest.raises(PeerUnavailable, match="has no fp8 KV cache"):
        TransformersPeer(EngineConfig(model="dummy:tiny-llama", device="cpu", kv_cache_dtype="fp8"))
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto, fp8 or fp8_e4m3"):
        EngineConfig(kv_cache_dtype="fp8_e5m2")
