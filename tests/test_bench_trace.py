"""`minisgl bench-trace`: real replays on a tiny model (in-process, and against a real `minisgl serve` over HTTP),
with the JSON checked against the trace: token counts, ordered percentiles, cache hits, clamping, failures."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from minisgl_cli.app import app
from minisgl_cli.trace_reader import read_trace
from tests.conftest import serve_subprocess, sigint_once_shown, subprocess_env
from tests.test_bench_offline import flat

TRACES = Path(__file__).resolve().parent.parent / "traces"
QWEN = TRACES / "qwen_sample.jsonl"
TINY = ["--model", "dummy:tiny-llama", "--device", "cpu", "--quiet"]
SERIES = ("ttft", "itl", "tpot", "e2e_latency")


def replay(tmp_path: Path, trace: Path, *args: str) -> dict:
    out = tmp_path / "trace.json"
    r = CliRunner().invoke(app, ["bench-trace", str(trace), *args, "--json", str(out)])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return json.loads(out.read_text())


def check_latencies(res: dict) -> None:
    for s in SERIES:
        v = [res[f"{k}_{s}_ms"] for k in ("median", "p90", "p99", "max")]
        assert all(x is not None and x >= 0 for x in v), s
        assert v == sorted(v), (s, v)
        assert 0 < res[f"mean_{s}_ms"] <= res[f"max_{s}_ms"], s
    assert res["max_ttft_ms"] <= res["max_e2e_latency_ms"]


@pytest.mark.parametrize("radix", [True, False])
def test_qwen_replay_in_process(tmp_path, radix):
    trace = read_trace(QWEN)
    log = tmp_path / "steps.jsonl"
    res = replay(
        tmp_path,
        QWEN,
        *TINY,
        *("--time-scale", "0.1", "--step-log", str(log), "--save-detailed"),
        *([] if radix else ["--no-radix-cache"]),
    )
    n = len(trace.requests)
    assert (res["completed"], res["failed"], res["mode"], res["format"]) == (n, 0, "in-process", "qwen")
    assert res["gpu"] is None and res["gpu_busy"] is None  # CPU: no NVML samples
    assert res["total_input_tokens"] == sum(r.input_length for r in trace.requests)
    assert res["total_output_tokens"] == res["expected_output_tokens"] == sum(r.output_length for r in trace.requests)
    assert res["duration"] >= trace.requests[-1].timestamp * 0.1  # arrivals were waited for
    assert res["request_throughput"] == pytest.approx(n / res["duration"])
    assert res["output_throughput"] == pytest.approx(res["total_output_tokens"] / res["duration"])
    check_latencies(res)
    # the per-request arrays (bench-serve's) recompute the figures: the JSON had none of them
    req = res["requests"]
    assert (
        req["indices"] == list(range(n))
        and all(req["success"])
        and sum(req["output_lens"]) == res["total_output_tokens"]
    )
    assert statistics.median(req["ttfts"]) * 1000 == pytest.approx(res["median_ttft_ms"], abs=1e-2)
    assert req["send_times"] == sorted(req["send_times"]) and req["send_times"][-1] <= res["duration"]
    # --save-detailed: every gap between a request's tokens (the JSON had only the summary figures)
    assert [len(g) for g in req["itls"]] == [k - 1 for k in req["output_lens"]]
    assert max(max(g) for g in req["itls"] if g) * 1000 == pytest.approx(res["max_itl_ms"], abs=1e-2)
    assert res["trace_cache_hit_upper_bound"] == pytest.approx(trace.reuse_upper_bound())
    if radix:  # follow-up turns reuse their parents' blocks; whole pages only, so at most the trace's bound
        assert 0.2 < res["cache_hit_rate"] <= res["trace_cache_hit_upper_bound"]
    else:
        assert res["cache_hit_rate"] == 0.0
    # the completed requests' own hits (all of them here), which the step log below ties to the engine's prefills
    assert res["cache_hit_rate_source"] == "requests"
    assert res["cache_hit_rate"] == pytest.approx(sum(req["cached_tokens"]) / res["total_input_tokens"])
    # The step log accounts for every token: each output token came from a decode row or a request's last prefill
    # chunk; every prompt token not served by the cache went through a prefill chunk.
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(steps) == res["engine_steps"] and res["preemptions"] == 0
    assert sum(s["decode_rows"] for s in steps) + n == res["total_output_tokens"]
    assert sum(s["prefill_tokens"] for s in steps) == round(res["total_input_tokens"] * (1 - res["cache_hit_rate"]))
    assert sum(s["decode_rows"] > 0 and s["prefill_rows"] > 0 for s in steps) == res["mixed_steps"] > 0
    assert all(a["t"] <= b["t"] for a, b in zip(steps, steps[1:]))
    assert all(s["context_tokens"] >= s["decode_rows"] + s["prefill_tokens"] for s in steps)
    # The launch's thread CPU time: never above its wall time over the replay, the other threads' work not in it. Per
    # step only up to the clocks' skew: on these VMs a thread's CPU clock ran up to 0.16 ms ahead of the monotonic one
    # over a short interval when idle, and over 1 ms once under the suite's load.
    assert all(s["launch_cpu_ms"] >= 0 for s in steps)
    assert sum(s["launch_cpu_ms"] for s in steps) <= 1.02 * sum(s["launch_ms"] for s in steps) + 5
    # Whether the engine thread ever blocked depends on the machine: a slow one is busy through the whole replay and
    # may count none (seen once in CI). tests/test_engine.py checks the counting itself with a wait it makes sure of.
    assert all(s["voluntary_switches"] >= 0 and s["involuntary_switches"] >= 0 for s in steps)


def test_mooncake_window_scaled_and_clamped(tmp_path):
    trace = read_trace(TRACES / "mooncake_sample.jsonl")
    res = replay(
        tmp_path,
        TRACES / "mooncake_sample.jsonl",
        *TINY,
        "--time-scale",
        "0.1",
        "--start",
        "5",
        "--num-requests",
        "20",
        "--length-scale",
        "0.03125",
        "--max-input-len",
        "100",
    )
    window = trace.requests[5:25]
    inputs = [min(round(r.input_length / 32), 100) for r in window]
    outputs = [max(1, round(r.output_length / 32)) for r in window]
    assert (res["completed"], res["format"], res["block_size"], res["trace_block_size"]) == (20, "mooncake", 16, 512)
    assert res["total_input_tokens"] == sum(inputs) and res["total_output_tokens"] == sum(outputs)
    assert res["clamped_requests"] == sum(round(r.input_length / 32) > 100 for r in window) > 0
    assert res["cache_hit_rate"] > 0  # 16-token blocks = one KV page: shared system prompts hit
    check_latencies(res)


def test_lengths_clamped_to_the_context(tmp_path):
    # The published Mooncake slice at 1/64 has prompts of up to ~1,900 tokens; a 256-token context clamps them. The
    # result says so: the count, the context clamped to and the window's tokens before (the context was not said).
    out = tmp_path / "trace.json"
    args = ["--time-scale", "0", "--num-requests", "30", "--length-scale", "0.015625", "--max-model-len", "256"]
    r = CliRunner().invoke(
        app, ["bench-trace", str(TRACES / "mooncake_conversation_head200.jsonl"), *TINY, *args, "--json", str(out)]
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    res = json.loads(out.read_text())
    window = read_trace(TRACES / "mooncake_conversation_head200.jsonl").requests[:30]
    assert (res["completed"], res["failed"]) == (30, 0) and res["clamped_requests"] > 0
    assert res["context_tokens"] == 256
    assert res["total_input_tokens"] + res["total_output_tokens"] <= 30 * 256
    assert res["trace_input_tokens"] == sum(max(1, round(r.input_length / 64)) for r in window)
    assert res["trace_input_tokens"] > res["total_input_tokens"]
    assert f"{res['clamped_requests']} of 30 requests were clamped" in flat(r.output)
    assert "a context of 256 tokens" in flat(r.output)


def test_a_block_never_outgrows_the_context(tmp_path):
    """--length-scale up to its 1e6: the blocks (512 tokens x 1e6) were drawn whole for the prompts, numpy's
    'Maximum allowed dimension exceeded' at 1e300 (now past the flag's range). No prompt outgrows the context, so
    neither does a block: the same prompts, drawn at the context's length."""
    args = ["--time-scale", "0", "--num-requests", "2", "--length-scale", "1e6", "--max-model-len", "256"]
    res = replay(tmp_path, TRACES / "mooncake_sample.jsonl", *TINY, *args)
    assert (res["completed"], res["block_size"], res["trace_block_size"], res["clamped_requests"]) == (2, 256, 512, 2)
    assert res["total_input_tokens"] + res["total_output_tokens"] == 2 * 256
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--length-scale", "1e300"])
    assert r.exit_code == 2 and "--length-scale" in flat(r.output), r.output


def test_a_replay_in_which_every_request_failed_is_an_error(tmp_path):
    # Token ids up to 100k do not fit tiny-llama's 512-token vocabulary: every request is refused, clearly; the
    # results are still written, and the run exits 1 where it used to end as if it had measured something.
    out = tmp_path / "trace.json"
    args = [*TINY, "--time-scale", "0", "--num-requests", "5", "--vocab-size", "100000", "--json", str(out)]
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *args])
    assert r.exit_code == 1, r.output
    text = flat(r.output)
    assert "5 of 5 requests failed" in text and "outside the vocabulary" in text and "every request failed" in text
    res = json.loads(out.read_text())
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (0, 5, 0)
    assert all("outside the vocabulary" in e["error"] for e in res["errors"])
    assert res["mean_ttft_ms"] is None
    # nothing was measured: the bound over the completed requests read 0.0% (and 0% of no engine step were mixed)
    assert (res["cache_hit_rate"], res["trace_cache_hit_upper_bound"], res["mixed_step_share"]) == (None, None, None)
    assert res["trace_cache_hit_upper_bound_planned"] == pytest.approx(
        read_trace(QWEN).window(0, 5).reuse_upper_bound()
    )
    assert (
        "cache hit rate n/a" in text
        and "trace upper bound n/a" in text
        and "engine steps (mixed) 0 (n/a mixed)" in text
    )


