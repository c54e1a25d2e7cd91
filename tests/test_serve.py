"""`minisgl serve` end to end: a real uvicorn server on a loopback port, spoken to with the official openai client
and raw httpx, checked against the in-process engine (LLM.generate with the same parameters)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.sampling_params import SamplingParams
from engine.text import ChatPrompt
from tests.conftest import free_port, make_llm, wait_healthy
from tests.server_harness import LiveServer, live_server

TINY = dict(max_running_requests=8, num_pages=256)  # dummy:tiny-llama: vocab 512, context 2048, byte tokenizer
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colors of the rainbow."},
]
COMPLETE = "The three primary colors are"
# the real model's reference cases, each run alone in-process before the server takes the engine over
SMOL_CASES = {
    "complete": (COMPLETE, SamplingParams(temperature=0, max_tokens=20)),
    "chat": (CHAT, SamplingParams(temperature=0, max_tokens=20)),
    "sampled": (
        "Once upon a time",
        SamplingParams(
            temperature=0.9,
            top_p=0.95,
            top_k=50,
            seed=1234,
            max_tokens=16,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.1,
        ),
    ),
}


@pytest.fixture(scope="module")
def smol(smollm):
    refs = {name: smollm.generate([prompt], params)[0] for name, (prompt, params) in SMOL_CASES.items()}
    # a stop string that completes on the last allowed token: the text's last word, found nowhere before it
    stop = _last_word(refs["complete"].text)
    refs["stop_at_last"] = smollm.generate([COMPLETE], SamplingParams(temperature=0, max_tokens=20, stop=[stop]))[0]
    with live_server(smollm, model_name="smollm") as server:
        yield server, refs


@pytest.fixture(scope="module")
def tiny():
    with live_server(make_llm(**TINY)) as server:
        yield server


def _last_word(text: str) -> str:
    word = text.split()[-1]
    assert text.endswith(word) and text.find(word) == len(text) - len(word), text
    return word


def _stream_text(stream, chat: bool) -> tuple[str, list[str | None], list]:
    """Joined text, every chunk's finish_reason, and the usage objects seen."""
    text, reasons, usages = [], [], []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for c in chunk.choices:
            text.append((c.delta.content or "") if chat else c.text)
            reasons.append(c.finish_reason)
    return "".join(text), reasons, usages


def _families(server: LiveServer) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


# ---- the real model: same text as the in-process engine ----------------------------------------------------------


