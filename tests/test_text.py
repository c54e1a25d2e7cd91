"""Text handling on the real tokenizer: UTF-8-safe streaming, stop strings, chat template, penalties vs HF."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams
from engine.text import TextState
from engine.tokenizer import IncrementalDetokenizer


def test_incremental_detokenizer_never_emits_broken_utf8(smollm):
    tok = smollm.tokenizer
    text = "Café ☕ naïve 東京 emoji 🤖🚀 done."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.add(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text
    assert sum(1 for p in pieces if p == "") > 0  # multi-byte characters did straddle tokens


def test_streamed_deltas_add_up_to_the_final_text(smollm):
    outs = list(
        smollm.stream(
            [{"role": "user", "content": "Say hello in three languages."}], SamplingParams(max_tokens=40, temperature=0)
        )
    )
    assert outs[-1].finished
    full = smollm.tokenizer.decode(outs[-1].token_ids)
    # A character cut off by max_tokens stays out of the text (it would be U+FFFD).
    assert "".join(o.delta_text for o in outs) == outs[-1].text == full.rstrip("\ufffd")
    assert "\ufffd" not in outs[-1].text


def test_stop_string_truncates_and_never_streams_past_it(smollm):
    prompt = [{"role": "user", "content": "Count from one to ten in words, comma separated."}]
    full = smollm.generate([prompt], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0].text
    stop = full[len(full) // 3 : len(full) // 3 + 4]
    assert stop.strip()
    outs = list(smollm.stream(prompt, SamplingParams(max_tokens=40, temperature=0, stop=[stop])))
    final = outs[-1]
    assert final.finish_reason == "stop"
    assert final.text == full[: full.index(stop)]
    assert "".join(o.delta_text for o in outs) == final.text
    assert smollm.metrics().kv_pages_in_use == 0 or smollm.has_work()


def test_chat_template_is_the_models(smollm):
    ids = smollm.encode([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    text = smollm.tokenizer.decode(ids)
    assert "Be brief." in text and "Hi" in text
    assert smollm.tokenizer.hf.decode(ids).count("<|im_start|>") == 3  # system, user, assistant header


def test_repetition_penalty_matches_transformers(smollm, hf_smollm):
    hf = hf_smollm
    ids = smollm.encode("The list of colors: red, green, blue, red, green, blue,")
    out = smollm.generate([ids], SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.3, ignore_eos=True))[
        0
    ]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=20,
            do_sample=False,
            repetition_penalty=1.3,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert out.token_ids == ref[0, len(ids) :].tolist()
    plain = smollm.generate([ids], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    assert plain.token_ids != out.token_ids


def test_stop_strings_and_stop_tokens_wait_for_min_tokens(smollm):
    tok = smollm.tokenizer
    ids = tok.encode(" one, two, three, four")
    assert tok.token_texts(ids)[:4] == [" one", ",", " two", ","]

    def run(**kw) -> tuple[str, str | None]:
        state = TextState.create(tok, [1], SamplingParams(max_tokens=len(ids), **kw))
        for t in ids:
            _, reason, _ = state.advance([t], None, None)
            if reason:
                return state.text, reason
        return state.text, None

    assert run(stop=[","]) == (" one", "stop")
    assert run(stop=[","], min_tokens=3) == (" one, two", "stop")  # the comma at token 2 came too early
    # the engine ends a request at a stop token id; that token's text is left out
    state = TextState.create(tok, [1], SamplingParams(stop_token_ids=[ids[2]]))
    assert state.advance(ids[:3], "stop", None)[0] == " one,"