def test_ctrl_c_before_any_request_ended_shows_nothing_measured(tmp_path):
    """Ctrl-C while every request still waited for its first token (a server that does not answer): the trace's
    hit-rate bound read 0.0% in the table and the JSON, over the none that completed. Now n/a and null, beside the
    planned window's bound; exit 130 with the partial results, as any Ctrl-C."""
    import asyncio
    import os
    import signal
    import threading
    import time

    from minisgl_cli.mock_server import MockConfig, MockServer
    from tests.conftest import free_port

    mock, port, listening, stop = MockServer(MockConfig(ttft=60)), free_port(), threading.Event(), threading.Event()

    async def serve() -> None:  # in a thread of its own, so that its count of requests can be read here
        async with await asyncio.start_server(mock.handle, "127.0.0.1", port):
            listening.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)

    def interrupt() -> None:  # once the replay (inside asyncio.run, which turns SIGINT into a cancel) sent them
        while mock.requests < 4 and not stop.is_set():
            time.sleep(0.01)
        if not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    server = threading.Thread(target=asyncio.run, args=(serve(),))
    server.start()
    listening.wait(10)
    threading.Thread(target=interrupt, daemon=True).start()
    out = tmp_path / "t.json"
    args = ["--url", f"http://127.0.0.1:{port}", "--vocab-size", "512", "--max-model-len", "4096", "--no-client-check"]
    args += ["--quiet", "--time-scale", "0", "--num-requests", "4", "--json", str(out)]
    try:
        r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *args])
    finally:
        stop.set()
        server.join()
    assert r.exit_code == 130, r.output + repr(r.exception)
    text = flat(r.output)
    assert "interrupted after 0 of 4 requests finished" in text and "trace upper bound n/a" in text, r.output
    res = json.loads(out.read_text())
    assert (res["partial"], res["completed"], res["failed"], res["total_input_tokens"]) == (True, 0, 0, 0)
    assert (res["trace_cache_hit_upper_bound"], res["cache_hit_rate"], res["mean_ttft_ms"]) == (None, None, None)
    assert res["trace_cache_hit_upper_bound_planned"] == pytest.approx(
        read_trace(QWEN).window(0, 4).reuse_upper_bound()
    )


