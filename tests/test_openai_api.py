"""The OpenAI API fields evaluation harnesses and clients send, against `minisgl serve` over the real SmolLM2 in fp32,
through the official openai client: log-probabilities equal to log_softmax of Hugging Face transformers' logits on
the same tokens (chat and completions, streamed and not), echo with max_tokens 0, lists of prompts, n and best_of
(the prompt prefilled once), streamed usage (stream_options), logit_bias, min_tokens and stop_token_ids. Bad values
of these fields are in tests/test_serve.py's BAD and tests/test_bad_input.py."""

from __future__ import annotations

import copy

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.server_harness import LiveServer, live_server

TOL = 1e-4  # fp32 engine vs fp32 transformers
CHAT = [{"role": "user", "content": "Name three colors of the rainbow."}]
AS_IDS = {"return_tokens_as_token_ids": True}  # vLLM's extension: logprobs name tokens "token_id:ID"


@pytest.fixture(scope="module")
def server(smollm):
    with live_server(smollm, model_name="smollm") as s:
        yield s


@torch.no_grad()
def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row p is the model's log-distribution of the token at p + 1."""
    return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def ids_of(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def check_position(row: torch.Tensor, token: int, logprob: float, top: dict[int, float], k: int) -> None:
    """One position's reported log-probabilities against the reference distribution `row`."""
    assert abs(logprob - row[token].item()) < TOL, (token, logprob, row[token].item())
    best = set(row.topk(k).indices.tolist())
    assert best <= set(top) <= best | {token}  # the top k (completions also list the chosen token)
    for t, lp in top.items():
        assert abs(lp - row[t].item()) < TOL, (t, lp, row[t].item())


def counters(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels.get("le")
    }


# ---- log-probabilities against transformers ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_equal_transformers(server, hf_smollm, stream):
    client = server.openai()
    # sampled at temperature 0.7 with top_p: the reported logprobs are still the raw model's (vLLM's default)
    kw = dict(model="smollm", messages=CHAT, max_tokens=8, temperature=0.7, top_p=0.9, seed=5, logprobs=True)
    if stream:
        chunks = list(client.chat.completions.create(**kw, top_logprobs=3, stream=True, extra_body=AS_IDS))
        entries = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    else:
        out = client.chat.completions.create(**kw, top_logprobs=3, extra_body=AS_IDS)
        entries, text = out.choices[0].logprobs.content, out.choices[0].message.content
        assert out.usage.completion_tokens == len(entries) == 8
    ids = ids_of([e.token for e in entries])
    prompt = server.llm.encode(CHAT)
    ref = hf_logprobs(hf_smollm, prompt + ids)
    for j, e in enumerate(entries):
        top = dict(zip(ids_of([t.token for t in e.top_logprobs]), [t.logprob for t in e.top_logprobs]))
        assert len(e.top_logprobs) == 3
        check_position(ref[len(prompt) - 1 + j], ids[j], e.logprob, top, 3)
    assert text == server.llm.tokenizer.decode(ids)
    # the same answer without the extension names the tokens by their text, with their UTF-8 bytes
    plain = client.chat.completions.create(**kw, stream=False).choices[0].logprobs.content
    assert [e.token for e in plain] == server.llm.tokenizer.token_texts(ids)
    assert [bytes(e.bytes) for e in plain] == [t.encode() for t in server.llm.tokenizer.token_texts(ids)]
    assert all(e.top_logprobs == [] for e in plain)  # top_logprobs not asked: none listed


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_logprobs_equal_transformers(server, hf_smollm, stream):
    client = server.openai()
    prompt = "The three primary colors are"
    kw = dict(model="smollm", prompt=prompt, max_tokens=6, temperature=0, logprobs=2, extra_body=AS_IDS)
    if stream:
        chunks = list(client.completions.create(**kw, stream=True))
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        tokens = [t for lp in lps for t in lp.tokens]
        token_lps = [x for lp in lps for x in lp.token_logprobs]
        tops = [x for lp in lps for x in lp.top_logprobs]
        offsets = [x for lp in lps for x in lp.text_offset]
    else:
        lp = client.completions.create(**kw).choices[0].logprobs
        tokens, token_lps, tops, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    ids, p = ids_of(tokens), server.llm.encode(prompt)
    assert len(ids) == 6
    ref = hf_logprobs(hf_smollm, p + ids)
    for j, t in enumerate(ids):
        check_position(ref[len(p) - 1 + j], t, token_lps[j], dict(zip(ids_of(list(tops[j])), tops[j].values())), 2)
    assert offsets == [sum(len(s) for s in tokens[:j]) for j in range(len(tokens))]


def test_echo_with_max_tokens_0_scores_the_prompts(server, hf_smollm):
    """lm-evaluation-harness's log-likelihood request: echo, max_tokens 0, logprobs 1, a batch of token-id prompts."""
    client, tok = server.openai(), server.llm.tokenizer
    prompts = [tok.encode("Paris is the capital of France."), tok.encode("Paris is the capital of Spain.")]
    out = client.completions.create(model="smollm", prompt=prompts, max_tokens=0, echo=True, logprobs=1, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (sum(map(len, prompts)), 0)
    scores = []
    for c, p in zip(out.choices, prompts):
        lp = c.logprobs
        assert (c.text, c.finish_reason) == (tok.decode(p), "length")
        assert lp.tokens == tok.token_texts(p) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        ref = hf_logprobs(hf_smollm, p)
        for j in range(1, len(p)):
            assert abs(lp.token_logprobs[j] - ref[j - 1, p[j]].item()) < TOL
            assert len(lp.top_logprobs[j]) in (1, 2)  # the most likely token, and the prompt's own if it is another
        scores.append(sum(lp.token_logprobs[1:]))
    assert scores[0] > scores[1]  # the real model, really scoring
    # again, now that the prompts are in the prefix cache (prompt logprobs recompute them), streamed, one more token
    chunks = list(
        client.completions.create(
            model="smollm", prompt=prompts[0], max_tokens=1, echo=True, logprobs=1, temperature=0, stream=True
        )
    )
    lps = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    again = [x for lp in lps for x in lp.token_logprobs]
    assert "".join(c.choices[0].text for c in chunks).startswith(tok.decode(prompts[0]))
    assert len(again) == len(prompts[0]) + 1 and again[0] is None
    assert max(abs(a - b) for a, b in zip(again[1:-1], out.choices[0].logprobs.token_logprobs[1:])) < TOL
    # a prompt holding special tokens echoes them, as vLLM's decode of token-id prompts (they were dropped)
    turn = tok.encode_chat([{"role": "user", "content": "Hi"}])
    echoed = client.completions.create(model="smollm", prompt=turn, max_tokens=0, echo=True).choices[0].text
    assert echoed == tok.hf.decode(turn) and "<|im_start|>" in echoed  # transformers' default decode


def test_tokens_holding_part_of_a_character_keep_their_bytes_and_logprobs(server, hf_smollm):
    """A byte-level BPE token holding part of a UTF-8 character reads as U+FFFD alone. Chat's `bytes` are still the
    token's own (joined, the text's UTF-8), and completions' top_logprobs, keyed by token text where several such
    tokens share " \ufffd", still give the chosen token its own log-probability."""
    client, tok = server.openai(), server.llm.tokenizer
    globe = tok.encode(" \U0001f30d")  # three tokens, each part of the one character
    assert tok.token_texts(globe)[0] == " \ufffd" and b"".join(tok.token_bytes(globe)) == " \U0001f30d".encode()
    kw = dict(model="smollm", messages=CHAT, max_tokens=1, temperature=0, logprobs=True, top_logprobs=2)
    e = client.chat.completions.create(**kw, logit_bias={str(globe[0]): 100}).choices[0].logprobs.content[0]
    assert (e.token, bytes(e.bytes)) == (" \ufffd", b" \xf0\x9f")  # the first two of the globe's four bytes
    prompt = tok.encode("Earth from space: \U0001f30d\U0001f310 and \u65e5\u672c")
    lp = client.completions.create(model="smollm", prompt=prompt, max_tokens=0, echo=True, logprobs=5).choices[0]
    lp = lp.logprobs
    ref = hf_logprobs(hf_smollm, prompt)
    assert sum(t.endswith("\ufffd") for t in lp.tokens) >= 6
    for j in range(1, len(prompt)):
        assert lp.top_logprobs[j][lp.tokens[j]] == lp.token_logprobs[j]  # the chosen token's, not a namesake's
        assert abs(lp.token_logprobs[j] - ref[j - 1, prompt[j]].item()) < TOL
        for text, value in lp.top_logprobs[j].items():  # each text the best of the tokens that read so
            if text != lp.tokens[j]:
                best = max(
                    ref[j - 1, t].item() for t in ref[j - 1].topk(5).indices.tolist() if tok.token_texts([t])[0] == text
                )
                assert abs(value - best) < TOL


# ---- n, best_of, lists of prompts --------------------------------------------------------------------------------


def test_n_choices_are_seeded_reproducible_and_share_the_prefilled_prompt(server):
    client = server.openai()
    prompt = (
        "Here is a story about a dragon who learned to paint with fire, told in the voice of an old sailor who "
        "had seen every harbour between the cold northern seas and the warm islands of the south:"
    )
    p = len(server.llm.encode(prompt))
    kw = dict(model="smollm", prompt=prompt, max_tokens=4, temperature=1.0, seed=11, n=4)
    before = counters(server)
    out = client.completions.create(**kw)
    after = counters(server)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == p and out.usage.completion_tokens == 4 * 4
    # choice 0 prefilled the prompt; the other three read its whole pages from the prefix cache
    assert after["minisgl:prompt_tokens_total"] - before["minisgl:prompt_tokens_total"] == 4 * p
    hits = after["minisgl:prefix_cache_hits_total"] - before["minisgl:prefix_cache_hits_total"]
    assert p >= 32 and hits == 3 * ((p - 1) // 16 * 16)
    texts = [c.text for c in out.choices]
    assert len(set(texts)) > 1  # independent samples
    assert [c.text for c in client.completions.create(**kw).choices] == texts  # reproducible
    single = client.completions.create(**{**kw, "n": 1, "seed": 13})  # choice j is seeded with seed + j
    assert single.choices[0].text == texts[2]


def test_a_choice_whose_seed_is_minus_1_is_seeded(server):
    """seed -2 with n 2 gives choice 1 the seed -1, which is a seed there (vLLM's children keep it), not the user's
    "no seed": it was re-read as none on the way to the engine, and that choice drew afresh each time."""
    client = server.openai()
    kw = dict(model="smollm", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=-2, n=2)
    runs = [[c.text for c in client.completions.create(**kw).choices] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_best_of_returns_the_sample_of_highest_mean_logprob(server):
    client = server.openai()
    kw = dict(model="smollm", prompt="My favourite animal is", max_tokens=6, temperature=1.0)
    singles = [client.completions.create(**kw, seed=21 + j, logprobs=0).choices[0] for j in range(3)]
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in singles]
    out = client.completions.create(**kw, seed=21, n=1, best_of=3)
    assert len(out.choices) == 1 and out.choices[0].logprobs is None
    assert out.choices[0].text == singles[means.index(max(means))].text
    assert out.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in singles)  # every sample made counts


def test_a_list_of_prompts_equals_single_requests(server):
    client = server.openai()
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(8)]
    kw = dict(model="smollm", max_tokens=3, temperature=0)
    singles = [client.completions.create(prompt=p, **kw) for p in prompts]
    batch = client.completions.create(prompt=prompts, **kw)
    assert [c.index for c in batch.choices] == list(range(8))
    assert [(c.text, c.finish_reason) for c in batch.choices] == [
        (s.choices[0].text, s.choices[0].finish_reason) for s in singles
    ]
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    streamed = [""] * 8
    for chunk in client.completions.create(prompt=prompts, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == [s.choices[0].text for s in singles]


# ---- stream_options.continuous_usage_stats ------------------------------------------------------------------------

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _stream(client, chat: bool, **kw) -> list:
    if chat:
        return list(client.chat.completions.create(messages=CHAT, stream=True, **kw))
    return list(client.completions.create(prompt="The three primary colors are", stream=True, **kw))


def _create(client, chat: bool, **kw):
    if chat:
        return client.chat.completions.create(messages=CHAT, **kw)
    return client.completions.create(prompt="The three primary colors are", **kw)


def _tokens_in(choice, chat: bool) -> int:
    """The tokens a streamed choice's chunk carries, counted by its log-probabilities (one entry a token)."""
    if choice.logprobs is None:
        return 0
    return len(choice.logprobs.content or []) if chat else len(choice.logprobs.tokens or [])


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_continuous_usage_stats_put_each_choices_usage_so_far_on_every_chunk(server, chat, n):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries the usage of its own choice so far (per
    choice, not summed over the n), and the last usage-only chunk the totals, which equal the unstreamed answer's."""
    client = server.openai()
    kw = dict(model="smollm", max_tokens=10, temperature=1.0, seed=3, n=n)
    whole = _create(client, chat, **kw).usage
    # logprobs: every output of the engine is a chunk, so the tokens chunks carry count what the usage says
    lp = dict(logprobs=True, top_logprobs=0) if chat else dict(logprobs=0)
    chunks = _stream(client, chat, stream_options=CONTINUOUS, **kw, **lp)
    *content, last = chunks
    final = last.usage
    assert last.choices == []
    assert (final.prompt_tokens, final.completion_tokens, final.total_tokens) == (
        whole.prompt_tokens,
        whole.completion_tokens,
        whole.total_tokens,
    )
    seen = {i: [] for i in range(n)}
    carried = dict.fromkeys(range(n), 0)
    for c in content:
        (choice,) = c.choices
        u = c.usage
        assert u is not None and u.prompt_tokens == whole.prompt_tokens
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        carried[choice.index] += _tokens_in(choice, chat)
        assert u.completion_tokens == carried[choice.index]  # this choice's tokens sent so far, no other's
        seen[choice.index].append(u.completion_tokens)
    for i, counts in seen.items():
        assert counts == sorted(counts) and counts[-1] > 0, (i, counts)
        if chat:
            assert counts[0] == 0  # the role chunk, before any token
    assert sum(counts[-1] for counts in seen.values()) == final.completion_tokens
    if n == 2:  # per choice: each choice's own count ends below the total
        assert all(0 < counts[-1] < final.completion_tokens for counts in seen.values())
    else:
        assert seen[0][-1] == final.completion_tokens


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_stream_usage_follows_include_usage_as_vllm(server, chat):
    """include_usage absent beside continuous_usage_stats: true is taken as true (vLLM's default); an explicit
    false turns all usage off (vLLM ignores continuous_usage_stats then); without continuous_usage_stats only the
    last chunk carries usage, and without stream_options none does."""
    client = server.openai()
    kw = dict(model="smollm", max_tokens=6, temperature=0)
    plain = _stream(client, chat, **kw)
    assert all(c.usage is None for c in plain)

    def text(chunks) -> str:
        return "".join((ch.delta.content or "") if chat else ch.text for c in chunks for ch in c.choices)

    implied = _stream(client, chat, stream_options={"continuous_usage_stats": True}, **kw)
    *content, last = implied
    assert last.choices == [] and last.usage.completion_tokens == 6
    counts = [c.usage.completion_tokens for c in content]  # without logprobs: chunks of text only
    assert counts == sorted(counts) and (counts[0] == 0) == chat  # chat's role chunk comes before any token
    assert counts[-1] == 6 and all(
        c.usage.total_tokens == last.usage.prompt_tokens + k for c, k in zip(content, counts)
    )
    off = _stream(client, chat, stream_options={"include_usage": False, "continuous_usage_stats": True}, **kw)
    assert all(c.usage is None and c.choices for c in off)
    final_only = _stream(client, chat, stream_options={"include_usage": True}, **kw)
    *content, last = final_only
    assert all(c.usage is None for c in content) and last.choices == [] and last.usage.completion_tokens == 6
    assert text(plain) == text(implied) == text(off) == text(final_only)


# ---- logit_bias, min_tokens, stop_token_ids -----------------------------------------------------------------------


def _ids(client, **kw) -> list[int]:
    return ids_of(
        client.completions.create(model="smollm", logprobs=0, extra_body=AS_IDS, **kw).choices[0].logprobs.tokens
    )


def test_logit_bias_bans_and_forces_tokens(server):
    client = server.openai()
    kw = dict(prompt="The capital of France is", max_tokens=8)
    greedy = _ids(client, temperature=0, **kw)
    top = max(set(greedy), key=greedy.count)  # the token greedy decoding emits most
    ban = {"logit_bias": {str(top): -100}}
    assert top not in _ids(client, temperature=0, **kw, **ban)
    for seed in range(2):
        assert top not in _ids(client, temperature=1.0, seed=seed, top_p=0.9, **kw, **ban)
    forced = server.llm.tokenizer.encode(" banana")[0]
    assert _ids(client, temperature=0.8, seed=1, logit_bias={str(forced): 100}, **kw) == [forced] * 8


def test_min_tokens_and_stop_token_ids(server):
    client, tok = server.openai(), server.llm.tokenizer
    kw = dict(model="smollm", messages=[{"role": "user", "content": "Say hi."}], temperature=0, max_tokens=60)
    short = client.chat.completions.create(**kw, logprobs=True, extra_body=AS_IDS)
    ids = ids_of([e.token for e in short.choices[0].logprobs.content])
    assert short.choices[0].finish_reason == "stop" and len(ids) < 40  # ended by EOS
    assert short.choices[0].model_extra["stop_reason"] is None  # vLLM's: no stop string or stop token id
    longer = client.chat.completions.create(**kw, extra_body={"min_tokens": len(ids) + 5})
    assert longer.usage.completion_tokens >= len(ids) + 5
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content[:5])
    j = next(j for j in range(2, len(ids)) if ids[j] not in ids[:j])
    cut = client.chat.completions.create(**kw, extra_body={"stop_token_ids": [ids[j]]})
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("stop", j + 1)
    assert cut.choices[0].model_extra["stop_reason"] == ids[j]  # vLLM's: the stop token id that matched
    assert cut.choices[0].message.content == tok.decode(ids[:j])  # the stop token's own text is left out
    kept = client.chat.completions.create(
        **kw, extra_body={"stop_token_ids": [ids[j]], "include_stop_str_in_output": True}
    )
    assert kept.choices[0].message.content == tok.decode(ids[: j + 1])  # vLLM's include_stop_str_in_output: kept
    m = server.wait_idle()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0)


