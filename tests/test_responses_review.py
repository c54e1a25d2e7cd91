"""/v1/responses takes what vLLM 0.26's ResponsesRequest takes and chat completions honour: presence_penalty,
frequency_penalty and chat_template_kwargs were kept as unknown extras and dropped, so the answer ignored them."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import make_llm
from tests.server_harness import live_server


@pytest.fixture(scope="module")
def tiny():
    with live_server(make_llm(max_running_requests=8, num_pages=256)) as server:
        yield server


def _responses(server, **extra) -> str:
    body = {"input": "hello there", "max_output_tokens": 200, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output"][0]["content"][0]["text"]


def _chat(server, **extra) -> str:
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 200, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_the_penalties_change_the_answer_as_in_chat_completions(tiny, penalty):
    assert _responses(tiny) == _chat(tiny)
    penalised = _chat(tiny, **{penalty: 2.0})
    assert penalised != _chat(tiny)  # the penalty changes this answer
    assert _responses(tiny, **{penalty: 2.0}) == penalised


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