def test_the_hit_rates_bound_is_over_the_requests_that_completed(tmp_path):
    """The engine's hit rate counts admitted prompts alone: with 4 of 12 requests refused (ids past the vocabulary)
    it read 72.0% against a "trace upper bound" of 68.0% taken over all 12. The bound is now over the 8 completed."""
    args = ["--time-scale", "0.1", "--num-requests", "12", "--max-input-len", "50", "--vocab-size", "520"]
    res = replay(tmp_path, QWEN, *TINY, *args)
    assert 0 < res["failed"] < 12
    assert res["cache_hit_rate"] <= res["trace_cache_hit_upper_bound"]
    assert res["trace_cache_hit_upper_bound"] != res["trace_cache_hit_upper_bound_planned"]


def test_url_failures_are_counted_and_named(tmp_path):
    """Against a server that fails from its third request on: the replay finishes (exit 0), counts the failed
    requests apart from the completed ones, and says so with the first error."""
    from minisgl_cli.mock_server import MockConfig, mock_server_process
    from tests.conftest import free_port

    out = tmp_path / "trace.json"
    with mock_server_process(MockConfig(fail_from=3), free_port()) as url:
        args = ["--url", url, "--vocab-size", "512", "--max-model-len", "4096", "--no-client-check", "--quiet"]
        cmd = ["bench-trace", str(QWEN), *args, "--num-requests", "6", "--time-scale", "0", "--json", str(out)]
        r = CliRunner().invoke(app, cmd)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert (res["completed"], res["failed"]) == (2, 4) and len(res["errors"]) == 4
    assert "4 of 6 requests failed (the figures count the completed ones); the first, trace line " in flat(r.output)
    assert res["errors"][0]["error"] in flat(r.output)