def first_stop(text: str, stop: list[str], include: bool) -> tuple[str, str]:
    """The reference for stop strings: the text read a character at a time, cut where a stop string is first
    complete (of several complete there, the first listed), before it or, with include, after it."""
    for end in range(1, len(text) + 1):
        hit = next((s for s in stop if text[:end].endswith(s)), None)
        if hit is not None:
            return text[: end if include else end - len(hit)], hit
    raise AssertionError(f"no stop string of {stop} in {text!r}")


def test_overlapping_stop_strings_cut_where_the_text_first_holds_one(server):
    """Stop strings of a greedy answer that overlap, one token's text completing both, or that span tokens: the
    answer (streamed or not, with include_stop_str_in_output or without) and its stop_reason are the text cut where
    it first holds one (vLLM's rule since its #49391). The one starting first won here: stop=["e answer", "an"] over
    "...The answer" cut the text at "e answer", leaving "Th" where the text "The an" already held "an"."""
    client, tok = server.openai(), server.llm.tokenizer
    kw = dict(model="smollm", prompt="The capital of France is", max_tokens=24, temperature=0)
    full = client.completions.create(**kw, logprobs=0, extra_body=AS_IDS).choices[0]
    texts, text = tok.token_texts(ids_of(full.logprobs.tokens)), full.text
    assert "".join(texts) == text
    # a token of 4+ characters whose inner pair first appears in it: the token completes both that pair and a
    # string running from the token before to its end, which starts first and completes last
    k = next(
        k
        for k, t in enumerate(texts)
        if k and len(t) >= 4 and text.find(t[1:3]) == len("".join(texts[:k])) + 1 and texts[k - 1]
    )
    at = len("".join(texts[:k]))
    spanning, inner, tail = text[at - 1 : at + len(texts[k])], texts[k][1:3], texts[k][-2:]
    cases = [[spanning, inner], [inner, spanning], [texts[k], tail], [tail, texts[k]]]
    for stop in cases:
        for include in (False, True):
            want, reason = first_stop(text, stop, include)
            body = {"stop": stop, "include_stop_str_in_output": include}
            got = client.completions.create(**kw, extra_body=body).choices[0]
            assert (got.text, got.finish_reason, got.model_extra["stop_reason"]) == (want, "stop", reason), stop
            chunks = list(client.completions.create(**kw, stream=True, extra_body=body))
            assert "".join(c.choices[0].text for c in chunks) == want, stop
            assert chunks[-1].choices[0].model_extra["stop_reason"] == reason
    m = server.wait_idle()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0)


