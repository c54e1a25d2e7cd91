"""Text handling on the real tokenizer: UTF-8-safe streaming, stop strings, chat template, penalties vs HF."""

from __future__ import annotations

import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.text import Prefix, TextState
from engine.tokenizer import ByteTokenizer, IncrementalDetokenizer


def test_incremental_detokenizer_never_emits_broken_utf8(smollm):
    tok = smollm.tokenizer
    text = "Café ☕ naïve 東京 emoji 🤖🚀 done."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.add(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text
    assert sum(1 for p in pieces if p == "") > 0  # multi-byte characters did straddle tokens


PARTIAL = ["Hi \U0001f30d\U0001f310 \u65e5\u672c\u8a9e \u00e9 \u00f1", "\ufffd itself, \u0085 and \u2028"]


@pytest.mark.parametrize("text", PARTIAL)
def test_token_bytes_join_into_the_texts_utf8(smollm, text):
    """OpenAI's logprobs `bytes`: each token's own, so joined they give the text back, also for tokens that hold part
    of a character (each decodes alone to U+FFFD, whose three bytes are not the token's)."""
    tok = smollm.tokenizer
    ids = tok.encode(text)
    assert any(t.endswith("\ufffd") for t in tok.token_texts(ids))  # the case at hand: partial tokens
    assert b"".join(tok.token_bytes(ids)) == text.encode()
    byte_tok = ByteTokenizer()
    assert b"".join(byte_tok.token_bytes(byte_tok.encode(text))) == text.encode()


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


def test_detokenize_false_gives_the_same_tokens_and_no_text(smollm):
    """Token ids only (bench-offline's mode, as vLLM's detokenize=False): the same tokens and finish reasons, empty
    text and deltas; stop strings, which are matched in the text, are refused rather than ignored."""
    prompt = [{"role": "user", "content": "Say hello in three languages."}]
    kw = dict(max_tokens=30, temperature=0, stop_token_ids=[13])
    text, ids = (smollm.generate([prompt], SamplingParams(**kw, detokenize=d))[0] for d in (True, False))
    assert text.text and ids.token_ids == text.token_ids and ids.finish_reason == text.finish_reason
    streamed = list(smollm.stream(prompt, SamplingParams(**kw, detokenize=False)))
    assert ids.text == "" and all(o.delta_text == "" for o in streamed) and streamed[-1].token_ids == text.token_ids
    with pytest.raises(ValueError, match="stop strings need detokenize=True"):
        SamplingParams(stop=["."], detokenize=False)
    with pytest.raises(ValueError, match="detokenize must be true or false"):
        SamplingParams(detokenize="no")


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
    # the first min_tokens tokens never stop, the stop string in token min_tokens + 1 does (vLLM: once the output
    # is longer than min_tokens, EOS's first chance too); token 2's comma stopped it at min_tokens=2
    assert run(stop=[","], min_tokens=2) == (" one, two", "stop")
    assert run(stop=[" one"], min_tokens=1) == (" one, two, three, four", None)  # it ended in token 1 only
    # of two stop strings matched by one token, the one completed first in the text, whatever the list order: the
    # text never holds a stop string (it was cut at "wo", the first listed, leaving " one, t")
    assert run(stop=["wo", " t"]) == (" one,", "stop")
    # the engine ends a request at a stop token id; that token's text is left out
    state = TextState.create(tok, [1], SamplingParams(stop_token_ids=[ids[2]]))
    assert state.advance(ids[:3], "stop", None)[0] == " one,"


def test_of_stop_strings_one_token_completes_the_first_completed_wins_then_the_first_listed(smollm):
    """vLLM's check_stop_strings (since its #49391): of the stop strings a step's text completes, the one that
    completes first in the text, ties to the first listed; the text is cut at its start (or its end with
    include_stop_str_in_output), as adding the text a character at a time would. Here the one starting first won, so
    stop=[" two", "w"] over the token " two" cut at " two" where the text " one, tw" already held "w"."""
    tok = smollm.tokenizer
    ids = tok.encode(" one, two, three")
    assert tok.token_texts(ids) == [" one", ",", " two", ",", " three"]

    def run(stop: list[str], include: bool = False) -> tuple[str, str | int | None]:
        params = SamplingParams(max_tokens=len(ids), stop=stop, include_stop_str_in_output=include)
        state = TextState.create(tok, [1], params)
        text = ""
        for t in ids:
            delta, reason, _ = state.advance([t], None, None)
            text += delta
            if reason:
                break
        assert reason == "stop" and text == state.text  # what was streamed is the whole text
        return text, state.stop_reason

    for stop in ([" two", "w"], ["w", " two"]):  # "w" completes first, inside the token " two"
        assert run(stop) == (" one, t", "w")
        assert run(stop, include=True) == (" one, tw", "w")
    # both complete at the token's end: the first listed
    assert run(["ee", "hree"]) == (" one, two, thr", "ee")
    assert run(["hree", "ee"]) == (" one, two, t", "hree")
    assert run(["hree", "ee"], include=True) == (" one, two, three", "hree")
    # across token boundaries: ", tw" (tokens 2-3) completes before "two" does
    assert run(["two", ", tw"]) == (" one", ", tw")


def test_prefix_reads_like_the_list_it_snapshots_and_ignores_later_appends():
    items = [10, 11, 12, 13, 14]
    view = Prefix(items)
    items += [15, 16]  # the request kept generating after the snapshot
    ref = [10, 11, 12, 13, 14]
    assert len(view) == 5 and list(view) == ref and view == ref and ref == view and view != ref[:4]
    assert [view[i] for i in range(-5, 5)] == [ref[i] for i in range(-5, 5)]
    for bad in (5, -6):
        with pytest.raises(IndexError):
            view[bad]
    for s in (
        slice(None),
        slice(1, 3),
        slice(3, None),
        slice(-2, None),
        slice(None, None, -1),
        slice(4, 0, -2),
        slice(None, 99),
        slice(-99, 2),
        slice(None, None, 2),
    ):
        assert view[s] == ref[s], s
    assert repr(view) == repr(ref) and view != "10" and 14 in view and 15 not in view


def test_streamed_outputs_are_snapshots_and_the_final_one_a_list(smollm):
    """Each step's output shows the tokens of that step, though it copies nothing (Prefix views of growing lists)."""
    seen = []
    outs = []
    for out in smollm.stream("Count to twenty:", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)):
        outs.append(out)
        seen.append((list(out.token_ids), list(out.token_times)))
    assert len(outs) > 3 and [len(ids) for ids, _ in seen] == list(range(1, 13))
    assert [(list(o.token_ids), list(o.token_times)) for o in outs] == seen  # later steps changed no earlier one
    assert type(outs[-1].token_ids) is list and type(outs[-1].token_times) is list
    assert all(isinstance(o.token_ids, Prefix) for o in outs[:-1])


def test_a_bpe_tokenizer_with_clean_up_on_decodes_as_transformers_does_and_says_nothing():
    """Some transformers versions read the GGUF's tokenizer with clean_up_tokenization_spaces on; transformers 5 then
    skips that clean-up for BPE (it would strip spaces before punctuation) and logs a warning that landed in the chat's
    output. The engine's tokenizer keeps the text and prints nothing."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    code = (
        "from transformers import AutoTokenizer\n"
        "from engine.model_source import embedded_default_path\n"
        "from engine.tokenizer import Tokenizer\n"
        "p = embedded_default_path()\n"
        "hf = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, clean_up_tokenization_spaces=True)\n"
        "assert hf.clean_up_tokenization_spaces\n"
        "tok = Tokenizer(hf)\n"
        "print(repr(tok.decode(tok.encode('Hello , world . Yes !'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr("Hello , world . Yes !")
    assert "clean_up_tokenization" not in r.stderr, r.stderr