@pytest.mark.parametrize(
    "line, message",
    [
        (
            '{"timestamp": %s, "input_length": 5, "output_length": 3, "hash_ids": [1]}' % ("1" * 400),
            "'timestamp' must be <= 2**53 (got an integer of 400 digits)",
        ),
        (
            '{"timestamp": %s, "input_length": 5, "output_length": 3, "hash_ids": [1]}' % ("1" * 5000),
            "invalid JSON: Exceeds the limit",
        ),
        (
            '{"timestamp": 1, "input_length": %s, "output_length": 3, "hash_ids": [1]}' % ("9" * 40),
            "'input_length' must be <= 2**53 (got an integer of 40 digits)",
        ),
    ],
)
def test_numbers_no_float_holds_are_bad_lines(tmp_path, line, message):
    """They overflowed a float (an OverflowError's traceback), or Python's int conversion refused them (a ValueError
    past the JSON error handling): now a bad line like any other, named or skipped."""
    good = '{"timestamp": 2, "input_length": 5, "output_length": 3, "hash_ids": [1]}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{line}\n{good}\n")
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-trace", str(bad), *TINY])  # a long path: no wrapping
    assert r.exit_code == 2 and f"bad.jsonl:1: {message}" in flat(r.output), r.output
    res = replay(tmp_path, bad, *TINY, "--time-scale", "0", "--skip-bad-lines")
    assert (res["completed"], res["skipped_lines"]) == (1, 1)


def test_a_window_past_the_traces_end_is_said_and_a_vocabulary_past_int64_refused(tmp_path):
    """--num-requests beyond the trace's end replayed fewer requests without a word (planned_requests alone told);
    --vocab-size 1e20 passed the flag's check and was numpy's 'high is out of bounds for int64' traceback once the
    model had loaded."""
    out = tmp_path / "t.json"
    args = [*TINY, "--start", "61", "--num-requests", "10", "--time-scale", "0", "--json", str(out)]
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *args])
    assert r.exit_code == 0, r.output
    assert "the trace has 64 requests: --start 61 --num-requests 10 replays the last 3" in flat(r.output)
    assert json.loads(out.read_text())["planned_requests"] == 3
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--vocab-size", str(10**20)])
    assert r.exit_code == 2 and "--vocab-size" in flat(r.output) and "Traceback" not in r.output, r.output


def test_bad_line_stops_with_its_number_or_is_skipped(tmp_path):
    lines = QWEN.read_text().splitlines()[:6]
    lines[3] = lines[3].replace('"input_length"', '"input_len"')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(app, ["bench-trace", str(bad), *TINY])
    assert r.exit_code == 2, r.output
    assert "bad.jsonl:4:missingfield'input_length'" in flat(r.output).replace(" ", "")
    res = replay(tmp_path, bad, *TINY, "--time-scale", "0", "--skip-bad-lines")
    assert (res["completed"], res["skipped_lines"]) == (5, 1)
    assert res["skipped"][0]["line"] == 4