# ---- text that is not Unicode -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, param, message",
    [
        ("/v1/completions", '{"prompt": "\\ud800", "max_tokens": 2}', "prompt", "prompt holds a lone UTF-16 surrogate"),
        ("/v1/completions", '{"prompt": ["ok", "a\\udfffb"]}', "prompt", "'\\udfff' at character 1"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 2}',
            "messages",
            "messages[0].content holds a lone UTF-16 surrogate '\\ud800' at character 3",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
            "messages",
            "messages[0].content holds a lone UTF-16 surrogate",
        ),
        ("/v1/completions", '{"prompt": "hi", "stop": ["\\ud800"]}', "stop", "stop must be valid Unicode"),
    ],
    ids=["prompt", "prompt-list", "chat", "chat-part", "stop"],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param, message):
    """JSON may spell a lone UTF-16 surrogate ("\\ud800"); it is no Unicode text, and the real tokenizer raised a
    TypeError on it (a 500). It is refused naming the field, and the server serves on."""
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", param), err
    assert message in err["message"], err
    ok = server.openai().completions.create(model="smollm", prompt="Hi", max_tokens=2)
    assert ok.usage.completion_tokens == 2


# ---- message names -------------------------------------------------------------------------------------------------

NAMED_TEMPLATE = (  # newlines as expressions: HF renders templates with trim_blocks
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] }}{% if m.name %}{{ ' ' + m.name }}{% endif %}"
    "{{ '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}"
)