def test_completion_greedy_matches_engine_streaming_and_not(smol):
    server, refs = smol
    ref, client = refs["complete"], server.openai()
    assert ref.text.strip() and ref.finish_reason == "length"
    out = client.completions.create(model="smollm", prompt=COMPLETE, max_tokens=20, temperature=0)
    assert out.choices[0].text == ref.text and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        len(ref.prompt_token_ids),
        len(ref.token_ids),
        len(ref.prompt_token_ids) + len(ref.token_ids),
    )
    assert out.usage.prompt_tokens == len(server.llm.tokenizer.encode(COMPLETE))

    stream = client.completions.create(
        model="smollm",
        prompt=COMPLETE,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reasons, usages = _stream_text(stream, chat=False)
    assert text == ref.text and reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert len(usages) == 1
    assert (usages[0].prompt_tokens, usages[0].completion_tokens) == (len(ref.prompt_token_ids), 20)


def test_chat_greedy_matches_engine_streaming_and_not(smol):
    server, refs = smol
    ref, client = refs["chat"], server.openai()
    assert ref.text.strip()
    out = client.chat.completions.create(model="smollm", messages=CHAT, max_completion_tokens=20, temperature=0)
    msg = out.choices[0].message
    assert (msg.role, msg.content, out.choices[0].finish_reason) == ("assistant", ref.text, ref.finish_reason)
    assert out.usage.prompt_tokens == len(server.llm.encode(CHAT)) == len(ref.prompt_token_ids)
    assert out.usage.completion_tokens == len(ref.token_ids)

    chunks = list(
        client.chat.completions.create(model="smollm", messages=CHAT, max_tokens=20, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk
    text, reasons, _ = _stream_text(chunks, chat=True)
    assert text == ref.text and reasons[-1] == ref.finish_reason


def test_stop_string_ends_the_text_before_it(smol):
    server, refs = smol
    ref = refs["complete"]
    words = ref.text.split()
    assert len(words) >= 3, ref.text
    stop = words[2]
    want = ref.text[: ref.text.index(stop)]
    client = server.openai()
    out = client.completions.create(model="smollm", prompt=COMPLETE, max_tokens=20, temperature=0, stop=[stop, "@@@"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (want, "stop")
    assert out.choices[0].model_extra["stop_reason"] == stop  # vLLM's: the stop string that matched
    assert out.usage.completion_tokens < len(ref.token_ids)
    chunks = list(
        client.completions.create(model="smollm", prompt=COMPLETE, max_tokens=20, temperature=0, stop=stop, stream=True)
    )
    text, reasons, _ = _stream_text(chunks, chat=False)
    assert (text, reasons[-1]) == (want, "stop")
    assert [c.choices[0].model_extra["stop_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [stop]
    out = client.completions.create(model="smollm", prompt=COMPLETE, max_tokens=3, temperature=0)
    assert (out.choices[0].finish_reason, out.choices[0].model_extra["stop_reason"]) == ("length", None)
    # vLLM's include_stop_str_in_output (it was refused): the stop string stays in the text, whole or streamed
    kept = dict(model="smollm", prompt=COMPLETE, max_tokens=20, temperature=0, stop=[stop, "@@@"])
    out = client.completions.create(**kept, extra_body={"include_stop_str_in_output": True})
    assert (out.choices[0].text, out.choices[0].finish_reason) == (want + stop, "stop")
    assert out.choices[0].model_extra["stop_reason"] == stop
    stream = client.completions.create(**kept, stream=True, extra_body={"include_stop_str_in_output": True})
    text, reasons, _ = _stream_text(stream, chat=False)
    assert (text, reasons[-1]) == (want + stop, "stop")


def test_skip_special_tokens_in_every_endpoint_as_vllm_and_sglang_take_it(smol):
    """vLLM's skip_special_tokens / spaces_between_special_tokens (SGLang's in /generate's sampling_params) were
    refused with a 400: false shows the special tokens the answer holds (greedy with ignore_eos runs past SmolLM2's
    <|im_end|>) as transformers decodes the answer's ids, whole and streamed, in completions, chat, responses and
    /generate alike; left out, the text is as before."""
    server, _ = smol
    hf, client = server.llm.tokenizer.hf, server.openai()
    conv = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    ids = server.llm.encode(conv)
    switches = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    sglang = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, **switches}
    r = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": sglang}, timeout=120)
    assert r.status_code == 200, r.text
    out_ids = r.json()["output_ids"]
    want = hf.decode(out_ids, **switches)
    assert r.json()["text"] == want and "<|im_end|>" in want
    assert _sse_events(server.url + "/generate", {"input_ids": ids, "sampling_params": sglang})[-1]["text"] == want
    greedy, extra = dict(model=server.model, max_tokens=12, temperature=0), {"ignore_eos": True, **switches}
    assert client.completions.create(prompt=ids, extra_body=extra, **greedy).choices[0].text == want
    stream = client.completions.create(prompt=ids, stream=True, extra_body=extra, **greedy)
    assert _stream_text(stream, chat=False)[0] == want
    assert client.chat.completions.create(messages=conv, extra_body=extra, **greedy).choices[0].message.content == want
    stream = client.chat.completions.create(messages=conv, stream=True, extra_body=extra, **greedy)
    assert _stream_text(stream, chat=True)[0] == want
    extra = {"ignore_eos": True, "skip_special_tokens": False}  # vLLM's responses take no spaces_between_...
    r = client.responses.create(model=server.model, input=conv, max_output_tokens=12, temperature=0, extra_body=extra)
    assert r.output_text == want
    plain = client.chat.completions.create(messages=conv, extra_body={"ignore_eos": True}, **greedy)
    assert plain.choices[0].message.content == hf.decode(out_ids, skip_special_tokens=True) != want  # the default
    assert server.live_requests() == 0


def test_stop_string_on_the_last_allowed_token_finishes_with_stop(smol):
    """The stop string completes on token max_tokens: the engine says "length", but the text is cut at the stop
    string, so the choice finished because of it (vLLM's rule), in-process and through the server alike."""
    server, refs = smol
    full, ref = refs["complete"], refs["stop_at_last"]
    stop = _last_word(full.text)
    want = full.text[: -len(stop)]
    assert (ref.text, ref.finish_reason, len(ref.token_ids)) == (want, "stop", 20)
    client = server.openai()
    kw = dict(model="smollm", prompt=COMPLETE, max_tokens=20, temperature=0, stop=[stop])
    out = client.completions.create(**kw)
    assert (out.choices[0].text, out.choices[0].finish_reason) == (want, "stop")
    text, reasons, _ = _stream_text(client.completions.create(**kw, stream=True), chat=False)
    assert (text, reasons[-1]) == (want, "stop")


def test_seeded_sampling_with_penalties_matches_engine(smol):
    server, refs = smol
    ref = refs["sampled"]
    kw = dict(
        model="smollm",
        prompt="Once upon a time",
        max_tokens=16,
        temperature=0.9,
        top_p=0.95,
        seed=1234,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        extra_body={"top_k": 50, "repetition_penalty": 1.1},
    )
    client = server.openai()
    texts = [client.completions.create(**kw).choices[0].text for _ in range(2)]
    assert texts == [ref.text, ref.text]
    other = client.completions.create(**{**kw, "seed": 4321}).choices[0].text
    assert other != ref.text  # the seed really reaches the sampler


def test_a_long_prompt_is_tokenized_off_the_event_loop(smol):
    """A 1.2 MB prompt takes the real tokenizer about a second, and a 12 MB one ten: tokenized on the front end's
    event loop, it held /health and every open stream for that long, then got its 400 for exceeding the context.
    /health must keep answering while such a prompt is tokenized."""
    server, _ = smol
    done = threading.Event()
    reply: list[httpx.Response] = []

    def big() -> None:
        body = {"model": "smollm", "prompt": "hello world " * 100_000, "max_tokens": 1}
        reply.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=120))
        done.set()

    thread = threading.Thread(target=big)
    thread.start()
    answered = 0
    with httpx.Client(timeout=120) as http:
        while not done.is_set():
            assert http.get(f"{server.url}/health").status_code == 200
            answered += not done.is_set()
            time.sleep(0.01)
    thread.join()
    assert reply[0].status_code == 400 and "exceeds the model's context length" in reply[0].text, reply[0].text
    # on the loop: one or two, before the prompt arrived and after its refusal (off it, 9-30 by the machine's speed)
    assert answered >= 5, answered


# ---- the tiny model: protocol, errors, admission, metrics ---------------------------------------------------------


def test_models_health_and_token_id_prompts(tiny):
    client = tiny.openai()
    assert [m.id for m in client.models.list().data] == [tiny.model] == ["tiny-llama"]
    card = client.models.retrieve(tiny.model)  # GET /v1/models/{id}
    assert (card.id, card.object, card.owned_by, card.model_extra["max_model_len"]) == (
        "tiny-llama",
        "model",
        "minisgl",
        2048,
    )
    assert card == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert (e.value.body["param"], e.value.body["code"]) == ("model", "model_not_found")
    assert "model 'gpt-4' does not exist; this server serves 'tiny-llama'" in e.value.body["message"]
    assert httpx.get(f"{tiny.url}/health").status_code == 200
    r = httpx.post(f"{tiny.url}/v1/completions", content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "request body must be a JSON object, sent as application/json" in r.text, r.text
    ids = [72, 101, 108, 108, 111, 300, 7, 511]
    ref = make_llm(**TINY).generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    out = client.completions.create(
        model=tiny.model, prompt=ids, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert (out.choices[0].text, out.choices[0].finish_reason) == (ref.text, "length")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (8, 12)
    one = client.completions.create(model=tiny.model, prompt=[ids], max_tokens=12, temperature=0)  # a list of one
    assert one.choices[0].text == ref.text


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}


def test_browser_pages_only_from_the_allowed_origins(tiny):
    """CORS as vLLM's --allowed-origins: a web UI on another origin is answered only when allowed. Without the flag a
    preflight is refused (405, with the Allow header HTTP requires: the error handler once dropped it) and no
    response carries CORS headers, so a page elsewhere cannot drive a local server."""
    chat = f"{tiny.url}/v1/chat/completions"
    refused = httpx.options(chat, headers={"Origin": "http://ui.example:3000", **PREFLIGHT})
    assert refused.status_code == 405 and refused.headers["allow"] == "POST", refused.headers
    models = httpx.get(f"{tiny.url}/v1/models", headers={"Origin": "http://x.y"})
    assert models.status_code == 200 and "access-control-allow-origin" not in models.headers
    assert httpx.head(f"{tiny.url}/health").status_code == 200
    with live_server(make_llm(**TINY), allowed_origins=("http://ui.example:3000",)) as server:
        chat = f"{server.url}/v1/chat/completions"
        ok = httpx.options(chat, headers={"Origin": "http://ui.example:3000", **PREFLIGHT})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ui.example:3000"
        assert "POST" in ok.headers["access-control-allow-methods"]
        other = httpx.options(chat, headers={"Origin": "http://evil.example", **PREFLIGHT})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(chat, json=body, headers={"Origin": "http://ui.example:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example:3000"


def test_an_api_key_guards_the_v1_routes_as_vllms_does():
    """serve --api-key (vLLM's): every /v1 request needs `Authorization: Bearer <key>`, the official client's
    api_key; /health and /metrics stay open, and a browser's preflight (no credentials) is CORS's to answer."""
    llm = make_llm(**TINY)
    with live_server(llm, api_key="sekret", allowed_origins=("http://ui.example:3000",)) as server:
        url = f"{server.url}/v1"
        good = openai.OpenAI(base_url=url, api_key="sekret", max_retries=0)
        assert good.completions.create(model=server.model, prompt="hi", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError, match="wrong API key") as e:
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        r = httpx.post(f"{url}/chat/completions", json={"messages": MSG})  # refused before the body is read
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert "missing API key" in r.json()["error"]["message"]
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert httpx.get(f"{server.url}/metrics").status_code == 200
        for path in ("/reset_prefix_cache", "/flush_cache"):  # they change the server's state: guarded too
            assert httpx.post(server.url + path).status_code == 401
            keyed = httpx.post(server.url + path, headers={"Authorization": "Bearer sekret"})
            assert keyed.status_code == 200, keyed.text
        assert httpx.post(server.url + "/generate", json={"text": "hi"}).status_code == 401  # SGLang's, guarded too
        ok = httpx.options(f"{url}/chat/completions", headers={"Origin": "http://ui.example:3000", **PREFLIGHT})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ui.example:3000"


def _case(path, body, param, status=400, code=None):
    return pytest.param(path, body, status, param, code, id=f"{path.rsplit('/', 1)[1]}-{str(body)[:60]}")


C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [
    _case(C, {"prompt": 5}, "prompt", code="invalid_type"),
    _case(C, {}, "prompt", code="missing"),
    _case(C, {"prompt": ""}, "prompt"),
    _case(C, {"prompt": []}, "prompt"),
    _case(C, {"prompt": [1, 2, 512]}, "prompt"),  # vocab is 512
    _case(C, {"prompt": [-1]}, "prompt"),
    _case(C, {"prompt": [1, True]}, "prompt"),
    _case(C, {"prompt": "x" * 2100}, "prompt", code="context_length_exceeded"),
    _case(C, {"prompt": "hi", "max_tokens": 5000}, "prompt", code="context_length_exceeded"),
    _case(C, {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    _case(C, {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    _case(C, {"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
    _case(C, {"prompt": "hi", "max_tokens": "8"}, "max_tokens"),
    _case(C, {"prompt": "hi", "temperature": "hot"}, "temperature"),
    _case(C, {"prompt": "hi", "temperature": -0.5}, "temperature"),
    _case(C, {"prompt": "hi", "top_p": 1.5}, "top_p"),
    _case(C, {"prompt": "hi", "top_p": 0}, "top_p"),
    _case(C, {"prompt": "hi", "top_k": -7}, "top_k"),
    _case(C, {"prompt": "hi", "top_k": 2**64}, "top_k"),
    _case(C, {"prompt": "hi", "min_p": 2}, "min_p"),
    _case(C, {"prompt": "hi", "seed": 2**64}, "seed"),
    _case(C, {"prompt": "hi", "seed": "x"}, "seed"),
    _case(C, {"prompt": "hi", "stop": [""]}, "stop"),
    _case(C, {"prompt": "hi", "stop": 3}, "stop"),
    _case(C, {"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    _case(C, {"prompt": "hi", "frequency_penalty": -9}, "frequency_penalty"),
    _case(C, {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    _case(C, {"prompt": "hi", "n": 0}, "n"),
    _case(C, {"prompt": "hi", "n": 129}, "n"),
    _case(C, {"prompt": "hi", "n": 100, "max_tokens": 100}, "n"),  # 2 + 100 x 100 tokens > the 4096-token cache
    _case(C, {"prompt": "hi", "best_of": 60, "max_tokens": 100}, "best_of"),
    _case(C, {"prompt": "hi", "n": 3, "best_of": 2}, "best_of"),
    _case(C, {"prompt": "hi", "n": 1, "best_of": 2, "stream": True}, "best_of"),
    _case(C, {"prompt": "hi", "suffix": "!"}, "suffix", code="unsupported_parameter"),
    _case(C, {"prompt": "hi", "logprobs": 21}, "logprobs"),
    _case(C, {"prompt": "hi", "logprobs": -1}, "logprobs"),  # the whole vocabulary: past the default max_logprobs
    _case(C, {"prompt": "hi", "logprobs": -2}, "logprobs"),
    _case(C, {"prompt": ["a", ""]}, "prompt"),
    _case(C, {"prompt": "hi", "logit_bias": {"512": 5}}, "logit_bias"),  # vocab is 512
    _case(C, {"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    _case(C, {"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    _case(C, {"prompt": "hi", "logit_bias": {"5": "1"}}, "logit_bias"),
    _case(C, {"prompt": "hi", "logit_bias": {" 5": 1}}, "logit_bias"),
    _case(C, {"prompt": "hi", "logit_bias": {"\u0665": 1}}, "logit_bias"),  # an Arabic-Indic five
    _case(C, {"prompt": "hi", "stop_token_ids": [512]}, "stop_token_ids"),
    _case(C, {"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    _case(
        C, {"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format", code="unsupported_parameter"
    ),
    _case(C, {"prompt": "hi", "guided_json": {"type": "object"}}, "guided_json", code="unsupported_parameter"),
    _case(C, {"prompt": "hi", "return_token_ids": True}, "return_token_ids", code="unsupported_parameter"),
    _case(CH, {"messages": MSG, "return_token_ids": True}, "return_token_ids", code="unsupported_parameter"),
    _case(
        C, {"prompt": "hi", "logprobs": 1, "logprob_token_ids": [5]}, "logprob_token_ids", code="unsupported_parameter"
    ),
    _case(
        CH,
        {"messages": MSG, "repetition_detection": {"max_pattern_size": 4, "min_count": 3}},
        "repetition_detection",
        code="unsupported_parameter",
    ),
    _case(CH, {"messages": MSG, "return_prompt_text": True}, "return_prompt_text", code="unsupported_parameter"),
    _case(
        C,
        {"prompt": "hi", "max_repetition_pattern_size": 4, "repetition_min_count": 3},
        "max_repetition_pattern_size",
        code="unsupported_parameter",
    ),
    _case(
        CH,
        {"messages": MSG, "min_repetition_pattern_size": 2},
        "min_repetition_pattern_size",
        code="unsupported_parameter",
    ),
    _case(CH, {"messages": MSG, "repetition_min_count": 3}, "repetition_min_count", code="unsupported_parameter"),
    _case(C, {"prompt": "hi", "stream": "yes"}, "stream"),
    _case(C, {"prompt": "hi", "stream_options": {"include_usage": 1}}, "stream_options"),
    _case(C, {"prompt": "hi", "stream_options": {"foo": 1}}, "stream_options"),  # says something: vLLM refuses it
    _case(
        C, {"prompt": "hi", "stream": True, "stream_options": {"foo": 1}}, "stream_options", code="unknown_parameter"
    ),
    # a field the server does not know is a 400 naming it, as OpenAI's (vLLM ignores it): a misspelt max_tokens ran to
    # the default length, chat's max_completion_tokens sent to completions (vLLM has none there) too
    _case(C, {"prompt": "hi", "max_token": 3}, "max_token", code="unknown_parameter"),
    _case(C, {"prompt": "hi", "max_completion_tokens": 3}, "max_completion_tokens", code="unknown_parameter"),
    _case(C, {"prompt": "hi", "messages": MSG}, "messages", code="unknown_parameter"),
    _case(CH, {"messages": MSG, "temprature": 0}, "temprature", code="unknown_parameter"),
    _case(CH, {"messages": MSG, "suffix": "!"}, "suffix", code="unknown_parameter"),  # completions' only
    _case(CH, {"messages": MSG, "regex": "a+"}, "regex", code="unknown_parameter"),  # SGLang's structured output
    # known fields that would change the answer, refused by name
    _case(
        CH,
        {"messages": MSG, "moderation": {"model": "omni-moderation-latest"}},
        "moderation",
        code="unsupported_parameter",
    ),
    _case(CH, {"messages": MSG, "include_reasoning": False}, "include_reasoning", code="unsupported_parameter"),
    _case(
        CH, {"messages": MSG, "mm_processor_kwargs": {"fps": 2}}, "mm_processor_kwargs", code="unsupported_parameter"
    ),
    _case(C, {"prompt": "hi", "vllm_xargs": {"scale": 2}}, "vllm_xargs", code="unsupported_parameter"),
    _case(
        C,
        {"prompt": "hi", "kv_transfer_params": {"do_remote_decode": True}},
        "kv_transfer_params",
        code="unsupported_parameter",
    ),
    _case(C, {"prompt": "hi", "stream_options": {"include_usage": False}}, "stream_options"),  # says something
    _case(C, {"prompt": "hi", "model": "gpt-4"}, "model", status=404, code="model_not_found"),
    _case(CH, {"messages": []}, "messages"),
    _case(CH, {"messages": "hi"}, "messages"),
    _case(CH, {}, "messages", code="missing"),
    _case(CH, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    _case(CH, {"messages": [{"content": "hi"}]}, "messages"),
    _case(CH, {"messages": [{"role": "user", "content": 5}]}, "messages"),
    _case(
        CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"
    ),
    _case(CH, {"messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens"),
    _case(CH, {"messages": MSG, "max_tokens": 1e9}, "max_tokens"),
    _case(CH, {"messages": MSG, "max_tokens": 10**9}, "messages", code="context_length_exceeded"),
    _case(CH, {"messages": MSG, "n": 0}, "n"),
    _case(CH, {"messages": MSG, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    _case(CH, {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    _case(CH, {"messages": MSG, "logprobs": 1}, "logprobs"),
    _case(CH, {"messages": MSG, "echo": True}, "echo", code="unsupported_parameter"),
    _case(CH, {"messages": MSG, "tools": [{"type": "function"}]}, "tools", code="unsupported_parameter"),
    _case(
        CH,
        {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {}}},
        "response_format",
        code="unsupported_parameter",
    ),
    _case(CH, {"messages": MSG, "model": "nope", "stream": True}, "model", status=404),
    _case(CH, {"messages": MSG, "temperature": None, "top_p": 7}, "top_p"),
    _case(C, '{"prompt": "hi", ', None, code="json_invalid"),
    _case(C, "[1, 2]", None),
    _case(C, "", None),
    _case(CH, "not json at all", None, code="json_invalid"),
    # where json.loads gives up before its own errors FastAPI said "There was an error parsing the body", no code
    _case(C, b'{"prompt": "\xff\xfe"}', None, code="json_invalid"),
    # too deep for pydantic-core's parser on CI (json_invalid); a later one parses it and names the array instead
    # (model_attributes_type, "must be a JSON object", the GPU machine's Python 3.12 stack): a 400 either way
    _case(C, "[" * 5000 + "]" * 5000, None),
]


@pytest.mark.parametrize("path,body,status,param,code", BAD)
def test_bad_requests_get_openai_shaped_errors(tiny, path, body, status, param, code):
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    r = httpx.post(tiny.url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert err["param"] == param, err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert param.split("_")[0] in err["message"], err  # the message names the problem too


def test_engine_serves_on_after_bad_requests(tiny):
    assert httpx.get(f"{tiny.url}/health").status_code == 200
    client = tiny.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=tiny.model, prompt="hi", n=0)
    assert e.value.param == "n" and e.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MSG)
    assert e.value.param == "model"
    out = client.completions.create(model=tiny.model, prompt="still alive", max_tokens=5, extra_body={"user": "u"})
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"
    # stream options that say nothing, without stream: vLLM lets them through (a 400 here before)
    out = client.completions.create(model=tiny.model, prompt="hi", max_tokens=2, extra_body={"stream_options": {}})
    assert out.usage.completion_tokens == 2
    parts = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    chat = client.chat.completions.create(model=tiny.model, messages=parts, max_tokens=3)
    # text parts are joined with newlines, as vLLM does for a template that takes a string
    want = tiny.llm.encode([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi \nthere"}])
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (len(want), 3)
    m = tiny.wait_idle()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0)
    tiny.on_engine(lambda engine: engine.check())


def test_tokenize_detokenize_and_version_as_vllms(tiny):
    """vLLM's /tokenize, /detokenize and /version (404s here before): a prompt's ids as the generation endpoints count
    them, ids back to text, and what it cannot count alike refused by name."""
    from minisgl_cli import version

    def post(path: str, body: dict) -> httpx.Response:
        return httpx.post(tiny.url + path, json=body)

    r = post("/tokenize", {"model": tiny.model, "prompt": "hello", "return_token_strs": True})
    assert r.json() == {
        "count": 5,
        "max_model_len": tiny.openai().models.retrieve(tiny.model).model_extra["max_model_len"],
        "tokens": list(b"hello"),
        "token_strs": list("hello"),
    }
    chat = tiny.openai().chat.completions.create(model=tiny.model, messages=MSG, max_tokens=1)
    assert post("/tokenize", {"messages": MSG}).json()["count"] == chat.usage.prompt_tokens
    assert post("/tokenize", {"prompt": ""}).json()["count"] == 0  # as vLLM
    assert post("/detokenize", {"tokens": list(b"hi there")}).json() == {"prompt": "hi there"}
    assert httpx.get(tiny.url + "/version").json() == {"version": version()}
    for path, body, param in [
        ("/tokenize", {"prompt": "a", "messages": MSG}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": False}, "add_special_tokens"),
        ("/tokenize", {"messages": MSG, "chat_template": "{{ 1 }}"}, "chat_template"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": False}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/detokenize", {"tokens": [1, 512]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "hi"}, "tokens"),
    ]:
        r = post(path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert post("/tokenize", {"model": "gpt-4", "prompt": "a"}).status_code == 404


def test_tokenize_counts_the_real_models_chat_and_detokenize_keeps_special_tokens(smol):
    server, _ = smol
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": conv}).json()["tokens"]
    assert ids == server.llm.encode(conv)
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text.startswith("<|im_start|>") and "What is the capital of France?" in text
    r = httpx.post(server.url + "/tokenize", json={"prompt": " Paris", "return_token_strs": True}).json()
    assert r["tokens"] == server.llm.tokenizer.encode(" Paris") and r["token_strs"] == ["ĠParis"]


def test_chat_reads_the_content_parts_vllm_reads_as_text(smol):
    """Refusal and thinking parts, bare strings in a parts list, text parts without text: read as vLLM's chat parser
    reads them (tests/test_llm_api.py), where the server answered 400. /tokenize and the chat's usage count the
    prompt transformers lays out from the joined texts."""
    from tests.test_llm_api import PARTS_AS_VLLM_READS_THEM, PARTS_JOINED

    server, _ = smol
    hf = server.llm.get_tokenizer()
    want = list(hf.apply_chat_template(PARTS_JOINED, add_generation_prompt=True, return_dict=False))
    r = httpx.post(server.url + "/tokenize", json={"messages": PARTS_AS_VLLM_READS_THEM})
    assert r.status_code == 200 and r.json()["tokens"] == want
    body = {"messages": PARTS_AS_VLLM_READS_THEM, "max_tokens": 1, "temperature": 0}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)


def test_usage_counts_the_prompt_tokens_read_from_the_cache(tiny):
    """usage.prompt_tokens_details.cached_tokens: the chat's --url panel read cache hits there and showed 0 for
    every turn. Whole 16-token pages of a prompt seen before are hits; a prompt's n choices count it once."""
    client = tiny.openai()
    prompt = "cached usage " * 4  # 52 bytes: three whole pages
    first = client.completions.create(model=tiny.model, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens == 52 and first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model=tiny.model, prompt=prompt, max_tokens=2, n=2)
    assert again.usage.prompt_tokens == 52 and again.usage.prompt_tokens_details.cached_tokens == 48
    stream = client.chat.completions.create(
        model=tiny.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1].usage
    assert last.prompt_tokens_details.cached_tokens % 16 == 0 and last.prompt_tokens_details.cached_tokens < 64
    repeat = list(
        client.chat.completions.create(
            model=tiny.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )[-1].usage
    assert repeat.prompt_tokens_details.cached_tokens == repeat.prompt_tokens // 16 * 16 > 0


def test_metrics_parse_and_move(tiny):
    before = _families(tiny)
    lab = (("model_name", "tiny-llama"),)
    prompt = "metrics " * 5  # 40 bytes: two full 16-token pages for the prefix cache
    client = tiny.openai()
    for _ in range(2):
        out = client.completions.create(model=tiny.model, prompt=prompt, max_tokens=10, temperature=0)
        assert out.usage.completion_tokens == 10
    after = _families(tiny)

    def delta(name: str, labels=lab) -> float:
        return after[(name, labels)] - before.get((name, labels), 0)

    assert delta("minisgl:prompt_tokens_total") == delta("minisgl:prefix_cache_queries_total") == 80
    assert delta("minisgl:prefix_cache_hits_total") >= 32  # the second request reuses the first one's pages
    assert delta("minisgl:generation_tokens_total") == 20
    assert delta("minisgl:time_to_first_token_seconds_count") == 2
    assert delta("minisgl:e2e_request_latency_seconds_count") == 2
    assert delta("minisgl:inter_token_latency_seconds_count") == 18
    assert delta("minisgl:request_success_total", (("finished_reason", "length"),) + lab) == 2
    assert 0 <= after[("minisgl:kv_cache_usage_perc", lab)] <= 1
    for name in ("num_requests_running", "num_requests_waiting", "num_requests_in_flight"):
        assert (f"minisgl:{name}", lab) in after
    for h in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in after.items() if k[0] == f"minisgl:{h}_bucket"))
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf")
        assert counts[-1] == after[(f"minisgl:{h}_count", lab)] and after[(f"minisgl:{h}_sum", lab)] > 0


def test_latency_histograms_fill_while_a_stream_runs(tiny):
    """TTFT, inter-token and end-to-end latencies were all recorded when a request finished: a long stream was
    missing from the histograms (and alerts on them) until its end. TTFT now counts with the first token and each
    gap with its token, as vLLM records them; the end-to-end latency still at the finish."""
    lab = (("model_name", "tiny-llama"),)
    before = _families(tiny)
    stream = tiny.openai().completions.create(
        model=tiny.model, prompt="hi", max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    for _ in range(20):
        next(chunks)
    during = _families(tiny)
    stream.close()

    def delta(name: str) -> float:
        return during[(f"minisgl:{name}", lab)] - before.get((f"minisgl:{name}", lab), 0)

    assert delta("time_to_first_token_seconds_count") == 1
    assert delta("inter_token_latency_seconds_count") >= 19
    assert delta("e2e_request_latency_seconds_count") == 0


def test_metrics_answer_promptly_during_a_long_engine_step(tiny):
    """The engine answers a metrics request between steps. During a long one (here the engine's thread is held for
    4 s, as a big CPU prefill would), /metrics answers within a second with the last snapshot and says how old it
    is, instead of waiting (up to 10 s, Prometheus's scrape timeout) and then leaving the engine's figures out."""
    lab = (("model_name", "tiny-llama"),)
    client = tiny.openai()
    client.completions.create(model=tiny.model, prompt="warm up", max_tokens=3)
    before = _families(tiny)
    assert before[("minisgl:engine_metrics_age_seconds", lab)] < 1
    held = threading.Event()

    def long_step(_engine) -> None:
        held.set()
        time.sleep(4)

    blocker = threading.Thread(target=tiny.on_engine, args=(long_step,))
    blocker.start()
    try:
        assert held.wait(10)
        for _ in range(2):  # the second scrape finds the first one's request still unanswered: it waits no longer
            start = time.monotonic()
            during = _families(tiny)
            assert time.monotonic() - start < 1.5
            for name in ("num_requests_running", "kv_cache_usage_perc", "generation_tokens_total"):
                assert during[(f"minisgl:{name}", lab)] == before[(f"minisgl:{name}", lab)]
            assert during[("minisgl:engine_metrics_age_seconds", lab)] >= 0.5
    finally:
        blocker.join()
    out = client.completions.create(model=tiny.model, prompt="after", max_tokens=4)
    after = _families(tiny)
    assert after[("minisgl:engine_metrics_age_seconds", lab)] < 1
    assert after[("minisgl:generation_tokens_total", lab)] == (
        before[("minisgl:generation_tokens_total", lab)] + out.usage.completion_tokens
    )


def test_token_times_are_the_engines_when_the_front_end_reads_late(tiny):
    """A front end busy elsewhere (the chat's TUI redrawing) reads several steps' messages at once. The times its
    outputs carry are still when the engine made each token: stamped on arrival, they would all be the moment it got
    round to reading them, with gaps of zero between them."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

    def finished() -> int:
        return tiny.engine_metrics().finished_requests

    async def submit_then_stall():
        done = finished()
        stream = tiny.remote.submit([5, 6, 7, 8], params, "late-reader")
        deadline = time.monotonic() + 30
        while finished() == done:  # this blocks the front end's event loop until the engine has made every token
            assert time.monotonic() < deadline, "the request did not finish"
            time.sleep(0.005)
        woke = time.perf_counter()
        outs = [out async for out in stream]
        return woke, outs

    woke, outs = asyncio.run_coroutine_threadsafe(submit_then_stall(), tiny.event_loop).result(60)
    last = outs[-1]
    assert last.finished and len(last.token_ids) == len(last.token_times) == 16
    assert last.arrival < last.first_token_time == last.token_times[0]
    assert last.token_times[-1] < woke  # made before the front end read any of them
    gaps = [b - a for a, b in zip(last.token_times, last.token_times[1:])]
    assert min(gaps) > 0  # one token a step, each step after the last


def test_chat_n_choices_without_max_tokens_share_the_context_default():
    """Chat's default max_tokens (the rest of the context) is a ceiling, not room every choice reserves at once: n=3
    choices that could each grow to the whole cache are served (the scheduler preempts as the cache fills). Only a
    prompt that leaves no room for one token per choice is refused, naming n and what the choices need."""
    with live_server(make_llm(max_running_requests=8, num_pages=24)) as server:  # 384 tokens of KV cache
        capacity = server.client.limits.kv_capacity
        assert capacity == 384 and server.client.max_request_tokens == 384
        client = server.openai()
        # what a request can hold, not the model's 2,048-token context: a client sizing prompts by it is not refused
        assert client.models.retrieve(server.model).model_extra["max_model_len"] == 384
        assert httpx.post(server.url + "/tokenize", json={"prompt": "hi"}).json()["max_model_len"] == 384  # was 2048
        out = client.chat.completions.create(model=server.model, messages=MSG, n=3, temperature=0)
        prompt = out.usage.prompt_tokens
        assert 3 * (capacity - prompt) > capacity  # what the old check reserved: over the cache
        assert [c.finish_reason for c in out.choices] == ["length"] * 3
        assert out.usage.completion_tokens == 3 * (capacity - prompt)
        assert len({c.message.content for c in out.choices}) == 1  # greedy: the same answer three times

        long = [{"role": "user", "content": "x" * (capacity - prompt + len(MSG[0]["content"]) - 2)}]
        assert len(server.llm.encode(long)) == capacity - 2  # room for one token each of two choices, not three
        two = client.chat.completions.create(model=server.model, messages=long, n=2, temperature=0)
        assert [c.finish_reason for c in two.choices] == ["length"] * 2
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=server.model, messages=long, n=3, temperature=0)
        assert e.value.body["param"] == "n"
        assert e.value.body["message"] == (
            f"n=3 choices need prompt ({capacity - 2} tokens) + at least 1 token each = {capacity + 1} tokens of KV "
            f"cache at once, over its capacity of {capacity}"
        )
        m = server.wait_idle()
        assert (server.client.in_flight, m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"prompt": [1, 2, 3], "n": 4}, "n", "n=4: 4 generations at once"),
        ({"prompt": "hi", "n": 1, "best_of": 5}, "best_of", "best_of=5: 5 generations at once"),
        ({"prompt": ["a", "b", "c", "d"]}, "prompt", "4 prompts: 4 generations at once"),
        ({"prompt": ["a", "b"], "n": 2}, "n", "2 prompts x n=2: 4 generations at once"),
    ],
)
def test_more_choices_than_the_server_ever_admits_are_a_400_not_a_429(body, param, message):
    """A request of more generations than --max-running-requests + --max-queued-requests can never be admitted, even
    by an idle server: a 429 told the client to retry (the openai client does, in vain); it is a 400 naming why."""
    with live_server(make_llm(max_running_requests=2, num_pages=64), max_queued_requests=1) as server:
        r = httpx.post(f"{server.url}/v1/completions", json={"max_tokens": 5, **body}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["type"], err["param"]) == ("invalid_request_error", param), err
        assert err["message"] == (
            f"{message}, more than this server ever admits (--max-running-requests 2 + --max-queued-requests 1 = 3)"
        )
        ok = server.openai().completions.create(model=server.model, prompt=[1, 2, 3], max_tokens=5, n=3)
        assert len(ok.choices) == 3  # at the limit: admitted
        assert server.client.metrics.rejected == 0


def test_queue_limit_answers_429_then_a_dead_engine_503():
    with (
        live_server(make_llm(max_running_requests=2, num_pages=512), max_queued_requests=1) as server,
        httpx.Client(base_url=server.url, timeout=60) as raw,
        contextlib.ExitStack() as held,
    ):
        for i in range(3):  # two running + one queued: the server is full
            r = held.enter_context(
                raw.stream("POST", "/v1/completions", json={"prompt": f"hold {i}", "max_tokens": 2000, "stream": True})
            )
            assert r.status_code == 200
        assert server.client.in_flight == 3
        with pytest.raises(openai.RateLimitError) as e:
            server.openai().completions.create(model=server.model, prompt="one too many", max_tokens=4)
        assert e.value.status_code == 429 and e.value.code == "queue_full"
        assert "--max-queued-requests" in e.value.message
        held.close()  # the three clients go away: their requests are aborted, the queue empties
        m = server.wait_idle()
        assert (server.client.in_flight, m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0, 0)
        assert server.client.metrics.finished["abort"] == 3
        ok = server.openai().completions.create(model=server.model, prompt="room again", max_tokens=4)
        assert ok.usage.completion_tokens == 4
        assert _families(server)[("minisgl:requests_rejected_total", (("model_name", "tiny-llama"),))] == 1

        server.engine_loop.stop()  # the engine loop is gone: health says so, requests fail cleanly
        deadline = time.monotonic() + 10
        while (h := raw.get("/health")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert h.status_code == 503 and "engine is not running" in h.json()["error"]["message"]
        r = raw.post("/v1/chat/completions", json={"messages": MSG})
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable_error"
        assert raw.get("/metrics").status_code == 200


def test_max_logprobs_is_the_one_limit_of_logprobs_and_top_logprobs_as_vllms():
    """The engine's max_logprobs (here -1: the whole vocabulary, 512) is the one limit of completions' logprobs
    and chat's top_logprobs: vLLM's chat takes top_logprobs past OpenAI's 20 where the setting allows (its protocol
    refuses only a negative). Here both stopped at 20 whatever the engine allowed. One more is a 400 naming the
    field."""
    with live_server(make_llm(num_pages=64, max_logprobs=-1)) as server:
        client = server.openai()
        ids = {"return_tokens_as_token_ids": True}  # the byte tokenizer's ids share texts ("\ufffd")
        out = client.completions.create(model=server.model, prompt="hi", max_tokens=2, logprobs=512, extra_body=ids)
        assert [len(top) for top in out.choices[0].logprobs.top_logprobs] == [512, 512]
        chat = client.chat.completions.create(
            model=server.model, messages=MSG, max_tokens=2, logprobs=True, top_logprobs=512, extra_body=ids
        )
        assert [len(t.top_logprobs) for t in chat.choices[0].logprobs.content] == [512, 512]
        # vLLM's -1 per request, the whole vocabulary (it was refused as negative)
        out = client.completions.create(model=server.model, prompt="hi", max_tokens=2, logprobs=-1, extra_body=ids)
        assert [len(top) for top in out.choices[0].logprobs.top_logprobs] == [512, 512]
        chat = client.chat.completions.create(
            model=server.model, messages=MSG, max_tokens=2, logprobs=True, top_logprobs=-1, extra_body=ids
        )
        assert [len(t.top_logprobs) for t in chat.choices[0].logprobs.content] == [512, 512]
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=server.model, prompt="hi", max_tokens=2, logprobs=513)
        assert e.value.param == "logprobs" and "logprobs must be in [0, 512] or -1" in e.value.message
        assert "(got 513)" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=server.model, messages=MSG, logprobs=True, top_logprobs=513)
        assert e.value.param == "top_logprobs" and "top_logprobs must be in [0, 512] or -1" in e.value.message


def test_a_served_name_with_slashes_is_retrieved():
    with live_server(make_llm(num_pages=16), model_name="org/tiny-llama") as server:
        client = server.openai()
        assert client.models.retrieve("org/tiny-llama").id == "org/tiny-llama"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("org/other")


def test_cli_serve_command():
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "minisgl_cli",
        "serve",
        "--model",
        "dummy:tiny-llama",
        "--device",
        "cpu",
        "--num-pages",
        "64",
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--max-queued-requests",
        "4",
        "--max-logprobs",
        "30",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        out = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6)
        assert out.usage.completion_tokens == 6
        # --max-logprobs: top_logprobs past OpenAI's 20 as vLLM's flag allows, and no further
        out = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=1, logprobs=True, top_logprobs=30)
        assert len(out.choices[0].logprobs.content[0].top_logprobs) == 30
        with pytest.raises(openai.BadRequestError, match=r"top_logprobs must be in \[0, 30\] or -1 .* \(got 31\)"):
            client.chat.completions.create(model="tiny", messages=MSG, logprobs=True, top_logprobs=31)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0, proc.stdout.read()


def _serve_refuses(model: Path) -> str:
    """`minisgl serve` of this model directory, expected to stop before the load (exit 2): its stderr."""
    r = subprocess.run(
        [sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model), "--device", "cpu", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    return r.stderr


def test_the_models_generation_config_gives_the_sampling_defaults(tmp_path):
    """vLLM's server takes a model's generation_config.json sampling fields as the defaults of a request that leaves
    them out (--generation-config auto); here a request without temperature always sampled at temperature 1."""
    from engine.model_config import PRESETS
    from tests.conftest import serve_subprocess
    from tests.hf_reference import hf_model_from_config, save_hf

    model = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = model / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "temperature": 0.0, "top_k": 5}))

    def texts(url: str, **asked) -> list[str]:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        prompts = [[5, 6, 7, 8], [9, 10, 11]]
        out = client.completions.create(model=str(model), prompt=prompts, max_tokens=12, seed=3, **asked)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    with serve_subprocess(tmp_path, "--num-pages", "64", model=str(model)) as (url, proc):
        default, greedy, hot = texts(url), texts(url, temperature=0), texts(url, temperature=1.0)
    log = "\n".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
    assert "sampling defaults from the model's generation_config.json: temperature 0.0, top_k 5" in log, log
    assert default == greedy != hot  # the file's temperature 0; a request's own value still wins
    with serve_subprocess(tmp_path, "--num-pages", "64", "--generation-config", "none", model=str(model)) as (url, _):
        assert texts(url) == texts(url, temperature=1.0) != greedy  # the API's own default: temperature 1
    gen.write_text(json.dumps({"temperature": "hot"}))
    assert f"{gen}: temperature must be a number (got 'hot')" in _serve_refuses(model)


def test_the_models_max_new_tokens_is_the_default_max_tokens(tmp_path):
    """vLLM's server takes generation_config.json's max_new_tokens as the max_tokens of a request that gives none
    (chat, /v1/responses, and completions with an explicit null: their absent one is 16), within what the context
    leaves after the prompt (vLLM's get_max_tokens); here it was not read: chat ran to the end of the context."""
    from engine.model_config import PRESETS
    from tests.conftest import serve_subprocess
    from tests.hf_reference import hf_model_from_config, save_hf

    model = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = model / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "max_new_tokens": 5}))

    def lengths(url: str) -> dict[str, int]:
        def used(path: str, **body: object) -> dict[str, int]:
            answer = httpx.post(url + path, json={**body, "ignore_eos": True}, timeout=60).json()
            return answer["usage"]

        chat = used("/v1/chat/completions", messages=MSG)
        body = {"input_ids": [5, 6, 7], "sampling_params": {"ignore_eos": True}}
        sglang = httpx.post(f"{url}/generate", json=body, timeout=60)  # httpx's 5 s default ran out on a busy CI
        return {
            "chat": chat["completion_tokens"],
            "chat max_tokens 7": used("/v1/chat/completions", messages=MSG, max_tokens=7)["completion_tokens"],
            "completions": used("/v1/completions", prompt=[5, 6, 7])["completion_tokens"],
            "completions null": used("/v1/completions", prompt=[5, 6, 7], max_tokens=None)["completion_tokens"],
            # 62 prompt tokens in a context of 64: 2 left
            "62 of 64": used("/v1/completions", prompt=[5] * 62, max_tokens=None)["completion_tokens"],
            "responses": used("/v1/responses", input="hi")["output_tokens"],  # as chat's prompt
            "/generate": sglang.json()["meta_info"]["completion_tokens"],  # SGLang reads no max_new_tokens there
            "chat prompt": chat["prompt_tokens"],
        }

    flags = ("--num-pages", "64", "--max-model-len", "64")
    with serve_subprocess(tmp_path, *flags, model=str(model)) as (url, _):
        got = lengths(url)
    log = "\n".join(p.read_text() for p in tmp_path.glob("serve-*.log"))
    assert "sampling defaults from the model's generation_config.json: max_tokens 5" in log, log
    rest = 64 - got.pop("chat prompt")
    limits = {"chat": 5, "chat max_tokens 7": 7, "completions": 16, "completions null": 5, "62 of 64": 2}
    assert got == {**limits, "responses": 5, "/generate": 61}
    with serve_subprocess(tmp_path, *flags, "--generation-config", "none", model=str(model)) as (url, _):
        got = lengths(url)
    del got["chat prompt"]
    limits = {"chat": rest, "chat max_tokens 7": 7, "completions": 16, "completions null": 61, "62 of 64": 2}
    assert got == {**limits, "responses": rest, "/generate": 61}  # the rest of the context
    gen.write_text(json.dumps({"max_new_tokens": -1}))
    assert f"{gen}: max_new_tokens must be an integer >= 1 (got -1)" in _serve_refuses(model)


def test_cli_serve_rejects_bad_flags():
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "minisgl_cli", "serve", "--port", "70000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "--port" in r.stderr


# A template that renders an assistant turn's thinking, as Qwen3's does in a tool-calling turn (read from
# `reasoning_content`, the name vLLM's chat layer gives `reasoning` too)
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_an_assistant_turns_reasoning_reaches_the_template_as_in_vllm(smol, monkeypatch):
    """vLLM passes an assistant message's `reasoning` to the chat template (as `reasoning` and `reasoning_content`),
    and templates such as Qwen3's render it: here it was dropped without a word, so the same conversation made another
    prompt. SGLang's (and vLLM's older) `reasoning_content` is taken too; on another role, or both names disagreeing,
    it is refused by name."""
    server, _ = smol
    monkeypatch.setattr(server.llm.tokenizer.hf, "chat_template", THINKING_TEMPLATE)

    def conv(**thinking) -> list[dict]:
        turn = {"role": "assistant", "content": "It is 4.", **thinking}
        return [{"role": "user", "content": "2+2?"}, turn, {"role": "user", "content": "And 3+3?"}]

    def tokenize(messages: list[dict]) -> httpx.Response:
        return httpx.post(server.url + "/tokenize", json={"messages": messages})

    plain = tokenize(conv()).json()["tokens"]
    reference = server.llm.encode(conv(reasoning_content="Two and two make four."))
    assert reference != plain  # the template renders it
    for name in ("reasoning", "reasoning_content"):
        assert tokenize(conv(**{name: "Two and two make four."})).json()["tokens"] == reference, name
    same = {"reasoning": "Two and two make four.", "reasoning_content": "Two and two make four."}
    assert tokenize(conv(**same)).json()["tokens"] == reference
    client = server.openai()
    answer = client.chat.completions.create(
        model=server.model, messages=conv(reasoning="Two and two make four."), max_tokens=3, temperature=0
    )
    assert answer.usage.prompt_tokens == len(reference)
    for bad, says in [
        (conv(reasoning="a", reasoning_content="b"), "messages[1]: reasoning and reasoning_content differ"),
        ([{"role": "user", "content": "hi", "reasoning": "x"}], "messages[0].reasoning: only an assistant message"),
    ]:
        r = tokenize(bad)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": bad, "max_tokens": 1})
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_a_chat_answer_holds_vllms_reasoning_field_as_vllm_without_a_reasoning_parser(tiny):
    """vLLM's reasoning examples read `message.reasoning` (`reasoning_content` before its rename), which vLLM's answer
    always holds: null without --reasoning-parser, the thinking left in the content, as here. The official client
    raised AttributeError on ours."""
    message = tiny.openai().chat.completions.create(model=tiny.model, messages=MSG, max_tokens=3).choices[0].message
    assert (message.reasoning, message.reasoning_content) == (None, None)
    assert message.content


def test_the_answers_id_is_the_clients_request_id_as_in_vllm(tiny):
    """vLLM names the answer after the X-Request-Id header, else the body's request_id (its extension), so a client
    can find its request in the server's logs and traces; both were ignored here."""
    client, kw = tiny.openai(), dict(model=tiny.model, max_tokens=2)
    chat = client.chat.completions.create(messages=MSG, **kw, extra_body={"request_id": "job-7"})
    assert chat.id == "chatcmpl-job-7"
    chunks = list(client.completions.create(prompt="hi", stream=True, **kw, extra_body={"request_id": "job-8"}))
    assert {c.id for c in chunks} == {"cmpl-job-8"}
    header = {"X-Request-Id": "trace-1"}  # the header comes first
    out = client.completions.create(prompt="hi", **kw, extra_body={"request_id": "job-9"}, extra_headers=header)
    assert out.id == "cmpl-trace-1"
    assert client.completions.create(prompt="hi", **kw).id.startswith("cmpl-")
    # /v1/responses: vLLM's id is the body's request_id as given (its default resp_<random>); no header there
    r = client.responses.create(input="hi", model=tiny.model, max_output_tokens=2, extra_body={"request_id": "job-10"})
    assert r.id == "job-10"
    assert client.responses.create(input="hi", model=tiny.model, max_output_tokens=2).id.startswith("resp_")


def test_chat_template_variables_and_switches_as_in_vllm(smol, monkeypatch):
    """`chat_template_kwargs` (how clients switch Qwen3's thinking off: `minisgl chat --url` sends it for /think),
    `add_generation_prompt` and `continue_final_message` were refused: 400 for every request that set them. They now
    lay the conversation out as transformers' apply_chat_template does with the same arguments, in chat completions
    and /tokenize alike; what cannot work is refused by name."""
    server, _ = smol
    hf = server.llm.tokenizer.hf
    qwen3_like = hf.chat_template + (
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    )
    monkeypatch.setattr(hf, "chat_template", qwen3_like)
    client = server.openai()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    started = [*question, {"role": "assistant", "content": "The capital of France is"}]
    cases = [
        (question, {"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}),
        (question, {"add_generation_prompt": False}, {"add_generation_prompt": False}),
        (
            started,
            {"add_generation_prompt": False, "continue_final_message": True},
            {"add_generation_prompt": False, "continue_final_message": True},
        ),
    ]
    seen = set()
    for messages, body, hf_kwargs in cases:
        kwargs = {"add_generation_prompt": True, **hf_kwargs}
        reference = list(hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))
        seen.add(tuple(reference))
        tokens = httpx.post(server.url + "/tokenize", json={"messages": messages, **body}).json()["tokens"]
        assert tokens == reference, body
        answer = client.chat.completions.create(
            model=server.model, messages=messages, max_tokens=4, temperature=0, extra_body=body
        )
        assert answer.usage.prompt_tokens == len(reference)
        # the answer to those very ids (the engine belongs to the server's loop: asked through it)
        same = client.completions.create(model=server.model, prompt=reference, max_tokens=4, temperature=0)
        assert answer.choices[0].message.content == same.choices[0].text
    assert len(seen) == 3 and tuple(server.llm.encode(question)) not in seen  # each switch changed the prompt
    bad = httpx.post(server.url + "/tokenize", json={"messages": question, "chat_template_kwargs": {"tools": []}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"  # was "messages"
    for body, param in [
        ({"add_generation_prompt": True, "continue_final_message": True}, "add_generation_prompt"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        # names of the layout's own arguments: a TypeError (a 500) before they were checked by name
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": "no"}, "add_generation_prompt"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=server.model, messages=question, max_tokens=1, extra_body=body)
        assert e.value.body["param"] == param, (body, e.value.body)


def test_chat_template_kwargs_naming_self_is_a_400(tiny):
    """chat_template_kwargs {"self": ...} collided with the tokenizer methods' own first argument: a TypeError, a 500
    (\"got multiple values for argument 'self'\"), in chat completions and /tokenize alike."""
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"self": 1}}
    for path, extra in (("/v1/chat/completions", {"max_tokens": 1}), ("/tokenize", {})):
        r = httpx.post(tiny.url + path, json={**body, **extra}, timeout=60)
        assert r.status_code == 400 and "chat_template_kwargs: 'self'" in r.json()["error"]["message"], (path, r.text)
    with pytest.raises(ValueError, match="chat_template_kwargs: 'self'"):  # the Python API's chat() too
        ChatPrompt(body["messages"], body["chat_template_kwargs"]).encode(tiny.llm.tokenizer)


def test_the_prefix_cache_is_reset_as_vllm_and_sglang_reset_it(tiny):
    """vLLM's POST /reset_prefix_cache and SGLang's /flush_cache (a 404 here before): a benchmark's next run starts
    cold. The pages no request holds are dropped, exactly (page accounting checked), a repeated prompt reads nothing
    from the cache afterwards, and a request running meanwhile keeps its pages and finishes."""
    client = tiny.openai()
    prompt = "The quick brown fox jumps over the lazy dog. " * 20  # bytes: ~900 tokens, many whole pages

    def cached_tokens() -> int:
        out = client.completions.create(model=tiny.model, prompt=prompt, max_tokens=2, temperature=0)
        return out.usage.prompt_tokens_details.cached_tokens

    cached_tokens()
    assert cached_tokens() > 800  # the second one read the first's pages
    tiny.wait_idle()
    assert tiny.engine_metrics().kv_pages_cached > 0
    r = httpx.post(tiny.url + "/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"status": "ok", "kv_pages_cached": 0}, r.text
    m = tiny.engine_metrics()
    assert (m.kv_pages_cached, m.kv_pages_in_use) == (0, 0) and m.kv_pages_free == m.kv_pages_total
    assert cached_tokens() == 0  # cold again
    # SGLang's name, GET and POST, while a long answer runs: only the unheld pages go, the answer goes on
    stream = client.completions.create(
        model=tiny.model, prompt="x" * 300, max_tokens=400, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    next(chunks)
    held = tiny.engine_metrics().kv_pages_in_use
    assert held > 0
    for method in ("GET", "POST"):
        r = httpx.request(method, tiny.url + "/flush_cache")
        assert r.status_code == 200 and r.json()["kv_pages_cached"] == 0, r.text
    assert tiny.live_requests() == 1  # page accounting holds with the running request in it
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length"  # all 400 tokens
    m = tiny.wait_idle()
    assert m.kv_pages_in_use == 0 and tiny.live_requests() == 0


def test_the_responses_api_takes_vllms_sampling_fields(tiny):
    """vLLM's /v1/responses takes top_k, seed, stop, repetition_penalty, ignore_eos and logit_bias; here they were
    accepted and ignored (a seeded request was sampled unseeded, a stop string did not stop it). The answer is the chat
    completion's with the same fields; a bad one is a 400 naming it."""
    question = "Say something."
    fields = {"temperature": 1.0, "top_k": 40, "seed": 7, "repetition_penalty": 1.2, "ignore_eos": True}
    chat = httpx.post(
        tiny.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": question}], "max_tokens": 24, **fields},
        timeout=60,
    ).json()["choices"][0]["message"]["content"]
    stop = re.findall(r"<\d+>", chat)[1]  # a whole token's text (the byte tokenizer's <N>), the second of the answer
    cut = chat.index(stop)
    kept = {"stop": [stop], "include_stop_str_in_output": True}  # vLLM's: the stop string stays (it was refused)
    for extra, want in [({}, chat), ({"stop": [stop]}, chat[:cut]), (kept, chat[: cut + len(stop)])]:
        r = httpx.post(
            tiny.url + "/v1/responses",
            json={"input": question, "max_output_tokens": 24, **fields, **extra},
            timeout=60,
        ).json()
        assert r["output"][0]["content"][0]["text"] == want, (extra, r)
    for extra, param in [({"top_k": -2}, "top_k"), ({"logit_bias": {"100000": 1.0}}, "logit_bias")]:
        r = httpx.post(tiny.url + "/v1/responses", json={"input": question, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert tiny.live_requests() == 0


def test_the_responses_api_takes_its_own_output_back_as_input(tiny):
    """OpenAI's way to hold a conversation without stored responses: the next request's input is the earlier input,
    the earlier response's output items, and the new question. The output_text parts carry `logprobs` (always [] here),
    which the input's parts refused: a 400 for the server's own answer."""
    client = tiny.openai()
    first = client.responses.create(model=tiny.model, input="hi", max_output_tokens=4, temperature=0)
    follow = [{"role": "user", "content": "hi"}, *first.output, {"role": "user", "content": "more"}]
    again = client.responses.create(model=tiny.model, input=follow, max_output_tokens=4, temperature=0)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "more"},
    ]
    chat = client.chat.completions.create(model=tiny.model, messages=messages, max_tokens=4, temperature=0)
    assert again.output_text == chat.choices[0].message.content
    assert again.usage.input_tokens == chat.usage.prompt_tokens


def test_the_responses_api_as_openais_client_reads_it(smol):
    """POST /v1/responses (a 404 before): newer OpenAI SDK code calls client.responses.create. The answer is the chat
    completion's for the same conversation (instructions as the system message), whole or as the API's typed events,
    with its usage; a length-cut answer is "incomplete"; what would change the answer (tools, a stored conversation,
    JSON output) is refused by name."""
    server, _ = smol
    client = server.openai()
    question = "What is the capital of France?"
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}],
        max_tokens=40,
        temperature=0,
    )
    r = client.responses.create(
        model=server.model, instructions="Answer briefly.", input=question, max_output_tokens=40, temperature=0
    )
    assert r.output_text == chat.choices[0].message.content and r.object == "response"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    expected_status = "completed" if chat.choices[0].finish_reason == "stop" else "incomplete"
    assert r.status == expected_status and r.output[0].role == "assistant"
    # the same as messages (developer = system, content parts), streamed
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": question}]},
    ]
    events = list(
        client.responses.create(model=server.model, input=messages, max_output_tokens=40, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{expected_status}",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-4].text == events[-1].response.output_text == r.output_text
    assert events[-1].response.usage.output_tokens == r.usage.output_tokens
    # parts of several texts: a line each, as chat's text parts (vLLM reads both alike; they ran together here)
    two = ["What is 2+2?", "Answer in French."]
    parted = client.responses.create(
        model=server.model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": t} for t in two]}],
        max_output_tokens=12,
        temperature=0,
    )
    as_chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": [{"type": "text", "text": t} for t in two]}],
        max_tokens=12,
        temperature=0,
    )
    assert parted.output_text == as_chat.choices[0].message.content
    assert parted.usage.input_tokens == as_chat.usage.prompt_tokens
    cut = client.responses.create(model=server.model, input=question, max_output_tokens=2, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 2
    for extra, param in [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_object"}}}, "text"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=server.model, input=question, **extra)
        assert e.value.body["param"] == param, (extra, e.value.body)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-4o", input=question)
    with pytest.raises(openai.BadRequestError) as e:  # as chat completions say it
        client.responses.create(model=server.model, input=question, max_output_tokens=10**6)
    assert (e.value.body["param"], e.value.body["code"]) == ("input", "context_length_exceeded"), e.value.body
    assert server.live_requests() == 0


def test_responses_take_earlier_output_items_as_the_sdk_dumps_them(smol):
    """`input += [o.model_dump() for o in response.output]` (history stored as JSON, agent frameworks) was a 400 that
    named no field: the SDK writes keys newer than this server ("phase": null), which the input items forbade. Every
    key of the SDK's dump is taken now; a key it does not write (misspelt, or newer), or "phase" set, is refused by
    name, as in chat messages (they were ignored, which dropped what might change the answer); a field that is wrong
    is named with its path."""
    server, _ = smol
    client = server.openai()
    turn = [{"role": "user", "content": "Say hi"}]
    first = client.responses.create(model=server.model, input=turn, max_output_tokens=5, temperature=0)
    dumped = [o.model_dump() for o in first.output]
    assert "phase" in dumped[0], dumped  # what made it a 400: a key this server's items did not list
    turn += [*dumped, {"role": "user", "content": "again"}]
    again = client.responses.create(model=server.model, input=turn, max_output_tokens=5, temperature=0)
    as_chat = client.chat.completions.create(
        model=server.model,
        messages=[
            {"role": "user", "content": "Say hi"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "again"},
        ],
        max_tokens=5,
        temperature=0,
    )
    assert again.output_text == as_chat.choices[0].message.content
    assert again.usage.input_tokens == as_chat.usage.prompt_tokens
    cached = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Say hi", "prompt_cache_breakpoint": {"mode": "explicit"}}],
        }
    ]
    hinted = client.responses.create(model=server.model, input=cached, max_output_tokens=5, temperature=0)
    assert hinted.output_text == first.output_text  # a caching hint: taken, and the answer is the same
    for item, says in [
        ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "input[0].content[0].text: Input should"),
        ({"role": "bot", "content": "x"}, "input[0].role: Input should be 'user', 'assistant', 'system'"),
        ({"role": "user"}, "input[0].content: Field required"),
        ({"role": "user", "content": "x", "nmae": "a"}, "Unrecognized request argument supplied: input[0].nmae"),
        (
            {"role": "user", "content": [{"type": "input_text", "text": "x", "detail": "high"}]},
            "Unrecognized request argument supplied: input[0].content[0].detail",
        ),
        ({**dumped[0], "phase": "commentary"}, "input[0].phase='commentary' is not supported by this server"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=server.model, input=[item], max_output_tokens=2)
        assert e.value.body["message"].startswith(says) and e.value.body["param"] == "input", e.value.body
    assert server.live_requests() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_token_ids_a_fast_tokenizer_cannot_decode_are_a_400(smol, stream):
    """A token-id prompt with a negative or huge id was a 500 ("OverflowError: number too small to fit in target
    type") on the real model: its fast tokenizer decoded the ids (for echo) before the vocabulary check. The byte
    tokenizer of the tiny models decodes anything, so tests/test_bad_input.py never saw it."""
    server, _ = smol
    for prompt, bad in [([5, -3], -3), ([[-5, 3]], -5), ([2**64], 2**64)]:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "stream": stream})
        body = r.json()["error"]
        assert r.status_code == 400 and body["param"] == "prompt", body
        assert body["message"].startswith(f"prompt token id {bad} is outside the vocabulary [0, 49152)"), body
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "echo": True})
        assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"], r.text
    assert server.live_requests() == 0


def test_sglangs_generate_endpoint_as_its_bench_serving_reads_it(tiny):
    """SGLang's native POST /generate (a 404 before): `text` or `input_ids`, one or a list, `sampling_params` in
    SGLang's names; streamed as SGLang streams it, each event the whole text so far with meta_info's counts (what
    `sglang.bench_serving --backend sglang` reads). The answer is the completions endpoint's for the same prompt and
    settings; SGLang's options that would change it are refused by name."""
    client = tiny.openai()
    url = tiny.url + "/generate"
    prompt, sp = "The capital of France is", {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    ref = client.completions.create(
        model=tiny.model, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    r = httpx.post(url, json={"text": prompt, "sampling_params": sp, "rid": "mine"}).json()
    assert r["text"] == ref.choices[0].text and "output_ids" not in r
    meta = r["meta_info"]
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("mine", ref.usage.prompt_tokens, 12)
    assert meta["finish_reason"] == {"type": "length", "length": 12} and meta["e2e_latency"] > 0
    # streamed, read as bench_serving's sglang backend reads it
    texts, counts = [], []
    with httpx.stream("POST", url, json={"text": prompt, "sampling_params": sp, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        data = json.loads(line.removeprefix("data: "))
        texts.append(data["text"])
        counts.append(data["meta_info"]["completion_tokens"])
    assert texts[-1] == r["text"] and all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # the whole text so far
    assert counts == sorted(counts) and counts[-1] == 12 and len(counts) > 1
    # a list of prompts (and of token-id prompts) is answered as a list, each as alone
    both = httpx.post(url, json={"text": [prompt, "Hello"], "sampling_params": sp}).json()
    alone = httpx.post(url, json={"text": "Hello", "sampling_params": sp}).json()
    assert [b["text"] for b in both] == [r["text"], alone["text"]]
    ids = list(prompt.encode())  # the byte tokenizer of dummy:tiny-llama
    by_ids = httpx.post(url, json={"input_ids": [ids], "sampling_params": sp}).json()
    assert by_ids[0]["text"] == r["text"] and len(by_ids[0]["output_ids"]) == 12
    # SGLang's default length: 128 new tokens
    body = {"text": prompt, "sampling_params": {"ignore_eos": True, "temperature": 0}}
    default = httpx.post(url, json=body).json()
    assert default["meta_info"]["completion_tokens"] == 128
    # SGLang's hints that change nothing here are accepted: the same answer
    hinted = httpx.post(url, json={**body, "priority": 1, "log_metrics": False, "logprob_start_len": -1}).json()
    assert hinted["text"] == default["text"]
    for body, says in [
        ({"text": prompt, "return_logprob": True}, "return_logprob"),
        ({"text": prompt, "sampling_params": {"json_schema": "{}"}}, "sampling_params.json_schema"),
        ({"text": prompt, "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"text": prompt, "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens must be"),
        ({"text": prompt, "sampling_params": {"temprature": 0}}, "sampling_params.temprature is not"),
        # a top-level field it does not know: a 400 as sampling_params' are (it was ignored; SGLang ignores it too)
        ({"text": prompt, "max_new_tokens": 3}, "Unrecognized request argument supplied: max_new_tokens"),
        ({"text": prompt, "return_entropy": True}, "return_entropy=True is not supported"),
        ({"text": prompt, "input_ids": ids}, "give text or input_ids"),
        ({"text": []}, "text is an empty list"),  # answered [] before
    ]:
        bad = httpx.post(url, json=body)
        assert bad.status_code == 400 and says in bad.json()["error"]["message"], (body, bad.text)
    # a refusal names the field the prompt came in (it said "text" for input_ids)
    long = httpx.post(url, json={"input_ids": [1] * 3000, "sampling_params": {"max_new_tokens": 2}})
    assert long.status_code == 400 and long.json()["error"]["param"] == "input_ids", long.text
    assert tiny.live_requests() == 0


# ---- /generate and /v1/responses where they diverged from SGLang's and vLLM's (a review's findings) ----------


@pytest.mark.parametrize(
    "field,value",
    [
        ("session_params", {"id": "s1"}),  # the prompt would continue the session's stored context
        ("lora_id", "adapter-1"),  # SGLang's other name for lora_path
        ("max_thinking_tokens", 8),
    ],
)
def test_sglang_fields_that_change_the_answer_are_refused_by_name(tiny, field, value):
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 2}, field: value}
    r = httpx.post(tiny.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert tiny.live_requests() == 0


def test_an_explicit_null_max_new_tokens_runs_to_the_context_as_sglangs_scheduler_reads_it(tiny):
    """SGLang's scheduler clips max_new_tokens to the context, reading null as no limit; only a left-out one is 128."""
    prompt = "a" * 1900  # 1900 byte tokens of the 2048 context: room for 148 new tokens, more than SGLang's default
    url = tiny.url + "/generate"
    left_out = httpx.post(url, json={"text": prompt, "sampling_params": {"ignore_eos": True}}, timeout=120).json()
    assert left_out["meta_info"]["completion_tokens"] == 128
    body = {"text": prompt, "sampling_params": {"ignore_eos": True, "max_new_tokens": None}}
    null = httpx.post(url, json=body, timeout=120).json()
    assert null["meta_info"]["completion_tokens"] == 2048 - 1900, null["meta_info"]


def test_one_rid_for_a_batch_prefixes_each_prompts_id_as_sglang_does(tiny):
    body = {"text": ["a", "b"], "rid": "run", "sampling_params": {"max_new_tokens": 2}}
    answers = httpx.post(tiny.url + "/generate", json=body, timeout=60).json()
    assert [a["meta_info"]["id"] for a in answers] == ["run_0", "run_1"]  # both were "run"
    one = httpx.post(tiny.url + "/generate", json={**body, "text": "a"}, timeout=60).json()
    assert one["meta_info"]["id"] == "run"


def test_a_top_k_of_0_is_refused_as_sglangs_sampling_params_verify_it(tiny):
    """SGLang's SamplingParams.verify refuses a top_k below 1 but -1 (all tokens); here 0 was taken as all tokens. A
    greedy request passes any top_k there (its top_k is set to 1 before the check), and here too."""
    url = tiny.url + "/generate"

    def post(**sp):
        return httpx.post(url, json={"text": "hi", "sampling_params": {"max_new_tokens": 4, **sp}}, timeout=60)

    for top_k in (0, -7):
        r = post(top_k=top_k)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("sampling_params.top_k "), r.text
        assert r.json()["error"]["param"] == "sampling_params"
    assert all(post(top_k=top_k).status_code == 200 for top_k in (-1, 1, 5))
    greedy = {"temperature": 0, "ignore_eos": True}
    want = post(**greedy).json()["text"]
    for top_k in (0, -7):
        r = post(**greedy, top_k=top_k)
        assert r.status_code == 200 and r.json()["text"] == want, r.text
    assert tiny.live_requests() == 0


def _sse_events(url: str, body: dict) -> list[dict]:
    """A stream's events, after checking it ends with one [DONE]."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as s:
        assert s.status_code == 200, s.read()
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1, lines
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_a_list_of_prompts_streams_as_sglang_streams_a_batch(tiny):
    """SGLang streams a list's prompts together (TokenizerManager._stream_batch_responses): each event is one prompt's
    answer so far, SGLang's single-prompt event plus `index`, its place in the list (meta_info.id its rid), as each
    comes, then one [DONE]. Here a list of several was refused with stream, and a list of one streamed as a lone
    prompt does (no index)."""
    url = tiny.url + "/generate"
    sp = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompts = ["The capital of France is", "Hello", "a"]
    whole = httpx.post(url, json={"text": prompts, "sampling_params": sp, "rid": "b"}, timeout=60).json()
    events = _sse_events(url, {"text": prompts, "sampling_params": sp, "rid": "b"})
    assert sorted({e["index"] for e in events}) == [0, 1, 2]
    for i, answer in enumerate(whole):
        mine = [e for e in events if e["index"] == i]
        assert {e["meta_info"]["id"] for e in mine} == {f"b_{i}"}
        assert all(b["text"].startswith(a["text"]) for a, b in zip(mine, mine[1:]))  # the whole text so far
        assert mine[-1]["text"] == answer["text"]
        assert mine[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
        assert [e["meta_info"]["finish_reason"] for e in mine[:-1]] == [None] * (len(mine) - 1)
    # token-id prompts: output_ids as well; a list of one carries its index
    ids = [list(p.encode()) for p in prompts[:2]]  # the byte tokenizer of dummy:tiny-llama
    by_ids = _sse_events(url, {"input_ids": ids, "sampling_params": sp})
    assert [e["output_ids"] for e in by_ids if e["meta_info"]["finish_reason"]] != []
    assert {e["index"]: e["text"] for e in by_ids if e["meta_info"]["finish_reason"]} == {
        0: whole[0]["text"],
        1: whole[1]["text"],
    }
    one = _sse_events(url, {"text": ["Hello"], "sampling_params": sp})
    assert {e["index"] for e in one} == {0} and one[-1]["text"] == whole[1]["text"]
    lone = _sse_events(url, {"text": "Hello", "sampling_params": sp})
    assert all("index" not in e for e in lone) and lone[-1]["text"] == whole[1]["text"]
    assert tiny.live_requests() == 0


def test_a_streamed_lists_refused_prompt_leaves_the_others_running(tiny, monkeypatch):
    """A prompt of a streamed list that the engine refuses once admitted (injected: the server checks what it can
    before its 200) gets its error as an event with its index; the list's other prompts run to their end, and no
    request or KV page is left behind, nor when the client goes away mid-stream."""
    url = tiny.url + "/generate"
    engine = tiny.llm.engine
    poison = list(b"poison")
    add = engine.add_request

    def refusing(ids, *args, **kw):
        if list(ids) == poison:
            raise ValueError("prompt refused by the test")
        return add(ids, *args, **kw)

    monkeypatch.setattr(engine, "add_request", refusing)
    sp = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    events = _sse_events(url, {"input_ids": [list(b"one"), poison, list(b"two")], "sampling_params": sp})
    (refused,) = [e for e in events if e["index"] == 1]
    assert "refused by the test" in refused["error"]["message"] and refused["error"]["param"] == "input_ids"
    for i in (0, 2):
        assert [e for e in events if e["index"] == i][-1]["meta_info"]["finish_reason"]["length"] == 12
    m = tiny.wait_idle()
    assert (m.kv_pages_in_use, tiny.client.in_flight, tiny.live_requests()) == (0, 0, 0)
    # the client leaves after a few events: both prompts are aborted, their pages back
    aborted = tiny.client.metrics.finished["abort"]
    long = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}
    body = {"text": ["first", "second"], "sampling_params": long, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as s:
        seen = [line for line, _ in zip(s.iter_lines(), range(6)) if line]
    assert seen and all(json.loads(line.removeprefix("data: "))["index"] in (0, 1) for line in seen)
    m = tiny.wait_idle()
    assert (m.kv_pages_in_use, tiny.client.in_flight, tiny.live_requests()) == (0, 0, 0), m
    assert tiny.client.metrics.finished["abort"] == aborted + 2


def test_the_responses_api_continues_an_incomplete_assistant_message_as_vllm_does(tiny):
    """vLLM's Responses API continues the input's last message where it is an assistant message in progress or
    incomplete (should_continue_final_message: the template's continue_final_message, no generation prompt), so an
    answer cut by max_output_tokens, sent back, goes on where it stopped; here it opened a new assistant turn. A
    completed one (or one without a status) is answered in a new turn, as in vLLM."""
    client = tiny.openai()
    more = {"max_output_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
    first = client.responses.create(model=tiny.model, input="hi", **more)
    assert first.status == "incomplete" and first.output[0].status == "incomplete"
    again = client.responses.create(model=tiny.model, input=[{"role": "user", "content": "hi"}, *first.output], **more)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.output_text}]
    chat = {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    continued = httpx.post(
        tiny.url + "/v1/chat/completions",
        json={**chat, "add_generation_prompt": False, "continue_final_message": True},
        timeout=60,
    ).json()
    assert again.output_text == continued["choices"][0]["message"]["content"]
    assert again.usage.input_tokens == continued["usage"]["prompt_tokens"]
    new_turn = httpx.post(tiny.url + "/v1/chat/completions", json=chat, timeout=60).json()
    assert new_turn["usage"]["prompt_tokens"] != continued["usage"]["prompt_tokens"]
    for status in ("completed", None):
        last = {"role": "assistant", "content": first.output_text, "status": status}
        r = client.responses.create(model=tiny.model, input=[{"role": "user", "content": "hi"}, last], **more)
        assert r.usage.input_tokens == new_turn["usage"]["prompt_tokens"], status
        assert r.output_text == new_turn["choices"][0]["message"]["content"]
    assert tiny.live_requests() == 0


def _responses_text(server, **extra) -> str:
    body = {"input": "hello there", "max_output_tokens": 200, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output"][0]["content"][0]["text"]


def _chat_text(server, **extra) -> str:
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 200, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_the_penalties_change_the_answer_as_in_chat_completions(tiny, penalty):
    assert _responses_text(tiny) == _chat_text(tiny)
    penalised = _chat_text(tiny, **{penalty: 2.0})
    assert penalised != _chat_text(tiny)  # the penalty changes this answer
    assert _responses_text(tiny, **{penalty: 2.0}) == penalised


def test_chat_template_kwargs_are_the_templates_as_in_chat_completions(tiny):
    switches = {"chat_template_kwargs": {"tools": []}}  # refused by name: the template's own argument
    body = {"input": "hello", "max_output_tokens": 2, **switches}
    r = httpx.post(tiny.url + "/v1/responses", json=body, timeout=60)
    messages = [{"role": "user", "content": "hello"}]
    chat = httpx.post(tiny.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2, **switches})
    assert chat.status_code == 400
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    ok = {"input": "hello", "max_output_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}}
    assert httpx.post(tiny.url + "/v1/responses", json=ok, timeout=60).status_code == 200
    assert tiny.live_requests() == 0