def test_bad_options(tmp_path):
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--start", "1000"])
    assert r.exit_code == 2 and "past them" in flat(r.output)
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--format", "sharegpt"])
    # the flag's fault, named as such (it read "Invalid value for TRACE: unknown trace format")
    assert r.exit_code == 2 and "Invalid value for --format: choose auto, qwen, mooncake (got 'sharegpt')" in flat(
        r.output
    )
    # inf passed click's range: the replay waited forever for its second request
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--time-scale", "inf"])
    assert r.exit_code == 2 and "'--time-scale': must be a finite number (got inf)" in flat(r.output), r.output
    url = ["--url", "http://x", "--model", "dummy:tiny-llama", "--quiet"]  # TINY's --device is refused with --url
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *url, "--step-log", "s.jsonl"])
    assert r.exit_code == 2 and "does not go with --url" in flat(r.output)
    # --url reads the served model's vocabulary and context from --model: one it cannot read is named, with the way out
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), "--url", "http://x", "--model", str(tmp_path), "--quiet"])
    out = flat(r.output)
    assert r.exit_code == 2 and "Invalid value for --model" in out, r.output
    assert "--model names the served model's config; or pass --vocab-size and --max-model-len" in out
    for args, message in (
        (["--engine", "sglang"], "must be one of minisgl, vllm"),
        (["--engine", "vllm", "--url", "http://x"], "does not go with --url"),
        (["--engine", "vllm", "--step-log", "s.jsonl"], "does not go with --url or --engine vllm"),
        (["--vllm-arg", "max_num_seqs=256"], "is for --engine vllm"),
        (["--engine", "vllm", "--vllm-arg", "max_num_seqs"], "is not KEY=VALUE"),
    ):
        r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, *args])
        assert r.exit_code == 2 and message in flat(r.output), (args, r.output)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--served-model", "m"], "--served-model: is for a run against --url, and there is no --url"),
        (
            ["--request-timeout", "5", "--no-client-check"],
            "--request-timeout, --no-client-check: is for a run against --url, and there is no --url",
        ),
        (
            ["--url", "http://x", "--device", "cpu", "--tp", "1"],
            "--device, --tp: for the in-process engine, which --url does not start (--model and --max-model-len",
        ),
        (
            ["--url", "http://x", "--vocab-size", "512", "--max-model-len", "256"],
            "--model: is read for the served model's vocabulary and context, and --vocab-size and --max-model-len",
        ),
        (["--save-detailed"], "--save-detailed: is written to the --json file, and there is no --json"),
        (["--url", "http://x", "--token-stream"], "--token-stream: sets how the in-process minisgl engine hands out"),
        (["--engine", "vllm", "--no-token-stream"], "--no-token-stream: sets how the in-process minisgl engine"),
        (
            ["--engine", "vllm", "--device", "cpu", "--page-size", "32"],
            "--page-size: for minisgl's engine, which --engine vllm does not run (vLLM's own settings: --vllm-arg",
        ),
    ],
)
def test_flags_the_replay_would_not_read_are_refused(args, message):
    """Each was accepted and ignored (in-process: the --url flags; with --url: the in-process engine's, and --model
    once --vocab-size and --max-model-len give what it is read for; with --engine vllm: minisgl's engine flags and
    --token-stream); now refused by name before the trace is read."""
    r = CliRunner().invoke(app, ["bench-trace", "/no/such/trace.jsonl", "--model", "dummy:tiny-llama", *args])
    assert r.exit_code == 2 and f"Invalid value for {message}" in flat(r.output), r.output


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_engine_missing_is_a_clear_error():
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *TINY, "--engine", "vllm"])
    assert r.exit_code == 2 and "vLLM does not import here" in flat(r.output)
    assert "vllm-env.sh" in flat(r.output)


# ---- against a real server ---------------------------------------------------------------------------------------
def test_url_mode_against_minisgl_serve(tmp_path):
    if "serve" not in typer.main.get_command(app).commands:
        pytest.skip("`minisgl serve` is not registered yet")
    # behind an API key (serve --api-key, read from the environment as it keeps keys out of the process list)
    with serve_subprocess(tmp_path, "--served-model-name", "tiny", env={"MINISGL_API_KEY": "sekret"}) as (url, _):
        r = CliRunner().invoke(
            app,
            ["bench-trace", str(QWEN), "--url", url, "--num-requests", "2"],
            env={"COLUMNS": "400", "OPENAI_API_KEY": None},
        )
        assert r.exit_code == 2 and "HTTP 401: missing API key" in r.output, r.output
        assert "(pass the server's key: --api-key, or OPENAI_API_KEY)" in r.output, r.output
        trace = read_trace(QWEN).window(0, 24)
        before = _cache_counters(url)
        res = replay(
            tmp_path,
            QWEN,
            "--url",
            url,
            "--api-key",
            "sekret",
            "--model",
            "dummy:tiny-llama",
            "--num-requests",
            "24",
            "--time-scale",
            "0.2",
            "--quiet",
        )
        assert (res["mode"], res["model"], res["completed"], res["failed"]) == ("url", "tiny", 24, 0)
        assert res["engine"] == "minisgl"  # the server's /v1/models says who owns "tiny"
        assert res["total_input_tokens"] == sum(r.input_length for r in trace.requests)
        assert res["total_output_tokens"] == sum(r.output_length for r in trace.requests)  # ignore_eos honoured
        check_latencies(res)
        # From each answer's usage.prompt_tokens_details.cached_tokens: on a complete replay, the figure the server's
        # /metrics counters gave before (read here around the replay).
        hits, prompts = (b - a for a, b in zip(before, _cache_counters(url)))
        assert res["cache_hit_rate_source"] == "requests" and res["cache_hit_rate"] == pytest.approx(hits / prompts)
        assert 0.1 < res["cache_hit_rate"] <= res["trace_cache_hit_upper_bound"]