def test_message_names_reach_the_chat_template(server):
    """A message's `name` is handed to the chat template: a template that renders it (here one that does) puts it in
    the prompt; SmolLM2's own ignores it, as the model was never shown names."""
    client = server.openai()
    named = [{"role": "user", "content": "Who am I?", "name": "Alice"}]
    plain = [{"role": "user", "content": "Who am I?"}]
    kw = dict(model="smollm", max_tokens=6, temperature=0)
    same = [client.chat.completions.create(messages=m, **kw) for m in (named, plain)]
    assert same[0].choices[0].message.content == same[1].choices[0].message.content
    assert same[0].usage.prompt_tokens == same[1].usage.prompt_tokens

    tok = copy.copy(server.remote.tokenizer)
    tok.hf = copy.deepcopy(tok.hf)
    tok.hf.chat_template = NAMED_TEMPLATE
    prompt = tok.chat_prompt(named)
    assert prompt == "<|im_start|>user Alice\nWho am I?<|im_end|>\n<|im_start|>assistant\n"
    original, server.remote.tokenizer = server.remote.tokenizer, tok  # the front end's tokenizer, for this test
    try:
        outs = [client.chat.completions.create(messages=m, **kw) for m in (named, plain)]
    finally:
        server.remote.tokenizer = original
    ref = client.completions.create(prompt=prompt, **kw)  # the same prompt as text: the same answer
    assert outs[0].choices[0].message.content == ref.choices[0].text
    assert outs[0].usage.prompt_tokens == ref.usage.prompt_tokens == len(tok.encode(prompt))
    assert outs[1].usage.prompt_tokens < outs[0].usage.prompt_tokens  # the name was in the prompt


