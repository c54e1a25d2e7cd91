"""vLLM's LLM() keywords at vLLM's own default, None ("the engine decides"), as code written for vLLM passes them
(`LLM(model, tokenizer=args.tokenizer, max_num_seqs=args.max_num_seqs)` with argparse's None): our defaults, not a
ValueError for each mapped name or a TypeError for tokenizer / quantization."""

from __future__ import annotations

import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams


def test_vllms_keywords_at_none_take_our_defaults():
    nones = dict.fromkeys(
        ["max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "block_size", "tokenizer", "quantization"]
    )
    tiny = dict(model="dummy:tiny-llama", device="cpu")
    with LLM(**tiny, **nones) as llm, LLM(**tiny) as ref:
        assert llm.config == ref.config
        assert len(llm.generate(["hi"], SamplingParams(max_tokens=2))[0].token_ids) == 2
    with pytest.raises(TypeError, match="tokenizer"):  # a tokenizer named is still refused, naming what to use
        LLM(model="dummy:tiny-llama", device="cpu", tokenizer="org/other")
