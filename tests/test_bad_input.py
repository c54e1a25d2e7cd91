"""The bad-input catalogue: CLI flags, HTTP bodies, trace files, model files and sampling values. Each gets a clear
error naming the problem (exit code 2 for the CLI, an OpenAI-shaped 400 for HTTP), and nothing else breaks.

Cases already tested elsewhere are not repeated here (docs/reliability.md lists them all): HTTP bodies in
tests/test_serve.py (BAD), trace lines in tests/test_traces.py and tests/test_bench_trace.py, engine refusals
in tests/test_engine.py, bench-offline and chat flags in tests/test_bench_offline.py and tests/test_chat_plain.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.config import EngineConfig
from engine.llm import LLM
from engine.model_config import PRESETS
from engine.model_source import embedded_default_path
from engine.sampling_params import SamplingParams
from minisgl_cli.app import app
from minisgl_cli.trace_reader import TraceError, read_trace
from tests.conftest import free_port, make_llm, run_with_children, subprocess_env, torchrun_cmd
from tests.hf_reference import hf_model_from_config, save_hf
from tests.server_harness import live_server
from tests.test_bench_offline import flat

ROOT = Path(__file__).resolve().parent.parent
MINISGL = shutil.which("minisgl") or str(Path(sys.executable).parent / "minisgl")
SERVE = ["serve", "--model", "dummy:tiny-llama", "--device", "cpu", "--port", "0"]


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})
    return r.exit_code, flat(r.output)


# ---- CLI flags -----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)  # a flag wrongly accepted would start serving: fail, do not hang
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--page-size", "0"], "Invalid value for '--page-size'"),
        (["--page-size", "-16"], "Invalid value for '--page-size'"),
        (["--num-pages", "-1"], "Invalid value for '--num-pages'"),
        (["--num-pages", "1"], "Invalid value for '--num-pages'"),  # --help said x>=1
        (["--kv-cache-gb", "0"], "Invalid value for '--kv-cache-gb'"),
        # a pool no machine holds (beyond any address space, so no overcommit setting maps it) was numpy's
        # MemoryError with a traceback (exit 1)
        (["--kv-cache-gb", "1000000000"], "not enough memory for a KV cache of"),
        (["--num-pages", "100000000000000"], "not enough memory for a KV cache of"),
        (["--memory-fraction", "1.5"], "Invalid value for '--memory-fraction'"),
        (["--max-running-requests", "0"], "Invalid value for '--max-running-requests'"),
        (["--max-batch-tokens", "-5"], "Invalid value for '--max-batch-tokens'"),
        (["--mixed-prefill-tokens", "0"], "Invalid value for '--mixed-prefill-tokens'"),
        (["--max-model-len", "1"], "Invalid value for '--max-model-len'"),
        # was capped to the model's 2048 without a word
        (["--max-model-len", "100000"], "max_model_len 100000 exceeds the model's context length"),
        (["--cuda-graph-max-bs", "-1"], "Invalid value for '--cuda-graph-max-bs'"),
        (["--piecewise-graph-tokens", "-1"], "Invalid value for '--piecewise-graph-tokens'"),
        (
            ["--attention-backend", "magic"],
            "attention_backend must be one of auto, torch, flashinfer, fa, or PREFILL,DECODE of two of them "
            "(e.g. fa,flashinfer) (got 'magic')",
        ),
        (["--attention-backend", "fa,torch,x"], "attention_backend must be one of auto, torch, flashinfer, fa"),
        (["--dtype", "float64"], "Invalid value for --dtype: dtype must be one of auto, float32, bfloat16, float16"),
        (["--kv-cache-dtype", "int4"], "kv_cache_dtype must be auto, fp8 or fp8_e4m3 (got 'int4')"),
        (["--device", "tpu"], "device must be auto, cpu, cuda or cuda:N (got 'tpu')"),
        (["--tp", "0"], "Invalid value for '--tp'"),
        (["--tp", "2"], "--tp 2 needs exactly 2 processes (torchrun --nproc-per-node 2); this run has WORLD_SIZE=1"),
        (["--model", "dummy:nope"], "unknown dummy model 'nope'; choose from"),
        (["--model", "/no/such/model"], "model path '/no/such/model' does not exist"),
        (["--port", "-3"], "Invalid value for '--port'"),
        (["--max-queued-requests", "-1"], "Invalid value for '--max-queued-requests'"),
        (["--max-logprobs", "-2"], "Invalid value for '--max-logprobs'"),
        (["--seed", "x"], "Invalid value for '--seed'"),
        (["--log-level", "loud"], "Invalid value for '--log-level'"),
        (
            ["--allowed-origins", "http://ok.example,ui.example/app"],
            "Invalid value for --allowed-origins: 'ui.example/app' is not an origin (scheme://host[:port], no path",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_serve_flags_exit_2_naming_the_problem(flags, message):
    code, out = invoke(*SERVE, *flags)
    assert code == 2, out
    assert message in out, out


def test_a_port_in_use_or_a_bad_host_exit_2_before_the_model_loads(tmp_path):
    """The HTTP address is bound before the model loads (as vLLM does): a port in use, a host name that does not
    resolve or an address of another machine end the command at once with exit 2, naming them. (It used to load the
    model, print the banner with the address, then fail in the front end: exit 1.) The broken model file proves
    the order: its load would fail too, and is never reached."""
    broken = tmp_path / "model.bin"
    broken.write_bytes(b"\0" * 64)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        in_use = f"error: cannot listen on --host 127.0.0.1 --port {port}: Address already in use (another process"
        for model in ("dummy:tiny-llama", str(broken)):
            code, out = invoke(*SERVE[:1], "--model", model, "--device", "cpu", "--port", port)
            assert (code, in_use in out, "minisgl serve:" in out, "not a .gguf" in out) == (2, True, False, False), out
    for host, why in (("no-such-host.invalid", ""), ("192.0.2.1", "Cannot assign requested")):
        code, out = invoke(*SERVE[:1], "--model", str(broken), "--device", "cpu", "--host", host)
        assert code == 2 and f"error: cannot listen on --host {host} --port 8000: {why}" in out, out
    code, out = invoke(*SERVE[:1], "--model", str(broken), "--device", "cpu", "--port", port)  # free again
    assert code == 2 and "is not a .gguf file" in out, out


def test_a_second_serve_on_a_port_another_serve_still_loads_for_exits_2():
    """serve binds its port before the model loads; it only bound it, with SO_REUSEADDR, so a second serve on the
    same port started meanwhile bound it too, loaded its model, and its front end served nothing (the failed
    listen() went to uvloop's exception handler). The port is held without SO_REUSEADDR until the front end listens."""
    from minisgl_cli.serve import bind_listener

    first = bind_listener("127.0.0.1", 0)
    try:
        with pytest.raises(typer.Exit) as e:
            bind_listener("127.0.0.1", first.getsockname()[1]).close()
        assert e.value.exit_code == 2
        # and a client meanwhile is refused at once, as vLLM's, not left waiting in a backlog for the whole load
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(first.getsockname()[:2], timeout=5).close()
    finally:
        first.close()


def test_an_unwritable_step_log_exits_2_before_the_model_loads(tmp_path):
    """serve --step-log is checked as the benchmarks' output paths are, before anything loads: it used to be written
    only when the server stopped, so a directory or a path under a file served for the whole run and then lost the
    log with a traceback. The broken model file proves the order, as above."""
    broken = tmp_path / "model.bin"
    broken.write_bytes(b"\0" * 64)
    for path, why in ((tmp_path, "is a directory; give a file name"), (broken / "steps.jsonl", "is a file, not a")):
        code, out = invoke(*SERVE, "--model", str(broken), "--step-log", str(path))
        assert code == 2 and "Invalid value for --step-log" in out and why in out, out
        assert "not a .gguf" not in out, out


def test_cuda_device_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, out = invoke(*SERVE, "--device", "cuda:1")
    assert code == 2 and "device 'cuda:1' asked for, but CUDA is not available" in out, out


def test_real_console_script_exits_2_without_a_traceback():
    for flags, message in ((["--page-size", "0"], "--page-size"), (["--device", "tpu"], "device must be")):
        p = subprocess.run(
            [MINISGL, *SERVE, *flags], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"}
        )
        assert p.returncode == 2, p.stderr
        assert message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_tp_that_does_not_divide_the_heads_under_torchrun():
    # SmolLM2-135M has 9 query heads and 3 KV heads: neither divides by 2.
    cmd = torchrun_cmd(2, "-m", "minisgl_cli", *SERVE[:1], "--model", "dummy:SmolLM2-135M", "--device", "cpu")
    cmd += ["--tp", "2"]
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="60", COLUMNS="300")
    p = run_with_children(cmd, 300, cwd=ROOT, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    # The first rank to fail leaves through the clean CLI exit (2), naming itself; torchrun may then stop the other.
    says = ": dummy:SmolLM2-135M: num_attention_heads 9 and num_key_value_heads 3 do not divide by the "
    assert re.search(r"error: rank [01]" + re.escape(says + "tensor-parallel size 2 (--tp)"), out), out[-3000:]
    assert "exitcode  : 2" in out, out[-3000:]
    assert not any(f'File "{ROOT / pkg}' in out for pkg in ("engine", "kvcache", "minisgl_cli")), out[-3000:]


@pytest.mark.parametrize(
    "preset, changes, tp, says",
    [
        ("SmolLM2-135M", {}, 3, None),  # 9 and 3 heads, 1536 wide: each divides by 3
        ("Qwen3-0.6B", {"intermediate_size": 3002}, 16, "num_key_value_heads 8 and intermediate_size 3002 do not"),
        ("Qwen3-0.6B", {"intermediate_size": 3002}, 8, "intermediate_size 3002 does not divide by the tensor-parallel"),
        ("tiny-qwen3-moe", {"moe_intermediate_size": 31}, 2, "moe_intermediate_size 31 does not divide"),
        ("tiny-qwen3-moe", {"intermediate_size": 31, "mlp_only_layers": ()}, 2, None),  # no dense layer holds it
        ("tiny-qwen3-moe", {"intermediate_size": 31}, 2, "intermediate_size 31 does not divide"),
    ],
)
def test_a_tp_size_that_does_not_divide_a_field_is_refused_by_its_name(preset, changes, tp, says):
    """Under torchrun a dense MLP's width not dividing by --tp said only "output size 3000 does not divide": no
    field, no file (the torchrun test above checks the whole path for the heads)."""
    cfg = dataclasses.replace(PRESETS[preset], **changes)
    if says is None:
        cfg.check_splits(tp)
    else:
        with pytest.raises(ValueError, match=re.escape(says)):
            cfg.check_splits(tp)


# ---- HTTP bodies (beyond tests/test_serve.py's BAD) ---------------------------------------------------------------

C, CH, R = "/v1/completions", "/v1/chat/completions", "/v1/responses"
MSG = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.fixture(scope="module")
def tiny():
    with live_server(make_llm(max_running_requests=8, num_pages=256)) as server:
        yield server


@pytest.mark.parametrize(
    "path, body, param, code, message",
    [
        (C, {"prompt": [[]]}, "prompt", None, "prompt is empty"),
        (C, {"prompt": [""]}, "prompt", None, "prompt is empty"),
        (C, {"prompt": [[1, 600]]}, "prompt", None, "prompt token id 600 is outside the vocabulary [0, 512)"),
        (C, {"prompt": [2**70]}, "prompt", None, f"prompt token id {2**70} is outside the vocabulary"),
        (C, {"prompt": {"text": "hi"}}, "prompt", "invalid_type", "prompt: expected str or list[int]"),
        (C, {"prompt": None}, "prompt", "invalid_type", "prompt: expected str"),
        (
            C,
            {"prompt": "hi", "max_tokens": True},
            "max_tokens",
            "int_type",
            "max_tokens: Input should be a valid integer",
        ),
        (C, {"prompt": "hi", "max_tokens": 10**30}, "prompt", "context_length_exceeded", "exceeds the model's context"),
        (C, {"prompt": "hi", "n": 10**12}, "n", None, "n must be in [1, 128] (got 1000000000000)"),
        (C, {"prompt": "hi", "n": 0}, "n", None, "n must be in [1, 128] (got 0)"),
        (
            C,
            {"prompt": "hi", "n": 4, "max_tokens": 1500},
            "n",
            None,
            "n=4 choices need prompt (2 tokens) + 4 x max_tokens",
        ),
        (C, {"prompt": "hi", "logprobs": 21}, "logprobs", None, "logprobs must be in [0, 20] or -1"),
        (C, {"prompt": "hi", "logprobs": True}, "logprobs", "int_type", "logprobs: Input should be a valid integer"),
        (C, {"prompt": "hi", "echo": 1}, "echo", "bool_type", "echo: Input should be a valid boolean"),
        (C, {"prompt": "hi", "logit_bias": {"600": 1}}, "logit_bias", None, "token id 600 is outside the vocabulary"),
        (C, {"prompt": "hi", "logit_bias": {"-3": 1}}, "logit_bias", None, "logit_bias must map token ids to numbers"),
        (C, {"prompt": "hi", "logit_bias": {"5": -100.5}}, "logit_bias", None, "numbers in [-100, 100]"),
        (C, {"prompt": "hi", "logit_bias": [5]}, "logit_bias", "dict_type", "logit_bias: Input should be a valid"),
        (C, {"prompt": "hi", "min_tokens": -1}, "min_tokens", None, "min_tokens must be an integer in [0, max_tokens]"),
        (C, {"prompt": "hi", "max_tokens": 0}, "max_tokens", None, "max_tokens must be an integer >= 1 (got 0)"),
        (C, {"prompt": "hi", "seed": 2**64 - 1, "n": 2}, "seed", None, "seed must be a 64-bit integer"),
        (
            C,
            {"prompt": "hi", "response_format": {"type": "json_object"}},
            "response_format",
            "unsupported_parameter",
            "response_format={'type': 'json_object'} is not supported by this server "
            "(leave it out, or send {'type': 'text'})",
        ),
        (
            CH,
            {
                "messages": MSG,
                "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}] * 2,
            },
            "tools",
            "unsupported_parameter",
            # a long value is cut short visibly (it ran into the rest: "...'parameters' is not supported")
            "tools=[{'type': 'function', 'function': {'name': 'get_weather', 'parameters': {}}}, {'type': 'function', "
            "'... is not supported by this server (leave it out, or send [])",
        ),
        (
            CH,
            {"messages": MSG, "guided_choice": ["a", "b"]},
            "guided_choice",
            "unsupported_parameter",
            "guided_choice=['a', 'b'] is not supported by this server (leave it out)",
        ),
        (C, {"prompt": "hi", "n": 1.5}, "n", "int_type", "n: Input should be a valid integer"),
        (C, {"prompt": "hi", "best_of": 0}, "best_of", None, "best_of must be in [n, 128] (got 0, n 1)"),
        (C, {"prompt": "hi", "stop": [1]}, "stop", "invalid_type", "stop: expected str or list[str]"),
        (C, {"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids", None, "stop_token_ids must be non-negative"),
        (
            C,
            '{"prompt": "hi", "temperature": NaN}',
            "temperature",
            "finite_number",
            "temperature: Input should be a finite number",
        ),
        (C, '{"prompt": "hi", "top_p": Infinity}', "top_p", "finite_number", "top_p: Input should be a finite number"),
        (C, {"prompt": "hi", "repetition_penalty": 1e-300}, "repetition_penalty", None, "repetition_penalty must be"),
        (C, {"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos", "bool_type", "ignore_eos: Input should be a valid"),
        (C, "null", None, "model_attributes_type", "request body must be a JSON object, sent as application/json"),
        (C, "", None, "missing", "request body: Field required"),  # not "request body : ..."
        (CH, {"messages": MSG, "max_tokens": -5}, "max_tokens", None, "max_tokens must be an integer >= 1 (got -5)"),
        (
            CH,
            {"messages": MSG, "max_completion_tokens": -5},
            "max_completion_tokens",
            None,
            "max_completion_tokens must be an integer >= 1 (got -5)",
        ),
        (CH, {"messages": [[]]}, "messages", "model_attributes_type", "messages.0: Input should be a valid dictionary"),
        (CH, {"messages": MSG, "n": 10**12}, "n", None, "n must be in [1, 128] (got 1000000000000)"),
        (CH, {"messages": MSG, "top_logprobs": 3}, "top_logprobs", None, "top_logprobs needs logprobs: true"),
        (
            CH,
            {"messages": MSG, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            None,
            "top_logprobs must be in [0, 20] or -1",
        ),
        (CH, {"messages": MSG, "tool_choice": "required"}, "tool_choice", "unsupported_parameter", "tool_choice="),
        (CH, {"messages": MSG, "best_of": 2}, "best_of", "unsupported_parameter", "best_of=2 is not supported"),
        (
            C,
            {"prompt": "hi", "stream_options": {"include_usage": True}},
            "stream_options",
            None,
            "Stream options can only be defined when stream=True",
        ),
        (
            CH,
            {"messages": MSG, "stream": False, "stream_options": {"include_usage": False}},  # ({} passes, as vLLM)
            "stream_options",
            None,
            "Stream options can only be defined when stream=True",
        ),
        (
            CH,
            {"messages": MSG, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            "stream_options",
            None,
            "Stream options can only be defined when stream=True",
        ),
        (
            C,
            {"prompt": "hi", "prompt_embeds": "AAAA"},
            "prompt_embeds",
            "unsupported_parameter",
            "prompt_embeds='AAAA' is not supported",
        ),
        (
            CH,
            {"messages": [*MSG, {"role": "assistant", "content": None, "tool_calls": [CALL]}, *MSG]},
            "messages",
            "unsupported_parameter",
            "messages[1].tool_calls=[{'id': ",
        ),
        (
            CH,
            {"messages": [*MSG, {"role": "assistant", "function_call": CALL["function"]}, *MSG]},
            "messages",
            "unsupported_parameter",
            "is not supported by this server (leave it out; tools are not supported)",
        ),
        (CH, {"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages", "string_type", "name"),
        (  # a tool's result: "each message needs a role (system/user/assistant)" before
            CH,
            {"messages": [*MSG, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]},
            "messages",
            None,
            "messages[1] has role 'tool' (a tool's result): tool calling is not supported",
        ),
        # /v1/responses items and parts it cannot read: "input: expected str or list[InputMessage]" before
        (
            R,
            {"input": [*MSG, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]},
            "input",
            "unsupported_parameter",
            "input[1] is a 'function_call' item: tool calls and their outputs (tools) are not supported",
        ),
        (
            R,
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "42"}]},
            "input",
            "unsupported_parameter",
            "input[0] is a 'function_call_output' item: tool calls",
        ),
        (
            R,
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
            "input",
            "unsupported_parameter",
            "input[0].content[0] is an 'input_image' part: images, files and audio are not supported",
        ),
        (
            R,
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_file"}]}]},
            "input",
            "unsupported_parameter",
            "input[0].content[1] is an 'input_file' part",
        ),
        # chat's max_tokens, unknown to the Responses API: it ran to the end of the context
        (R, {"input": "hi", "max_tokens": 3}, "max_tokens", "unknown_parameter", "argument supplied: max_tokens"),
        (R, {"input": "hi", "moderation": {"model": "m"}}, "moderation", "unsupported_parameter", "moderation="),
        (
            CH,
            {"messages": MSG * 3000, "max_tokens": 3},
            "messages",
            "context_length_exceeded",
            "exceeds the model's context length 2048",
        ),
    ],
    ids=lambda v: str(v)[:50] if not isinstance(v, str) or v.startswith("{") else None,
)
def test_bad_bodies_get_a_400_naming_the_field(tiny, path, body, param, code, message):
    raw = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(tiny.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err
    assert message in err["message"], err


def test_no_op_fields_change_nothing_and_unknown_ones_are_refused_by_name(tiny):
    """OpenAI's and vLLM's fields that change nothing a client gets (docs/serve.md's list) are accepted, and the answer
    is the one the same request gets without them; a field the server does not know is a 400 naming it, as OpenAI's
    "Unrecognized request argument supplied" (unknown fields were ignored, so a misspelt one, or one of a newer API
    that would change the answer, was dropped silently). Keys inside messages: tests/test_openai_api.py."""
    client = tiny.openai()
    plain = client.chat.completions.create(model=tiny.model, messages=MSG, max_tokens=8, temperature=0)
    extra = {
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "include_reasoning": True,
        "priority": 3,
        "session_id": "s",
        "cache_salt": "salt",
        "stream_interval": 4,
        "vllm_xargs": {},
    }
    messy = client.chat.completions.create(
        model=tiny.model,
        messages=[{"role": "user", "content": "hi", "name": "bob"}],
        max_tokens=8,
        temperature=0,
        user="u",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        safety_identifier="id",
        parallel_tool_calls=False,
        prediction={"type": "content", "content": "hello"},
        extra_body=extra,
    )
    assert messy.choices[0].message.content == plain.choices[0].message.content
    streamed = client.chat.completions.create(
        model=tiny.model,
        messages=MSG,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == plain.choices[0].message.content
    done = client.completions.create(model=tiny.model, prompt="hi", max_tokens=3, user="u", extra_body={"priority": 1})
    assert done.usage.completion_tokens == 3
    kw = dict(model=tiny.model, input="hi", max_output_tokens=6, temperature=0)
    noted = client.responses.create(
        **kw, service_tier="auto", prompt_cache_key="k", safety_identifier="id", max_tool_calls=2, user="u"
    )
    assert noted.output_text == client.responses.create(**kw).output_text
    for call, body, name in [
        (client.chat.completions.create, {"messages": MSG}, "top_n"),
        (client.completions.create, {"prompt": "hi"}, "stop_sequences"),  # Anthropic's name for stop
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            call(model=tiny.model, max_tokens=3, **body, extra_body={name: 2, "x-two": 1})
        assert e.value.param == name and e.value.code == "unknown_parameter", e.value
        assert f"Unrecognized request arguments supplied: {name}, x-two" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=tiny.model, messages=MSG, stream=True, stream_options={"include_usage": True, "usage": True}
        )
    assert e.value.param == "stream_options" and "supplied: stream_options.usage" in e.value.message
    # empty or missing content is an empty message, not an error: the chat template still makes a prompt of it
    for content in ("", None):
        out = client.chat.completions.create(
            model=tiny.model, max_tokens=3, messages=[{"role": "user", "content": content}]
        )
        assert out.usage.completion_tokens == 3
    m = tiny.wait_idle()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0)
    assert httpx.get(f"{tiny.url}/health").status_code == 200


# ---- the engine API ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, message",
    [
        (None, "prompt must be a string, a list of token ids, or a list of chat messages"),
        ([1, "a"], "prompt must be a string, a list of token ids"),
        ([1, True], "prompt must be a string, a list of token ids"),
        ([1.0, 2.0], "prompt must be a string, a list of token ids"),
        ("", "prompt is empty"),
        ([], "prompt is empty"),
        ([[1, 2]], "prompt must be a string, a list of token ids"),
        ([{"role": "wizard", "content": "hi"}], "each message needs a role"),
        ([{"role": "user"}], "each message needs a role (system/user/assistant) and content"),
        ([{"role": "tool", "content": "42"}], "messages[0] has role 'tool' (a tool's result): tool calling is not"),
        ([{"role": "user", "content": 5}], "messages[0].content must be a string or a list of content parts"),
        ([-1], "prompt token id -1 is outside the vocabulary [0, 512)"),
        ("a\ud800", "prompt holds a lone UTF-16 surrogate '\\ud800' at character 1, which is not valid Unicode"),
        ([{"role": "user", "content": "\udfff"}], "messages[0].content holds a lone UTF-16 surrogate"),
    ],
)
def test_bad_prompts_are_refused_by_the_engine_api(prompt, message):
    llm = make_llm(num_pages=64)
    with pytest.raises(ValueError) as e:
        llm.add_request(prompt, SamplingParams(max_tokens=2))
    assert message in str(e.value)
    assert not llm.has_work() and llm.metrics().kv_pages_free == 64


def test_a_bad_prompt_fails_generate_without_running_the_prompts_before_it():
    """generate() adds its prompts one by one: when the third is bad, the two already added are withdrawn, not left
    to run on in a later call, and no page is held."""
    llm = make_llm(num_pages=64, radix_cache=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 3], "hello", [7, 600]], SamplingParams(max_tokens=4))
    assert not llm.has_work() and llm.engine.reqs == {} and llm.metrics().kv_pages_free == 64
    outs = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))  # only what this call asked for runs
    assert len(outs) == 1 and len(outs[0].token_ids) == 4
    assert llm.metrics().kv_pages_free == 64