# ---- keys inside messages ------------------------------------------------------------------------------------------


def test_an_sdk_dump_of_an_answer_goes_back_as_it_is_and_keys_that_change_it_are_refused(server):
    """Keys inside a message were ignored, whatever they asked: DeepSeek's `"prefix": true` (continue the last
    assistant message), an assistant's `refusal` text, `audio`, a `tool_call_id` were dropped and the answer was the
    one without them. The openai SDK's dump of an earlier answer (`refusal`, `annotations`, `audio`, `function_call`,
    `tool_calls` at null, with this server's `reasoning` fields) gives the answer the plain message gets; each key at
    a value that would change the prompt is a 400 naming it, and an unknown key is too."""
    import openai

    client = server.openai()
    kw = dict(model="smollm", max_tokens=6, temperature=0)
    first = client.chat.completions.create(messages=CHAT, **kw).choices[0].message
    dump = first.model_dump()
    assert {"refusal", "annotations", "audio", "function_call", "tool_calls", "reasoning"} <= dump.keys(), dump
    follow = {"role": "user", "content": "And three more?"}
    plain = {"role": "assistant", "content": first.content}
    ref = client.chat.completions.create(messages=[*CHAT, plain, follow], **kw)
    for sent in (dump, {**dump, "tool_calls": [], "annotations": [], "refusal": ""}, {**plain, "prefix": False}):
        out = client.chat.completions.create(messages=[*CHAT, sent, follow], **kw)
        assert out.choices[0].message.content == ref.choices[0].message.content, sent
        assert out.usage.prompt_tokens == ref.usage.prompt_tokens
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for key, value, why in [
        ("prefix", True, "send continue_final_message: true and add_generation_prompt: false"),
        ("refusal", "I cannot help.", "send its text as the content"),
        ("audio", {"id": "audio_1"}, "audio is not supported"),
        ("tool_calls", [call], "tools are not supported"),
        ("tool_call_id", "c1", "tools are not supported"),
        ("parsed", {"a": 1}, "structured outputs are not supported"),
        ("x-note", 1, None),
    ]:
        for messages in ([*CHAT, {**plain, key: value}], [*CHAT, {**plain, key: value}, follow]):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(messages=messages, **kw)
            err = e.value.body
            assert err["param"] == "messages", err
            if why is None:
                assert err["message"] == "Unrecognized request argument supplied: messages[1].x-note", err
            else:
                assert err["message"].startswith(f"messages[1].{key}={value!r} is not supported"), err
                assert why in err["message"] and err["code"] == "unsupported_parameter", err
    # the way the prefix hint names: the answer continues the last assistant message
    prefilled = [*CHAT, {"role": "assistant", "content": "Red,"}]
    cont = dict(add_generation_prompt=False, continue_final_message=True)
    out = client.chat.completions.create(messages=prefilled, **kw, extra_body=cont)
    prompt = server.llm.tokenizer.chat_prompt(prefilled, **cont)
    assert (
        prompt.endswith("Red,")
        and out.choices[0].message.content == client.completions.create(prompt=prompt, **kw).choices[0].text
    )