def _cache_counters(url: str) -> tuple[float, float]:
    """(hit tokens, prompt tokens) of a server's /metrics."""
    import urllib.request

    from minisgl_cli.prometheus import cache_counters, parse_prometheus

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        counters = cache_counters(parse_prometheus(r.read().decode()))
    assert counters is not None
    return counters


def test_url_outputs_of_textless_tokens_are_timed_not_failed(tmp_path):
    """A token whose text is empty (a special token; a byte that completes no character yet) sends no event of its
    own, and an output made only of such tokens shows up first in the finish chunk: with the tiny model a 1-token
    output did so (the full Mooncake trace clamped to its 2,048-token context), and the replay counted the request
    as failed ('the stream carried no tokens') although the server made it. The mock streams exactly that."""
    from minisgl_cli.mock_server import MockConfig, mock_server_process
    from tests.conftest import free_port

    with mock_server_process(MockConfig(ttft=0.02, tpot=0.001, blank_from=2), free_port()) as url:
        args = ["--url", url, "--vocab-size", "512", "--max-model-len", "4096", "--no-client-check", "--quiet"]
        res = replay(tmp_path, QWEN, *args, "--num-requests", "4", "--time-scale", "0", "--max-output-len", "3")
    trace = read_trace(QWEN).window(0, 4)
    assert (res["completed"], res["failed"], res["errors"]) == (4, 0, [])
    assert res["total_output_tokens"] == sum(min(r.output_length, 3) for r in trace.requests)  # from usage
    assert res["mean_ttft_ms"] >= 20  # the mock's TTFT: blank outputs are timed at their finish chunk