finite = st.floats(allow_nan=False, allow_infinity=False)
extreme = st.one_of(
    finite, st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e-6, 1e-5, 1.0, 2.0, 1e300, math.inf, -math.inf, math.nan])
)
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


@st.composite
def sampling_values(draw) -> dict:
    """A few fields set to anything (others left at their defaults, so valid mixes come up often)."""
    kw = {name: draw(extreme) for name in draw(st.sets(st.sampled_from(FLOAT_FIELDS), max_size=3))}
    if draw(st.booleans()):
        kw["top_k"] = draw(st.integers(-(2**64), 2**64) | st.sampled_from([-1, 0, 1, 2]))
    if draw(st.booleans()):
        kw["seed"] = draw(st.integers(-(2**65), 2**65))
    return kw


@pytest.fixture(scope="module")
def sampling_llm() -> LLM:
    return make_llm(num_pages=128, max_running_requests=4)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(kw=sampling_values())
def test_any_sampling_values_are_refused_by_name_or_sampled_sanely(sampling_llm, kw):
    try:
        params = SamplingParams(max_tokens=6, ignore_eos=True, **kw)
    except ValueError as e:
        assert str(e).split(" ")[0] in kw, e  # the message starts with the field's name
        return
    prompt = [7, 8, 9, 10]
    out = sampling_llm.generate([prompt], params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    assert all(0 <= t < 512 for t in out.token_ids)
    if (params.temperature < 1e-5 or params.top_k == 1) and not params.has_penalties:  # sampling's limit: greedy
        greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        assert out.token_ids == sampling_llm.generate([prompt], greedy)[0].token_ids
    m = sampling_llm.metrics()
    assert (m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0)


# ---- trace files (beyond tests/test_traces.py) --------------------------------------------------------------------


def _trace(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


def _mooncake(ts, n=100, out=5, hashes=(1,), **extra) -> str:
    return json.dumps({"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": list(hashes), **extra})


QWEN_LINE = {
    "chat_id": 1,
    "parent_chat_id": -1,
    "turn": 1,
    "type": "text",
    "input_length": 20,
    "output_length": 5,
    "hash_ids": [1, 2],
}


@pytest.mark.parametrize(
    "bad, why",
    [
        (json.dumps({"timestamp": 2, "input_length": 5, "hash_ids": [1]}), "missing field 'output_length'"),
        (_mooncake(float("nan")), "'timestamp' must be a finite number >= 0 (got nan)"),
        (_mooncake("12"), "'timestamp' must be a finite number >= 0 (got '12')"),
        (_mooncake(True), "'timestamp' must be a finite number >= 0 (got True)"),
        (_mooncake(5, n=0), "'input_length' must be >= 1 (got 0)"),
        (_mooncake(5, n=True), "'input_length' must be an integer (got True)"),
        (_mooncake(5, out=2.5), "'output_length' must be an integer (got 2.5)"),
        (
            json.dumps({"timestamp": 5, "input_length": 5, "output_length": 5, "hash_ids": "1,2"}),
            "'hash_ids' must be a list of integers",
        ),
    ],
)
def test_more_bad_trace_lines_name_file_line_and_field(tmp_path, bad, why):
    path = _trace(tmp_path, [_mooncake(0), _mooncake(1), bad])
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert f"{path}:3:" in str(e.value) and why in str(e.value), e.value


def test_bad_qwen_lines_and_unreadable_traces(tmp_path):
    lines = [json.dumps({**QWEN_LINE, "timestamp": t}) for t in (0.5, 2.0, 1.5)]
    with pytest.raises(
        TraceError,
        match=r"t.jsonl:3: timestamp goes back in time \(1.5 after the previous "
        r"request's 2\)",
    ):
        read_trace(_trace(tmp_path, lines))
    lines[2] = json.dumps({**QWEN_LINE, "timestamp": 3, "type": 7})
    with pytest.raises(TraceError, match=r"t.jsonl:3: 'type' must be a string \(got 7\)"):
        read_trace(_trace(tmp_path, lines))
    with pytest.raises(TraceError, match="no usable requests"):
        read_trace(_trace(tmp_path, ["", "  "], "blank.jsonl"))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"timestamp": 0, "note": "\xe9"}\n')
    with pytest.raises(TraceError, match=r"latin1.jsonl:1: not UTF-8 text \(byte 0xe9 at column 27\)"):
        read_trace(tmp_path / "latin1.jsonl")
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path)  # a directory


