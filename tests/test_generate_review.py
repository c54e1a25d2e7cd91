"""SGLang's POST /generate where it diverged from SGLang's: fields that change the answer taken and dropped, an
explicit null max_new_tokens, one rid for a batch."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import make_llm
from tests.server_harness import live_server

TINY = dict(max_running_requests=8, num_pages=256)  # dummy:tiny-llama: vocab 512, context 2048, byte tokenizer


@pytest.fixture(scope="module")
def tiny():
    with live_server(make_llm(**TINY)) as server:
        yield server


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