def test_ctrl_c_keeps_the_finished_requests_as_partial_results(tmp_path):
    """SIGINT mid-replay: the requests finished so far are reported and written (partial), no traceback, exit 130."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "minisgl_cli", "bench-trace", str(TRACES / "qwen_1000.jsonl"), *TINY]
    env = subprocess_env()  # the checkout first on PYTHONPATH, beside what it held (the GPU machine's bundle)
    p = subprocess.Popen(
        [*cmd, "--json", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores SIGINT
    )
    time.sleep(10)  # the load, then a few seconds of the trace's real-time arrivals
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert "partial results: interrupted" in flat(stdout)
    res = json.loads(out.read_text())
    assert res["partial"] and res["stopped"] == "interrupted"
    assert 0 < res["completed"] < res["planned_requests"] == 1000
    # what a stored result needs to be run again
    env = res["environment"]
    assert env["command"].startswith("minisgl bench-trace ") and "--json" in env["command"]
    assert isinstance(env["dirty"], bool) and env["platform"] and env["cpu_count"] >= 1


def test_ctrl_c_hit_rate_and_its_bound_cover_the_same_requests(tmp_path):
    """A replay cut by SIGINT while a request that had reused a finished one's prompt still decoded: the engine's
    counters had taken its prompt (and its hits) at its first prefill chunk, the bound only the completed requests:
    60.6% against a bound of 48.4% here (60.6% against 56.9% on traces/qwen_1000.jsonl). Both now cover the
    completed requests, each one's hits in the JSON, and every request sent before them may fill the bound's cache."""
    import re

    head = list(range(1, 33))  # 32 blocks of 16 tokens
    rows = [  # done at once; then one that reuses 31 of its blocks and ends, and one that reuses all 32 and decodes
        (0.0, 512, 4, head),
        (0.3, 512, 2, head[:31] + [100]),
        (0.3, 640, 1400, head + list(range(200, 208))),
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": m, "hash_ids": h}) + "\n"
            for t, n, m, h in rows
        )
    )
    out = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "minisgl_cli", "bench-trace", str(trace), "--format", "qwen", *TINY[:4]]
    rc, stdout, stderr = sigint_once_shown(cmd + ["--json", str(out)], rb"\b2/3 ")  # the first two ended
    assert rc == 130 and b"Traceback" not in stderr, stderr.decode(errors="replace")[-4000:]  # where a traceback lands
    res = json.loads(out.read_text())
    assert (res["completed"], res["failed"], res["planned_requests"]) == (2, 0, 3)  # the third was cut off
    assert 0 < res["cache_hit_rate"] <= res["trace_cache_hit_upper_bound"]
    assert res["trace_cache_hit_upper_bound"] == pytest.approx(read_trace(trace, "qwen").reuse_upper_bound(over={0, 1}))
    req = res["requests"]
    ok = [k for k, done in enumerate(req["success"]) if done]
    hits = sum(req["cached_tokens"][k] for k in ok) / sum(req["input_lens"][k] for k in ok)
    assert (res["cache_hit_rate"], res["cache_hit_rate_source"]) == (pytest.approx(hits), "requests")
    table = flat(re.sub(r"\x1b\[[0-9;]*m", "", stdout.decode()))  # the environment made stdout a terminal too
    assert "cache hit rate and its bound: over the completed requests" in table, table


def test_the_command_line_in_a_results_file_hides_the_api_key(monkeypatch):
    """environment()'s `command` is the argv as typed: with `--api-key K` it wrote the key into every results file
    of bench-serve and bench-trace, files made to be shared."""
    from minisgl_cli.report import command_line

    argv = ["/usr/bin/minisgl", "bench-trace", "t.jsonl", "--api-key", "K1", "--url", "http://h", "--api-key=K2"]
    monkeypatch.setattr(sys, "argv", argv)
    line = command_line()
    assert line is not None and "K1" not in line and "K2" not in line and "--url http://h" in line, line


def test_a_negative_seed_draws_prompts_of_its_own():
    """--seed -5 reached numpy's SeedSequence, which takes no negative word: a traceback after the model loaded. Any
    64-bit seed is taken (as the engine's), and another seed draws other tokens for the same hash id."""
    from minisgl_cli.trace_reader import PromptSynth

    minus, plus = PromptSynth(512, 16, seed=-5), PromptSynth(512, 16, seed=5)
    assert minus.block(7) == PromptSynth(512, 16, seed=-5).block(7)
    assert minus.block(7) != plus.block(7) and len(minus.block(7)) == 16


class UpFrontSynth:
    """trace_reader.PromptSynth as it was while bench-trace drew every prompt before the first was sent (a883137):
    the reference the prompts drawn as the replay goes must equal, bit for bit."""

    def __init__(self, vocab_size: int, block_size: int, seed: int = 0):
        self.vocab, self.bs, self.seed = vocab_size, block_size, seed
        self._blocks: dict[int, list[int]] = {}

    def _draw(self, *key: int) -> list[int]:
        import numpy as np

        rng = np.random.default_rng([self.seed & (2**64 - 1), *(k & (2**64 - 1) for k in key)])
        return rng.integers(0, self.vocab, self.bs).tolist()

    def block(self, hash_id: int) -> list[int]:
        b = self._blocks.get(hash_id)
        if b is None:
            b = self._blocks[hash_id] = self._draw(0, hash_id)
        return b

    def prompt(self, hash_ids: tuple[int, ...], input_length: int, unique_key: int) -> list[int]:
        ids: list[int] = []
        for h in hash_ids:
            if len(ids) >= input_length:
                break
            ids += self.block(h)
        j = 0
        while len(ids) < input_length:
            ids += self._draw(1, unique_key, j)
            j += 1
        return ids[:input_length]


def trace_flags(**kw) -> dict:
    return {"length_scale": 1.0, "max_input_len": None, "max_output_len": None, "seed": 0, "time_scale": 0.0, **kw}


@pytest.mark.parametrize(
    "name, window, block, vocab, context, flags",
    [
        # the published Mooncake slice whole, at a 128k context (2.8M prompt tokens, prompts up to 120k), and
        # replayed at 1/100 of its pace: prompts are made while the driver waits for the next send
        ("mooncake_conversation_head200.jsonl", 200, None, 151_936, 131_072, trace_flags(time_scale=0.01)),
        # --block-size 256: its hash ids cover half of each prompt, the rest is the request's own
        ("mooncake_conversation_head200.jsonl", 40, 256, 151_936, 131_072, trace_flags(seed=7)),
        # Qwen's 16-token blocks, scaled, clamped to a small context, under a negative seed
        ("qwen_1000.jsonl", 300, None, 512, 256, trace_flags(length_scale=0.5, max_input_len=200, seed=-3)),
    ],
)
def test_prompts_drawn_as_the_replay_goes_are_those_drawn_up_front(
    monkeypatch, name, window, block, vocab, context, flags
):
    """Every prompt of a replay was drawn before its first request went out (the whole Mooncake trace at a 128k
    context: ~6 GB of token lists, and a wait before the start); now each is drawn as the driver comes to it. The
    prompts sent are those the up-front construction made, with a block cache small enough to evict and redraw."""
    import asyncio

    from minisgl_cli import trace_reader
    from minisgl_cli.bench_trace import plan
    from minisgl_cli.replay import drive

    monkeypatch.setattr(trace_reader, "BLOCK_CACHE_BYTES", 1 << 18)
    p = plan(read_trace(TRACES / name, block_size=block).window(0, window), vocab, context, flags)
    ref = UpFrontSynth(vocab, p.trace.block_size, flags["seed"])
    expected = {r.index: r for r in p.trace.requests}
    wrong: list[int] = []

    async def send(item, res, live) -> None:
        r = expected.pop(item.index)
        if item.prompt != ref.prompt(r.hash_ids, r.input_length, r.index):
            wrong.append(item.index)
        res.output_tokens = item.output_len

    results = asyncio.run(drive(p.items, send))
    assert [r.index for r in results] == list(range(window)) and all(r.ok for r in results)
    assert (wrong, expected) == ([], {})
    assert sum(r.input_len for r in results) == sum(r.input_length for r in p.trace.requests)


def test_a_long_trace_replay_holds_a_bounded_share_of_its_prompts(tmp_path):
    """1,000 requests of 100k tokens: drawn before the first was sent, their token lists alone took 800 MB (8-byte
    pointers: the ids are all small ints here) and 9 s. Through the driver, with no model, a replay now holds a few
    at a time (its look-ahead of replay.LOOKAHEAD_TOKENS, those in flight, and the blocks it keeps)."""
    import asyncio
    import tracemalloc

    from minisgl_cli.bench_trace import plan
    from minisgl_cli.replay import drive

    n, length = 1000, 100_000
    shared = list(range(12))  # a system prompt of 12 blocks of 4,096 tokens, then one of 4 conversations' 13
    lines = [
        {
            "timestamp": i,
            "input_length": length,
            "output_length": 1,
            "hash_ids": [*shared, *range(i % 4 * 13 + 12, i % 4 * 13 + 25)],
        }
        for i in range(n)
    ]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = read_trace(path, block_size=4096)
    sent = []

    async def send(item, res, live) -> None:
        sent.append(len(item.prompt))
        res.output_tokens = 1
        await asyncio.sleep(0)

    tracemalloc.start()
    try:
        results = asyncio.run(drive(plan(trace, 200, 1 << 20, trace_flags()).items, send))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sent == [length] * n and sum(r.ok for r in results) == n
    assert peak < 40 << 20, f"{peak / 2**20:.0f} MiB"  # all the prompts at once: n * length * 8 bytes = 800 MB


def test_an_output_that_is_the_trace_or_another_output_by_another_path_is_refused(tmp_path):
    """`--json t.jsonl` replaced the replayed trace with the results, and `a/../x.json` or a link to the file given
    to another flag passed the check that one file goes to one flag."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(QWEN.read_text())
    (tmp_path / "sub").mkdir()
    r = CliRunner().invoke(app, ["bench-trace", str(trace), *TINY, "--json", str(tmp_path / "sub" / ".." / "t.jsonl")])
    assert r.exit_code == 2 and "is the TRACE being replayed" in flat(r.output), r.output
    assert trace.read_text() == QWEN.read_text()
    (tmp_path / "link.json").symlink_to(tmp_path / "x.json")
    args = ["--json", str(tmp_path / "x.json"), "--step-log", str(tmp_path / "link.json")]
    r = CliRunner().invoke(app, ["bench-trace", str(trace), *TINY, *args])
    assert r.exit_code == 2 and "is also given to --json" in flat(r.output), r.output


def test_url_mode_without_model_reads_the_served_models_vocabulary_and_context(tmp_path):
    """Without --model, the prompts were drawn for the default model (SmolLM2's 49,152 ids, an 8,192-token
    context): a server of the tiny model (512 ids) refused every one ('outside the vocabulary'), and one serving
    --max-model-len 256 the longest. Now the served model's config where this machine can read it (here the dummy
    preset /v1/models names), and the context the server lists."""
    with serve_subprocess(tmp_path, "--max-model-len", "256") as (url, _):
        args = ["--url", url, "--num-requests", "6", "--time-scale", "0", "--no-client-check", "--quiet"]
        res = replay(tmp_path, QWEN, *args)
    assert (res["model"], res["completed"], res["failed"]) == ("dummy:tiny-llama", 6, 0), res["errors"]
    assert res["context_tokens"] == 256 and res["clamped_requests"] > 0


def test_a_url_with_credentials_is_refused_before_they_go_anywhere(tmp_path):
    """`http://user:pass@host` was neither sent as credentials nor stripped: it went into the Host header, the JSON's
    url and command line and the table's title. The key has its flag."""
    url = "http://alice:sekret@127.0.0.1:9"
    args = ["--url", url, "--vocab-size", "512", "--max-model-len", "256", "--no-client-check", "--quiet"]
    r = CliRunner().invoke(app, ["bench-trace", str(QWEN), *args, "--json", str(tmp_path / "o.json")])
    out = flat(r.output)
    assert r.exit_code == 2 and "a user or password in the URL is not sent by this client" in out, r.output
    assert "sekret" not in r.output and not (tmp_path / "o.json").exists()