@pytest.mark.parametrize(
    "lines, message",
    [
        ([_mooncake(0), _mooncake(1, out=-4)], "t.jsonl:2: 'output_length' must be >= 1 (got -4)"),
        ([_mooncake(10), _mooncake(5)], "t.jsonl:2: timestamp goes back in time (5 after the previous request's 10)"),
        (
            [_mooncake(0), json.dumps({"input_length": 3, "output_length": 3, "hash_ids": []})],
            "t.jsonl:2: missing field 'timestamp'",
        ),
    ],
)
def test_bench_trace_stops_on_a_bad_trace_with_exit_2(tmp_path, lines, message):
    code, out = invoke(
        "bench-trace", str(_trace(tmp_path, lines)), "--model", "dummy:tiny-llama", "--device", "cpu", "--quiet"
    )
    assert code == 2 and message in out, out
    code, out = invoke("bench-trace", str(tmp_path / "missing.jsonl"), "--model", "dummy:tiny-llama", "--quiet")
    assert code == 2 and "cannot read trace" in out, out


# ---- model files -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "good"
    return save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), path)


def _copy(good: Path, tmp: Path, name: str) -> Path:
    d = tmp / name
    shutil.copytree(good, d)
    return d


def _edit_config(d: Path, **changes) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _truncate(f: Path, keep: float) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])


def broken_model(kind: str, good: Path, tmp: Path) -> tuple[Path, str, str]:
    """A broken copy of the good model: (path, the file the error must name, what it must say)."""
    d = _copy(good, tmp, kind)
    cfg, st_file = d / "config.json", d / "model.safetensors"
    if kind == "missing config.json":
        cfg.unlink()
        return d, str(d), "has no config.json"
    if kind == "config.json not JSON":
        cfg.write_text("{oops")
        return d, str(cfg), "is not valid JSON"
    if kind == "config.json not UTF-8":  # named no file
        cfg.write_bytes(b'{"x": "\xe9"}')
        return d, str(cfg), "is not UTF-8 text"
    if kind == "config.json nested too deep":  # a RecursionError traceback
        cfg.write_text("[" * 100_000 + "]" * 100_000)
        return d, str(cfg), "is not valid JSON: nested too deeply"
    if kind == "config.json a list":
        cfg.write_text("[1, 2]")
        return d, str(cfg), "holds a JSON list, not an object"
    if kind == "config.json lacks a field":
        return _edit_config(d, hidden_size=None), str(cfg), "lacks the field 'hidden_size'"
    if kind == "zero heads":
        return _edit_config(d, num_attention_heads=0), str(cfg), "num_attention_heads must be >= 1 (got 0)"
    if kind == "heads as a string":
        return _edit_config(d, num_attention_heads="four"), str(cfg), "'four'"
    if kind == "unsupported architecture":
        _edit_config(d, architectures=["GPT2LMHeadModel"], model_type="gpt2")
        return d, str(cfg), "unsupported architecture 'GPT2LMHeadModel' (supported: LlamaForCausalLM"
    if kind == "a GPT-2 config.json":
        cfg.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_head": 4, "n_embd": 64, "n_layer": 2}))
        return d, str(cfg), "unsupported architecture 'GPT2LMHeadModel'"
    if kind == "architectures and model_type disagree":  # transformers would build a Qwen3, vLLM a Llama
        _edit_config(d, model_type="qwen3")
        return d, str(cfg), "architectures ['LlamaForCausalLM'] and model_type 'qwen3' name different models"
    if kind == "no weights":
        st_file.unlink()
        return d, str(d), "has no .safetensors files"
    if kind == "truncated safetensors":
        _truncate(st_file, 0.5)
        return d, str(st_file), "cannot read"
    if kind == "safetensors cut inside its header":
        _truncate(st_file, 0.0005)
        return d, str(st_file), "cannot read"
    if kind == "empty safetensors":
        _truncate(st_file, 0)
        return d, str(st_file), "cannot read"
    if kind == "intermediate_size beyond memory":  # an allocator's byte count, naming no file, before the check
        says = "38,400,000,090,432 parameters (143,051.1 GiB in float32)"
        return _edit_config(d, intermediate_size=10**11), str(d), says
    if kind == "max_position_embeddings beyond memory":  # the rope table's
        return _edit_config(d, max_position_embeddings=10**10), str(d), "rope table of 10,000,000,000 positions"
    if kind == "weights for fewer layers":
        return _edit_config(d, num_hidden_layers=3), str(d), "checkpoint is missing 9 weights"
    if kind == "weights smaller than the config":
        return (
            _edit_config(d, intermediate_size=256),
            str(d),
            "weight 'layers.0.mlp.down_proj.weight' has shape (64, 128), but the config makes it (64, 256)",
        )
    if kind == "tied LM head stored apart":  # transformers unties it and uses it; it was skipped for the embedding
        says = "tie_word_embeddings=true, but the checkpoint holds an lm_head.weight that differs from the embedding"
        return _edit_config(d, tie_word_embeddings=True), str(d), says
    if kind == "weights larger than the config":  # used to load quietly, cut down to the config's size
        return (
            _edit_config(d, vocab_size=300),
            str(d),
            "weight 'lm_head.weight' has shape (512, 64), but the config makes it (300, 64)",
        )
    # config fields that would change the output, which the engine does not implement: refused, never ignored
    if kind == "quantized checkpoint":
        _edit_config(d, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
        return d, str(cfg), "quantized checkpoints are not supported (quantization_config: quant_method 'fp8')"
    if kind == "gelu activation":
        return _edit_config(d, hidden_act="gelu"), str(cfg), "hidden_act 'gelu' is not supported"
    if kind == "mlp_bias":
        return _edit_config(d, mlp_bias=True), str(cfg), "mlp_bias=true is not supported"
    if kind == "yarn rope scaling":
        _edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
        return d, str(cfg), "unsupported rope scaling type 'yarn'"
    if kind == "linear rope in rope_parameters":
        _edit_config(d, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
        return d, str(cfg), "unsupported rope scaling type 'linear'"
    if kind == "rope scaling naming no type":
        return _edit_config(d, rope_scaling={"factor": 2.0}), str(cfg), "unsupported rope scaling type None"
    if kind == "rope_scaling a list":
        return _edit_config(d, rope_scaling=[1, 2]), str(cfg), "rope_scaling must be an object (got [1, 2])"
    if kind == "llama3 rope without its factors":
        _edit_config(d, rope_scaling={"rope_type": "llama3", "factor": 8.0})
        return d, str(cfg), "llama3 rope scaling needs numbers for low_freq_factor"
    if kind == "sliding layer_types":
        _edit_config(d, layer_types=["sliding_attention", "full_attention"])
        return d, str(cfg), "layer_types ['sliding_attention'] are not supported"
    if kind == "fractional vocab_size":
        return _edit_config(d, vocab_size=512.7), str(cfg), "vocab_size must be an integer (got 512.7)"
    if kind == "negative rms_norm_eps":
        return _edit_config(d, rms_norm_eps=-1), str(cfg), "rms_norm_eps must be a positive number"
    if kind == "rope_theta 0":
        # both places: transformers (and the loader) take rope_parameters' theta before a top-level one
        params = {"rope_type": "default", "rope_theta": 0}
        return (
            _edit_config(d, rope_theta=0, rope_parameters=params),
            str(cfg),
            "rope_theta must be a positive number (got 0.0)",
        )
    if kind == "max_position_embeddings 0":
        return _edit_config(d, max_position_embeddings=0), str(cfg), "max_position_embeddings must be >= 1"
    if kind == "eos ids as strings":
        return _edit_config(d, eos_token_id=["</s>"]), str(cfg), "eos_token_id must be a token id"
    # special ids the model has no token for: an EOS it can never sample stopped nothing (ignored, loaded)
    if kind == "eos id outside the vocabulary":
        _edit_config(d, eos_token_id=512)
        return d, str(cfg), "eos_token_id 512 is outside the vocabulary (vocab_size 512: ids 0 to 511)"
    if kind == "an eos id of a list outside the vocabulary":
        _edit_config(d, eos_token_id=[2, 70000])
        return d, str(cfg), "eos_token_id [2, 70000]: 70000 is outside the vocabulary (vocab_size 512: ids 0 to 511)"
    if kind == "bos id outside the vocabulary":
        _edit_config(d, bos_token_id=1000)
        return d, str(cfg), "bos_token_id 1000 is outside the vocabulary (vocab_size 512: ids 0 to 511)"
    if kind == "tie_word_embeddings a string":
        return _edit_config(d, tie_word_embeddings="false"), str(cfg), "tie_word_embeddings must be true or false"
    if kind in ("int8 weights", "fp8 weights"):  # a cast would load them as a broken model
        dtype = torch.int8 if kind == "int8 weights" else torch.float8_e4m3fn
        _edit_weights(st_file, lambda sd: sd.update({UP: (sd[UP] * 100).to(dtype)}))
        return d, str(st_file), f"tensor 'model.layers.0.mlp.up_proj.weight' in {st_file} has dtype"
    # non-finite weights loaded quietly and made every logit NaN: the first such tensor is named, with its file
    if kind == "a NaN weight":  # and a later tensor all NaN: the first is named

        def nan(sd):
            sd[UP].view(-1)[77] = math.nan
            sd["model.layers.1.mlp.down_proj.weight"].fill_(math.nan)

        _edit_weights(st_file, nan)
        return d, str(st_file), f"weight '{UP}' in {st_file} holds 1 NaN and 0 infinite values of 8,192 (the model"
    if kind == "an infinite weight":
        _edit_weights(st_file, lambda sd: sd[UP].view(-1).index_fill_(0, torch.tensor([5]), -math.inf))
        return d, str(st_file), f"weight '{UP}' in {st_file} holds 0 NaN and 1 infinite values of 8,192"
    if kind == "a tensor in two files":  # the later copy replaced the earlier one
        shutil.copy(st_file, d / "model-copy.safetensors")
        return d, str(d / "model-copy.safetensors"), "is in both"
    if kind == "index lists a missing shard":
        _shard(d)
        (d / "model-00002-of-00002.safetensors").unlink()
        return d, str(d), "lists 1 file(s) missing from"
    if kind == "index not JSON":
        _shard(d)
        (d / "model.safetensors.index.json").write_text("{")
        return d, str(d / "model.safetensors.index.json"), "is not a safetensors index"
    if kind == "tokenizer.json not JSON":
        (d / "tokenizer.json").write_text("{bad")
        return d, str(d), "cannot load the tokenizer in"
    raise AssertionError(kind)


UP = "model.layers.0.mlp.up_proj.weight"
EMBED = "model.embed_tokens.weight"


def _edit_weights(f: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(f)
    edit(sd)
    save_file(sd, f)


def _shard(d: Path) -> None:
    """Split model.safetensors in two, with the index transformers writes."""
    from safetensors.torch import load_file, save_file

    sd = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, keys in halves.items():
        save_file({k: sd[k] for k in keys}, d / f)
    weight_map = {k: f for f, keys in halves.items() for k in keys}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_a_tied_lm_head_stored_as_a_copy_of_the_embedding_loads(good_dir, tmp_path):
    """Checkpoints that tie the head and store it anyway (an equal copy) load as the tied model they are."""
    d = _copy(good_dir, tmp_path, "tied")
    _edit_weights(d / "model.safetensors", lambda sd: sd.__setitem__("lm_head.weight", sd[EMBED].clone()))
    _edit_config(d, tie_word_embeddings=True)
    kept = _copy(d, tmp_path, "tied-kept")
    _edit_weights(kept / "model.safetensors", lambda sd: sd.pop("lm_head.weight"))
    params = SamplingParams(max_tokens=6, temperature=0)
    copied = LLM(EngineConfig(model=str(d), device="cpu", num_pages=16)).generate([[1, 2, 3]], params)
    tied = LLM(EngineConfig(model=str(kept), device="cpu", num_pages=16)).generate([[1, 2, 3]], params)
    assert list(copied[0].token_ids) == list(tied[0].token_ids)


def test_a_sharded_checkpoint_reads_only_the_files_of_its_index(good_dir, tmp_path):
    """A stray .safetensors beside the shards (Mistral repos ship consolidated.safetensors) is not part of it."""
    from safetensors.torch import save_file

    d = _copy(good_dir, tmp_path, "sharded")
    _shard(d)
    save_file({"layers.0.attention.wq.weight": torch.zeros(2)}, d / "consolidated.safetensors")
    params = SamplingParams(max_tokens=6, temperature=0)
    sharded = LLM(EngineConfig(model=str(d), device="cpu", num_pages=16)).generate([[1, 2, 3]], params)
    whole = LLM(EngineConfig(model=str(good_dir), device="cpu", num_pages=16)).generate([[1, 2, 3]], params)
    assert list(sharded[0].token_ids) == list(whole[0].token_ids)


def test_a_checkpoint_without_a_tokenizer_says_text_goes_through_bytes(good_dir, capfd):
    """No silent fallback: a HF directory without tokenizer files still loads (token-id prompts work), with a
    warning naming it."""
    llm = LLM(EngineConfig(model=str(good_dir), device="cpu", num_pages=16))
    err = capfd.readouterr().err
    assert f"{good_dir} has no tokenizer" in err and "UTF-8 bytes" in err, err
    assert llm.tokenizer.vocab_size == 256


def _tiny_gguf(f: Path, drop=(), kv: dict | None = None, tensors: dict | None = None, nan: str = "") -> None:
    """A tiny Llama GGUF (no tokenizer: the config is read first): `drop` metadata, add `kv` (under llama., but
    tokenizer.* keys) and `tensors` (name: shape, of ones, or name: array); the tensor named `nan` holds a NaN."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(f), "llama")
    meta = {"block_count": 1, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4}
    meta |= {"attention.head_count_kv": 2, "context_length": 256, "vocab_size": 512}
    for key, value in meta.items():
        if key.split(".")[-1] not in drop:
            w.add_uint32(f"llama.{key}", value)
    for key, value in (kv or {}).items():  # tokenizer.* keys as they are
        key = key if key.startswith("tokenizer.") else f"llama.{key}"
        add = w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32
        add(key, value)
    shapes = {"token_embd.weight": (512, 64), "output_norm.weight": (64,), "blk.0.attn_q.weight": (64, 64)}
    shapes |= {"blk.0.attn_k.weight": (32, 64), "blk.0.attn_v.weight": (32, 64), "blk.0.attn_output.weight": (64, 64)}
    shapes |= {"blk.0.ffn_gate.weight": (128, 64), "blk.0.ffn_up.weight": (128, 64), "blk.0.ffn_down.weight": (64, 128)}
    shapes |= {"blk.0.attn_norm.weight": (64,), "blk.0.ffn_norm.weight": (64,)} | (tensors or {})
    for name, shape in shapes.items():
        data = shape if isinstance(shape, np.ndarray) else np.ones(shape, dtype=np.float32)
        if name == nan:
            data.flat[3] = np.nan
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def broken_gguf(kind: str, tmp: Path) -> tuple[Path, str, str]:
    f = tmp / f"{kind.replace(' ', '_')}.gguf"
    if kind == "random bytes":
        f.write_bytes(os.urandom(4096))
    elif kind == "empty":
        f.write_bytes(b"")
    elif kind == "GGUF lacking head_count":
        _tiny_gguf(f, drop=("head_count",))
        return f, str(f), "GGUF metadata lacks 'llama.attention.head_count'"
    elif kind == "GGUF lacking context_length":  # was taken as 4096 whatever the model was trained to
        _tiny_gguf(f, drop=("context_length",))
        return f, str(f), "GGUF metadata lacks 'llama.context_length'"
    elif kind == "GGUF with linear rope scale":  # llama.cpp scales linearly by a factor naming no type
        _tiny_gguf(f, kv={"rope.scale_linear": 4.0})
        return f, str(f), "GGUF llama.rope.scale_linear = 4.0 (linear rope scaling) is not supported"
    elif kind == "GGUF with yarn rope":
        _tiny_gguf(f, kv={"rope.scaling.type": "yarn"})
        return f, str(f), "GGUF rope scaling 'yarn' is not supported"
    elif kind.startswith("GGUF rope_freqs"):  # llama3 rope factors, one per frequency: head_dim 16 has 8
        import numpy as np

        bad = "rope frequency factors (freq_factors; a GGUF's rope_freqs.weight) must be finite numbers > 0"
        values, says = {
            "GGUF rope_freqs of the wrong length": (
                np.ones(7, dtype=np.float32),
                "need head_dim / 2 = 8 of them (got 7)",
            ),
            "GGUF rope_freqs not finite": (
                np.array([1, 2, np.nan] + [8] * 5, dtype=np.float32),
                f"{bad} (factor 2 is nan)",
            ),
            "GGUF rope_freqs with a zero": (
                np.array([0, 2, 4] + [8] * 5, dtype=np.float32),
                f"{bad} (factor 0 is 0.0)",
            ),
            "GGUF rope_freqs of integers": (np.ones(8, dtype=np.int32), "rope_freqs.weight has type I32, not F32"),
        }[kind]
        _tiny_gguf(f, tensors={"rope_freqs.weight": values})
        return f, str(f), says
    elif kind == "GGUF with partial rotary":
        _tiny_gguf(f, kv={"rope.dimension_count": 8})
        return f, str(f), "partial rotary embeddings (rope over 8 of 16 dims)"
    elif kind == "GGUF with a NaN weight":
        _tiny_gguf(f, nan="blk.0.ffn_up.weight")
        return f, str(f), f"weight '{UP}' in {f} (GGUF tensor blk.0.ffn_up.weight) holds 1 NaN and 0 infinite values"
    elif kind == "GGUF eos outside the vocabulary":
        _tiny_gguf(f, kv={"tokenizer.ggml.eos_token_id": 600})
        return (
            f,
            str(f),
            "tokenizer.ggml.eos_token_id 600 is outside the vocabulary (llama.vocab_size 512: ids 0 to 511)",
        )
    elif kind == "GGUF bos outside the vocabulary":
        _tiny_gguf(f, kv={"tokenizer.ggml.bos_token_id": 512})
        return f, str(f), "tokenizer.ggml.bos_token_id 512 is outside the vocabulary (llama.vocab_size 512"
    else:  # "truncated": the real embedded model cut in half
        with open(embedded_default_path(), "rb") as src:
            f.write_bytes(src.read(os.path.getsize(embedded_default_path()) // 2))
    return f, str(f), "is not a readable GGUF file"


HF_CASES = [
    "missing config.json",
    "config.json not JSON",
    "config.json not UTF-8",
    "config.json nested too deep",
    "config.json a list",
    "config.json lacks a field",
    "zero heads",
    "heads as a string",
    "unsupported architecture",
    "a GPT-2 config.json",
    "architectures and model_type disagree",
    "no weights",
    "truncated safetensors",
    "safetensors cut inside its header",
    "empty safetensors",
    "intermediate_size beyond memory",
    "max_position_embeddings beyond memory",
    "weights for fewer layers",
    "weights smaller than the config",
    "weights larger than the config",
    "tied LM head stored apart",
    "quantized checkpoint",
    "gelu activation",
    "mlp_bias",
    "yarn rope scaling",
    "linear rope in rope_parameters",
    "rope scaling naming no type",
    "rope_scaling a list",
    "llama3 rope without its factors",
    "sliding layer_types",
    "fractional vocab_size",
    "negative rms_norm_eps",
    "rope_theta 0",
    "max_position_embeddings 0",
    "eos ids as strings",
    "eos id outside the vocabulary",
    "an eos id of a list outside the vocabulary",
    "bos id outside the vocabulary",
    "tie_word_embeddings a string",
    "a NaN weight",
    "an infinite weight",
    "int8 weights",
    "fp8 weights",
    "a tensor in two files",
    "index lists a missing shard",
    "index not JSON",
    "tokenizer.json not JSON",
]
GGUF_CASES = [
    "random bytes",
    "empty",
    "truncated",
    "GGUF lacking head_count",
    "GGUF lacking context_length",
    "GGUF with yarn rope",
    "GGUF with linear rope scale",
    "GGUF rope_freqs of the wrong length",
    "GGUF rope_freqs not finite",
    "GGUF rope_freqs with a zero",
    "GGUF rope_freqs of integers",
    "GGUF with partial rotary",
    "GGUF eos outside the vocabulary",
    "GGUF bos outside the vocabulary",
    "GGUF with a NaN weight",
]


@pytest.mark.parametrize("kind", HF_CASES + GGUF_CASES)
def test_broken_model_files_are_named_in_the_error(kind, good_dir, tmp_path):
    path, names, says = broken_gguf(kind, tmp_path) if kind in GGUF_CASES else broken_model(kind, good_dir, tmp_path)
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        LLM(EngineConfig(model=str(path), device="cpu", num_pages=16))
    assert names in str(e.value) and says in str(e.value), e.value


@pytest.mark.parametrize(
    "kind",
    [
        "missing config.json",
        "truncated safetensors",
        "unsupported architecture",
        "weights larger than the config",
        "no weights",
        "random bytes",
        "quantized checkpoint",
        "yarn rope scaling",
        "fp8 weights",
        "index lists a missing shard",
        "tokenizer.json not JSON",
        "GGUF lacking head_count",
        "eos id outside the vocabulary",
        "GGUF eos outside the vocabulary",
        "a NaN weight",
        "intermediate_size beyond memory",
    ],
)
def test_broken_model_files_exit_2_from_the_cli(kind, good_dir, tmp_path):
    path, names, says = broken_gguf(kind, tmp_path) if kind in GGUF_CASES else broken_model(kind, good_dir, tmp_path)
    code, out = invoke("bench-offline", "--model", str(path), "--device", "cpu", "--num-seqs", "1", "--quiet")
    assert code == 2, out
    assert says in out and names.replace(" ", "") in out.replace(" ", ""), out


def test_a_weight_beyond_float16s_range_is_refused_as_loaded_in_float16(good_dir, tmp_path):
    """The check runs on the tensor as loaded: a finite fp32 value past float16's largest (65504) would load as an
    infinity; the message says the cast made it, not the file. The same checkpoint loads in float32."""
    d = _copy(good_dir, tmp_path, "big")
    _edit_weights(d / "model.safetensors", lambda sd: sd[UP].view(-1).__setitem__(0, 1e6))
    with pytest.raises(ValueError) as e:
        LLM(EngineConfig(model=str(d), device="cpu", dtype="float16", num_pages=16))
    assert (
        f"weight '{UP}' in {d / 'model.safetensors'} holds 0 NaN and 1 infinite values of 8,192 once cast to "
        "float16: its values are finite but beyond float16's range" in str(e.value)
    ), e.value
    LLM(EngineConfig(model=str(d), device="cpu", dtype="float32", num_pages=16))


def test_a_cached_conversion_with_a_nan_is_refused_naming_the_cached_file(tmp_path, monkeypatch):
    """The weight cache's read path (a GGUF's dequantized copy, read as a HF directory): a NaN there is named with the
    cached file, as in any checkpoint. The entry is written by the cache's own store()."""
    from engine import weight_cache
    from engine.weights import gguf_config, gguf_weights

    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    _tiny_gguf(f)
    cfg = gguf_config(f)
    weights = {name: w for name, w in gguf_weights(f, cfg)}
    weights[UP].view(-1)[9] = math.nan
    entry = weight_cache.store(f, cfg, weights, None, {})
    assert entry is not None and weight_cache.lookup(f) == entry
    with pytest.raises(ValueError) as e:
        LLM(EngineConfig(model=str(f), device="cpu", num_pages=16))
    assert f"weight '{UP}' in {entry / 'model.safetensors'} holds 1 NaN" in str(e.value), e.value


def test_a_model_file_that_is_not_gguf(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="model file '.*model.bin' is not a .gguf file"):
        LLM(EngineConfig(model=str(tmp_path / "model.bin"), device="cpu"))


def test_h_is_help_and_version_prints_the_packages():
    """As vLLM's and SGLang's commands: `-h` ("No such option: -h" here) and `--version` (none)."""
    from importlib.metadata import version

    for args in (["-h"], ["serve", "-h"], ["bench-trace", "-h"]):
        r = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
        assert r.exit_code == 0 and "Usage: " in r.output, r.output
    r = CliRunner().invoke(app, ["--version"])
    assert (r.exit_code, r.output) == (0, f"minisgl {version('minisgl')}\n")


def test_usage_lines_name_arguments_as_click_does():
    """Typer (rich markup off) wrote `Usage: minisgl bench-compare [OPTIONS] {files}...` and `files... <list[Path]>`
    under "Arguments:". Every command's usage line, in its --help and above an error, is click's: `FILES...`."""

    def commands(cmd: typer.core.TyperGroup, path: list[str]) -> list[list[str]]:
        found = []
        for name, sub in cmd.commands.items():
            found += commands(sub, [*path, name]) if isinstance(sub, typer.core.TyperGroup) else [[*path, name]]
        return found

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    arguments = {
        "bench-compare": "FILES...",
        "bench-trace": "TRACE",
        "cache export": "ARCHIVE",
        "cache import": "ARCHIVE",
    }
    every = commands(group, [])
    assert {" ".join(c) for c in every} >= {"chat", "serve", "bench-offline", "bench-serve", *arguments}
    for path in every:
        name = " ".join(path)
        expected = f"Usage: minisgl {name} [OPTIONS]" + (f" {arguments[name]}" if name in arguments else "")
        r = CliRunner().invoke(app, [*path, "--help"], prog_name="minisgl", env={"COLUMNS": "300"})
        assert r.exit_code == 0 and r.output.splitlines()[0] == expected, r.output
        if name in arguments:
            listed = r.output.split("Arguments:\n")[1].splitlines()[0].split()
            assert listed[0] == arguments[name], r.output
    r = CliRunner().invoke(app, ["bench-compare"], prog_name="minisgl")
    assert r.exit_code == 2, r.output
    assert r.output.splitlines()[0] == "Usage: minisgl bench-compare [OPTIONS] FILES...", r.output
    assert "Missing argument 'FILES'." in r.output, r.output


@pytest.mark.parametrize("command", ["chat", "serve", "bench-offline"])
def test_ctrl_c_while_the_model_loads_says_so(tmp_path, command):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the embedded GGUF loads, first in a fresh
    cache: every command exited 130 without a word. Now one line says so; no process, socket folder, staging folder
    or chat database is left. The signal goes once the load has fingerprinted the file (its hash memo appears)."""
    import signal
    import time

    cache, tmp, data = tmp_path / "cache", tmp_path / "tmp", tmp_path / "data"
    tmp.mkdir()
    args = {"chat": ["--no-tui"], "serve": ["--port", str(free_port())], "bench-offline": []}[command]
    env = subprocess_env(MINISGL_CACHE_DIR=str(cache), TMPDIR=str(tmp), XDG_DATA_HOME=str(data))
    p = subprocess.Popen(
        [sys.executable, "-m", "minisgl_cli", command, *args, "--device", "cpu"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores SIGINT
    )
    try:
        deadline = time.monotonic() + 120
        while not any(cache.glob("gguf-v*/hashes/*")):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate(timeout=60)
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    # 130, or ended by the SIGINT itself (a finalizer that swallowed the interrupt has it signalled again, ctrl_c.py,
    # which can land after the message; CI saw it once for serve): a shell reports either as status 130
    assert p.returncode in (130, -signal.SIGINT) and out == "", (p.returncode, out, err)
    assert [line for line in err.splitlines() if line.strip()] == ["interrupted while loading the model"], err
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # the chat's own process too
    assert list(tmp.iterdir()) == [] and not list(cache.rglob("*.tmp")), list(tmp_path.rglob("*"))
    assert not list(data.rglob("*.db")), list(data.rglob("*"))


@pytest.mark.parametrize("wrapped_as", [ValueError, OSError, RuntimeError])
def test_ctrl_c_that_a_library_turned_into_its_own_error_still_interrupts_the_load(monkeypatch, capsys, wrapped_as):
    """A Ctrl-C that lands where code catches the KeyboardInterrupt and raises an error of its own (a library's
    wrapper around whatever its import raised) reached the load's error handling as a model error: "error: ..." and
    exit 2 (ValueError, OSError) or a traceback (anything else), as a CI run of the chat's terminal test once saw. The
    load is stopped by a real SIGINT to this process here; what catches and wraps it stands for such a library."""
    import signal
    import time

    import engine.llm
    from minisgl_cli.options import load_llm

    def interrupted_and_wrapped(config, progress=None):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # the handler raises in here
            raise AssertionError("the SIGINT was not delivered")
        except KeyboardInterrupt as e:
            raise wrapped_as("cannot build a tokenizer: the import failed") from e

    monkeypatch.setattr(engine.llm, "LLM", interrupted_and_wrapped)
    with pytest.raises(typer.Exit) as stopped:
        load_llm(EngineConfig(model="dummy:tiny-llama", device="cpu"))
    assert stopped.value.exit_code == 130
    err = capsys.readouterr().err
    assert "interrupted while loading the model" in err and "error:" not in err, err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the load's own handler is gone


def test_a_model_error_without_ctrl_c_is_still_a_model_error(monkeypatch, capsys):
    import signal

    import engine.llm
    from minisgl_cli.options import load_llm

    def broken(config, progress=None):
        raise ValueError("config.json: no hidden_size")

    monkeypatch.setattr(engine.llm, "LLM", broken)
    with pytest.raises(typer.Exit) as stopped:
        load_llm(EngineConfig(model="dummy:tiny-llama", device="cpu"))
    assert stopped.value.exit_code == 2
    assert "error: config.json: no hidden_size" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_version_of_a_checkout_that_is_not_installed(monkeypatch):
    """The GPU machine runs the checkout from PYTHONPATH, with no package metadata: --version raised
    PackageNotFoundError. (The metadata lookup is made to fail as it does there: this machine has it installed.)"""
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and re.fullmatch(r"minisgl \d+\.\d+\.\d+ \(not installed: .+\)\n", r.output), r.output


@pytest.mark.parametrize("command", ["chat", "serve", "bench-offline", "bench-trace", "bench-serve"])
def test_every_engine_command_takes_every_engine_flag(command):
    """One list of engine flags (minisgl_cli/options.py ENGINE_FLAGS) for every command that builds an engine."""
    from minisgl_cli.options import ENGINE_FLAGS

    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    for name, _, _ in ENGINE_FLAGS:
        assert f"--{name.replace('_', '-')}" in r.output, (command, name)
    args = [command, "--kv-cache-dtype", "int4", "--device", "cpu"] + (
        [str(Path(__file__).parent.parent / "traces" / "qwen_sample.jsonl")] if "trace" in command else []
    )
    bad = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "kv_cache_dtype must be auto, fp8 or fp8_e4m3" in flat(bad.output), bad.output


# per command: a small run, so that a flag wrongly accepted fails the test in seconds (serve would serve: timeout)
SMALL_RUN = {
    "chat": ["--no-tui"],
    "serve": ["--port", "0"],
    "bench-offline": ["--num-seqs", "2", "--input-len", "4:8", "--output-len", "2:2"],
    "bench-trace": [str(ROOT / "traces" / "qwen_sample.jsonl"), "--num-requests", "2", "--time-scale", "0"],
    "bench-serve": ["--num-requests", "2", "--input-len", "4:4", "--output-len", "2:2"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", list(SMALL_RUN))
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-pages", "64", "--kv-cache-gb", "1"], "--kv-cache-gb: budgets the KV pool, and --num-pages sets its"),
        (
            ["--kv-cache-gb", "1", "--memory-fraction", "0.5"],
            "--memory-fraction: sizes the KV pool from GPU memory, and --num-pages / --kv-cache-gb size it instead",
        ),
        (
            ["--no-mixed-batch", "--mixed-prefill-tokens", "512"],
            "--mixed-prefill-tokens: bounds prefill in mixed batches, and --no-mixed-batch runs none",
        ),
        (
            ["--cuda-graph-max-bs", "8", "--piecewise-graph-tokens", "0", "--no-overlap"],
            "--cuda-graph-max-bs, --piecewise-graph-tokens, --no-overlap: sets the engine on a CUDA device, and this "
            "one runs on cpu",
        ),
    ],
    ids=["pages-and-budget", "fraction-and-budget", "prefill-without-mixed", "cuda-on-cpu"],
)
def test_engine_flags_the_engine_would_not_read_are_refused(command, flags, message):
    """Every command that builds minisgl's engine refuses, by name, engine flags that engine would not read: they
    were accepted and ignored (--kv-cache-gb beside --num-pages, --memory-fraction beside either, the prefill bound of
    mixed batches without them, CUDA settings on the CPU)."""
    args = [command, "--model", "dummy:tiny-llama", "--device", "cpu", *SMALL_RUN[command], *flags]
    code, out = invoke(*args)
    assert code == 2 and f"Invalid value for {message}" in out, out


def test_the_cli_defaults_are_the_engines_and_help_imports_no_torch():
    """ENGINE_FLAGS takes its defaults from EngineConfig's fields (the `no_*` switches off), and neither it nor
    `minisgl --help` imports torch: engine/config.py imports it only inside the methods that need it."""
    from dataclasses import fields

    from minisgl_cli.options import ENGINE_FLAGS, engine_config

    config = {f.name: f.default for f in fields(EngineConfig)}
    for name, _, default in ENGINE_FLAGS:
        assert default == (False if name.startswith("no_") else config[name]), name
    assert engine_config() == EngineConfig()
    probe = "import sys; from minisgl_cli.app import app; sys.argv = ['minisgl', '--help']\n"
    probe += "try:\n    app()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "bench-offline" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"page_size": 1.5}, "page_size must be int (got 1.5)"),  # failed at the pool's size with a bare TypeError
        ({"num_pages": "16"}, "num_pages must be int or None (got '16')"),
        ({"overlap": "yes"}, "overlap must be bool or None (got 'yes')"),  # truthy: taken as true
        ({"check_invariants": "no"}, "check_invariants must be bool (got 'no')"),
        ({"tp": True}, "tp must be int (got True)"),
        ({"seed": 2**70}, "seed must be a 64-bit integer"),  # overflowed at the start
        ({"model": ""}, "model must name a model (None: the embedded default)"),  # loaded the embedded one
        ({"max_logprobs": -2}, "max_logprobs must be >= 0, or -1 for the whole vocabulary (got -2)"),  # vLLM's ge=-1
    ],
)
def test_engine_config_values_of_the_wrong_type_are_refused_by_name(kw, message):
    """EngineConfig through the Python API, where no CLI parser stands in front of it."""
    from engine.config import EngineConfig

    with pytest.raises(ValueError) as e:
        EngineConfig(**kw)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"temperature": "0.5"}, "temperature must be a finite number (got '0.5')"),
        ({"top_p": None}, "top_p must be a finite number (got None)"),
        ({"repetition_penalty": True}, "repetition_penalty must be a finite number (got True)"),
        # inf passed (and with a masked token every draw became token 0); an int past any float was a traceback
        ({"temperature": float("inf")}, "temperature must be a finite number (got inf)"),
        ({"temperature": 10**400}, "temperature must be a finite number (got 10000000000000000000...(401 characters))"),
        ({"logit_bias": {True: 1.0}}, "logit_bias must map token ids"),  # a bool key failed the engine's step
        ({"seed": True}, "seed must be a 64-bit integer (got True)"),
        ({"max_tokens": True}, "max_tokens must be an integer (got True)"),
        ({"min_tokens": 1.0}, "min_tokens must be an integer (got 1.0)"),
        ({"ignore_eos": "false"}, "ignore_eos must be true or false (got 'false')"),  # truthy: EOS was ignored
        ({"stop": 5}, "stop and stop_token_ids must be lists"),  # None is vLLM's "none" (tests/test_llm_api.py)
        ({"stop_token_ids": [True]}, "stop_token_ids must be non-negative integers"),
        # the most is the engine's max_logprobs, checked at submission (tests/test_llm_api.py)
        ({"logprobs": -2}, "logprobs must be an integer >= 0, or -1 for the whole vocabulary (got -2)"),
        ({"prompt_logprobs": 2.0}, "prompt_logprobs must be an integer >= 0, or -1 for the whole vocabulary (got 2.0)"),
    ],
)
def test_sampling_params_of_the_wrong_type_are_refused_by_name(kw, message):
    """The Python API takes no JSON schema: a string, None or bool where a number goes raised a bare TypeError
    (or, for ignore_eos="false", was taken as true)."""
    with pytest.raises(ValueError) as e:
        SamplingParams(**kw)
    assert message in str(e.value)


def test_huge_integer_sampling_values_run_as_floats():
    """temperature=2**63 and repetition_penalty=2**64 passed the checks as ints, went into the sampler's int64
    tensors and failed the step, which ends the engine for every request; they are floats now, and sample."""
    llm = make_llm("dummy:tiny-llama", num_pages=64)
    try:
        for params in (
            SamplingParams(temperature=2**63, max_tokens=3, seed=1),
            SamplingParams(temperature=0, repetition_penalty=2**64, max_tokens=3),
        ):
            assert isinstance(params.temperature, float) and isinstance(params.repetition_penalty, float)
            out = llm.generate([[1, 2, 3, 1, 2, 3]], params)[0]
            assert len(out.token_ids) == 3 and out.finish_reason == "length"
        assert llm.engine.failed is None
    finally:
        llm.shutdown()


def test_messages_need_a_chat_template(smollm):
    """No template, no guessed layout: a real tokenizer without one refuses messages (vLLM's answer too); the byte
    tokenizer of dummy models keeps its "role: content" lines so their chats and servers run."""
    import copy

    from engine.tokenizer import ByteTokenizer, Tokenizer

    chat = [{"role": "user", "content": "hi"}]
    hf = copy.deepcopy(smollm.tokenizer.hf)
    hf.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(hf).chat_prompt(chat)
    assert ByteTokenizer().chat_prompt(chat) == "user: hi\nassistant:"
    assert "<|im_start|>user\nhi<|im_end|>" in smollm.tokenizer.chat_prompt(chat)
