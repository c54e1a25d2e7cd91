"""`minisgl bench-serve` against servers whose behaviour is known: the mock OpenAI server (latencies, capacity and
failures set by the test), a real `minisgl serve`, and the in-process engine; arrival statistics; the client's
parser against json's; the absorption check. Timing tolerances are wide: the CI machine is a shared 2-core CPU."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minisgl_cli.app import app
from minisgl_cli.arrivals import arrival_times, sweep_rates
from minisgl_cli.mock_server import MockConfig, mock_server_process
from minisgl_cli.openai_client import _data_of, decode_event
from minisgl_cli.run_figures import by_load
from tests.conftest import free_port, serve_subprocess, sigint_once_shown
from tests.test_bench_offline import flat

URL_FLAGS = ["--vocab-size", "1000", "--max-model-len", "4096", "--quiet", "--no-client-check"]
# vLLM `bench serve` fields every row (and a single run's top level) carries
VLLM_FIELDS = [
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")),
]


def bench(tmp_path: Path, *args: str, code: int = 0, env: dict[str, str] | None = None) -> tuple[dict, str]:
    out = tmp_path / "serve.json"
    r = CliRunner().invoke(app, ["bench-serve", *args, "--json", str(out)], env=env)
    assert r.exit_code == code, r.output + repr(r.exception)
    return (json.loads(out.read_text()) if out.exists() else {}), r.output


@pytest.fixture
def mock(request):
    with mock_server_process(request.param, free_port()) as url:
        yield url


# ---- arrivals ----------------------------------------------------------------------------------------------------
def test_poisson_arrivals_have_exponential_gaps():
    t = arrival_times(20_000, rate=10.0, seed=1)
    gaps = [b - a for a, b in zip(t, t[1:])]
    mean, cv = statistics.fmean(gaps), statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert t[0] == 0 and mean == pytest.approx(0.1, rel=0.03) and cv == pytest.approx(1.0, abs=0.04)
    # exponential: P(gap < mean) = 1 - 1/e
    assert sum(g < 0.1 for g in gaps) / len(gaps) == pytest.approx(1 - math.exp(-1), abs=0.015)
    bursty = arrival_times(20_000, rate=10.0, burstiness=0.25, seed=1)
    gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.06)  # same rate, CV = 1/sqrt(shape) = 2
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.08)
    assert arrival_times(5, 4.0, kind="constant") == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert len(arrival_times(1000, 10.0, seed=2, duration=3.0)) == pytest.approx(30, abs=12)
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    # a short run sends at the rate asked for, as vLLM scales its delays (20 at rate 8 went out at 6.6/s)
    for seed in range(5):
        short = arrival_times(20, rate=8.0, seed=seed)
        assert short[0] == 0 and short[-1] == pytest.approx(19 / 8)


def test_sweep_rates_are_guidellms_linspace():
    """guidellm's sweep: numpy.linspace(synchronous, throughput, N - 1)[1:], N - 2 rates from one step above the
    synchronous rate up to the throughput rate itself (its last load runs at the rate the throughput load measured)."""
    np = pytest.importorskip("numpy")
    for sync, tput, n in ((2.4, 8.1, 10), (0.3, 0.31, 5), (1.0, 7.0, 3), (5.0, 2.0, 6)):
        rates = sweep_rates(sync, tput, n)
        assert rates == pytest.approx(list(np.linspace(sync, tput, n - 1)[1:]), rel=1e-12)
        assert len(rates) == n - 2 and rates[-1] == tput
    # the knee and the plots (bench-serve's, bench-compare's) read a sweep in increasing load, not in the order it ran
    ran = [("synchronous", "inf"), ("throughput", "inf"), ("constant", 3.0), ("constant", 2.0)]
    rows = [{"strategy": k, "request_rate": r, "load": f"{k}@{r}"} for k, r in ran]
    assert [r["load"] for r in by_load(rows)] == ["synchronous@inf", "constant@2.0", "constant@3.0", "throughput@inf"]
    listed = [{"request_rate": 1.0, "max_concurrency": None}, {"request_rate": "inf", "max_concurrency": 4}]
    assert by_load(listed) == listed  # a list of rates or concurrencies: already in increasing load


def test_a_sweeps_rate_loads_take_no_prompt_of_the_warm_up(tmp_path):
    """A dataset's prompts are taken in order, each load its own. The warm-up takes those after the loads planned up
    front, and a --rate sweep plans its rate loads after the warm-up: the first rate load took the warm-up's prompts
    again, which the server's prefix cache still held."""
    from minisgl_cli.arrivals import Load
    from minisgl_cli.bench_serve import Target, _Planner

    class Chars:  # a tokenizer: one id per character
        def encode(self, text: str) -> list[int]:
            return [ord(c) % 90 + 2 for c in text]

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"prompt number {i}"}) + "\n" for i in range(40)))
    flags = dict(
        num_requests=4, duration=None, input_len="8", output_len="4", prompt_format="ids", endpoint="completions",
        prefix_groups=0, prefix_len=0, dataset=data, dataset_column=None, seed=0, burstiness=1.0, arrival="poisson",
        warmup=3, quiet=False,
    )  # fmt: skip
    planner = _Planner(Target(1000, 4096, Chars(), "m"), flags, {})
    loads = [planner.plan(Load(math.inf, 1, "synchronous"), 0), planner.plan(Load(math.inf, None, "throughput"), 1)]
    warm = planner.warm_up()
    loads.append(planner.plan(Load(2.0, None, "constant"), 2))
    prompts = [[tuple(item.prompt) for item in items] for _, items, _, _ in loads] + [[tuple(i.prompt) for i in warm]]
    assert sum(map(len, prompts)) == 3 * 4 + 3 == len({p for ps in prompts for p in ps})  # none given twice


# ---- the client's parser -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "obj",
    [
        {"id": "c", "choices": [{"index": 0, "text": 'héllo "q" \\n', "logprobs": None, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "\u2028x"}, "finish_reason": None}], "usage": None},
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "a", "content": None}, "finish_reason": None}]},
    ],
)
@pytest.mark.parametrize("compact", [True, False])
def test_event_decoding_matches_json(obj, compact):
    payload = json.dumps(obj, separators=(",", ":") if compact else None).encode()
    c = (obj.get("choices") or [{}])[0]
    delta = c.get("delta") or {}
    text, reasoning = c.get("text") or delta.get("content") or "", delta.get("reasoning_content") or ""
    assert decode_event(payload) == (text, reasoning, obj.get("usage"), c.get("finish_reason"))


def test_event_blocks():
    assert _data_of(b"data: {}") == b"{}"
    assert _data_of(b": keep-alive") is None
    assert _data_of(b'event: x\ndata:{"a":\ndata: 1}') == b'{"a":\n1}'
    with pytest.raises(Exception, match="server error: boom"):
        decode_event(b'{"error": {"message": "boom"}}')


# ---- against the mock server ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mock", [MockConfig(ttft=0.1, tpot=0.02)], indirect=True)
def test_measures_what_the_mock_was_told(tmp_path, mock):
    # 30 requests of 10 tokens at a constant 10 req/s: TTFT 100 ms, TPOT 20 ms, nothing queues anywhere.
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "30", "--output-len", "10:10", "--input-len", "16:32"]
    res, _ = bench(tmp_path, *args, "--rate", "10", "--arrival", "constant", "--slo", "ttft=160ms,tpot=26ms")
    assert (res["completed"], res["failed"], res["partial"], res["total_output_tokens"]) == (30, 0, False, 300)
    assert res["engine"] is None  # the mock's /v1/models names no known engine
    # tolerance: +60 ms TTFT, +-25% TPOT (a loaded 2-core machine wakes timers late, it never wakes them early)
    assert 100 <= res["median_ttft_ms"] <= 160 and 100 <= res["p99_ttft_ms"] <= 250
    assert res["median_tpot_ms"] == pytest.approx(20, rel=0.25)
    assert res["median_e2el_ms"] == pytest.approx(100 + 9 * 20, abs=80)
    assert res["duration"] >= 2.9 + 0.28  # the last arrival at 2.9 s, then its own 280 ms
    assert res["goodput_fraction"] >= 0.9 and res["request_goodput"] == pytest.approx(
        res["goodput_fraction"] * 30 / res["duration"]
    )
    assert res["p99_queue_ms"] < 60  # sent on schedule
    assert res["send_times"] == pytest.approx([i / 10 for i in range(30)], abs=1e-9)
    assert res["burstiness"] == "inf"  # constant gaps: gamma's shape at infinity (it said 1.0, Poisson's)
    assert len(res["ttfts"]) == len(res["input_lens"]) == 30
    # a target the mock cannot meet: no request is good
    res, out = bench(tmp_path, *args, "--rate", "inf", "--slo", "ttft=50ms")
    assert res["completed"] == 30 and res["goodput_fraction"] == 0 and res["request_goodput"] == 0
    # a bare number is milliseconds (vLLM's --goodput ttft:200), and the title shows it as given (0.2 ms read "0 ms")
    res, out = bench(tmp_path, *args, "--num-requests", "2", "--slo", "ttft=0.2,e2e=2s")
    assert res["slo"] == pytest.approx({"ttft": 0.2, "e2e": 2000}) and "SLO ttft <= 0.2 ms, e2e <= 2000 ms" in flat(out)


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.002)], indirect=True)
def test_a_grid_of_rates_and_concurrencies_marks_no_knee_and_burstiness_needs_poisson(tmp_path, mock):
    """The knee is found along one line of loads; a rate x concurrency grid is no line (sorted by rate, then
    concurrency, its "knee" meant nothing). --burstiness shapes Poisson gaps: beside --arrival constant it is refused,
    not ignored."""
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "6", "--output-len", "4:4", "--warmup", "0"]
    res, _ = bench(tmp_path, *args, "--rate", "50,100", "--max-concurrency", "1,2")
    assert len(res["sweep"]) == 4 and not any(r["knee"] for r in res["sweep"])
    _, out = bench(tmp_path, *args, "--rate", "10", "--arrival", "constant", "--burstiness", "0.5", code=2)
    assert "Poisson" in out and "--burstiness" in out


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.002)], indirect=True)
def test_flush_cache_against_a_server_without_it_stops_before_sending(mock, tmp_path):
    """--flush-cache against a server with neither /reset_prefix_cache (vLLM's, dev mode only) nor /flush_cache
    (SGLang's) is said at once, naming both answers, before any request is sent."""
    res, out = bench(tmp_path, "--url", mock, *URL_FLAGS, "--num-requests", "2", "--flush-cache", code=2)
    assert res == {} and "--flush-cache" in flat(out) and "/reset_prefix_cache: 404" in flat(out), out
    assert "VLLM_SERVER_DEV_MODE=1" in flat(out)
    res, _ = bench(tmp_path, *IN_PROCESS, "--flush-cache", "--quiet")  # in-process: the engine's own cache
    assert res["completed"] == 2 and res["workload"]["flush_cache"]


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.02, tpot=0.005, capacity=2)], indirect=True)
def test_concurrency_sweep_finds_the_knee(tmp_path, mock):
    # The mock serves 2 streams at once (~70 ms each): concurrency 2 doubles the throughput of 1, 6 adds nothing
    # but queueing inside the server, which shows as TTFT.
    csv_path, png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    res, out = bench(
        tmp_path,
        "--url",
        mock,
        *URL_FLAGS,
        "--num-requests",
        "24",
        "--output-len",
        "10:10",
        "--max-concurrency",
        "6,1,2",
        "--warmup",
        "2",
        "--csv",
        str(csv_path),
        "--plot",
        str(png),
    )
    rows = res["sweep"]
    assert [r["max_concurrency"] for r in rows] == [1, 2, 6]  # sorted by load
    assert all(r["completed"] == 24 and r["request_rate"] == "inf" for r in rows)
    tput = [r["output_throughput"] for r in rows]
    assert tput[1] > 1.5 * tput[0] and tput[2] < 1.25 * tput[1]
    assert [r["knee"] for r in rows] == [False, True, False] and rows[1]["knee_reason"] == "throughput"
    assert rows[2]["median_ttft_ms"] > 2 * rows[1]["median_ttft_ms"]  # waiting for one of the mock's 2 slots
    assert rows[2]["p99_queue_ms"] < 60  # closed loop: a request is scheduled when its slot frees
    for r in rows:
        assert all(r[f] is not None for f in VLLM_FIELDS), [f for f in VLLM_FIELDS if r[f] is None]
    assert "output_throughput" not in res  # a sweep keeps its figures per row
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert [int(t["max_concurrency"]) for t in table] == [1, 2, 6]
    assert float(table[1]["output_throughput"]) == pytest.approx(tput[1])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "knee" in flat(out)
    # The table in a narrow terminal: the loads that do not fit go on in a second table, none cut to "13.…" (rich
    # cut every cell of a ten-load sweep in 80 columns); the knee's column is marked and its reason said under it.
    from rich.console import Console

    from minisgl_cli.bench_serve import _table

    console = Console(width=60, record=True, color_system=None)
    console.print(_table(res, console.width))
    shown = console.export_text()
    assert "…" not in shown and "continued" in shown, shown
    assert "◀ knee" in shown and "knee at " in shown and "throughput" in shown.split("knee at ")[1], shown
    assert f"{tput[1]:,.2f}" in shown


@pytest.mark.parametrize("mock", [MockConfig(tpot=0.001, fail_from=9)], indirect=True)
def test_server_errors_mid_run_give_partial_results(tmp_path, mock):
    res, out = bench(tmp_path, "--url", mock, *URL_FLAGS, "--num-requests", "20", "--max-concurrency", "1")
    assert (res["completed"], res["failed"], res["partial"]) == (8, 12, True)
    assert "HTTP 500" in res["errors"][0]["error"] and "mock failure" in res["errors"][0]["error"]
    assert res["success"] == [True] * 8 + [False] * 12  # the per-request arrays say which requests count
    assert "partial results" in flat(out)


@pytest.mark.parametrize("mock", [MockConfig(tpot=0.001, cut_from=3)], indirect=True)
def test_streams_cut_short_are_failures(tmp_path, mock):
    # the second load fails whole: written, then exit 1 (as bench-trace with no request completed)
    res, out = bench(tmp_path, "--url", mock, *URL_FLAGS, "--num-requests", "6", "--max-concurrency", "1,2", code=1)
    assert [(r["completed"], r["failed"]) for r in res["sweep"]] == [(2, 4), (0, 6)]  # the sweep stops there
    assert "closed" in res["sweep"][0]["errors"][0]["error"]
    # a cut stream got tokens before failing: the per-request arrays hold them, flagged, and the totals do not
    for row in res["sweep"]:
        req = row["requests"]
        ok = req["success"]
        assert len(ok) == row["num_prompts"] == row["completed"] + row["failed"] and sum(ok) == row["completed"]
        assert [i for i, x in enumerate(ok) if not x] == [e["index"] for e in row["errors"]]
        assert sum(n for n, x in zip(req["output_lens"], ok) if x) == row["total_output_tokens"]
        assert sum(n for n, x in zip(req["input_lens"], ok) if x) == row["total_input_tokens"]
        # the mock cuts a stream once it has sent 2 tokens or more (a late wake-up sends its backlog in one write)
        assert all(n >= 2 for n, x in zip(req["output_lens"], ok) if not x)
        assert all(t is not None for t, x in zip(req["ttfts"], ok) if x)
    assert res["partial"] and "every request of concurrency 2 failed" in flat(out)


def test_client_check_measures_absorption(tmp_path):
    from minisgl_cli.client_check import check_client

    # a stream's finish chunk read apart from its last token (the TCP read split the mock's last write) is one more
    # event, timed as the client times any chunk: at most one per stream
    c = check_client(streams=8, tokens=300, events_per_write=16, repeats=1)
    assert 8 * 300 <= c.events <= 8 * 301 and c.tok_per_s == c.events / c.seconds > 0
    out = tmp_path / "check.json"
    r = CliRunner().invoke(app, ["bench-serve", "--client-check", "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    tokens = res["streams"] * res["tokens_per_stream"]
    assert tokens <= res["events"] <= tokens + res["streams"] and res["tok_per_s"] > 0
    assert "absorbed tok/s" in flat(r.output)


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.002)], indirect=True)
def test_url_run_reports_its_share_of_the_client(tmp_path, mock):
    res, out = bench(
        tmp_path,
        "--url",
        mock,
        "--vocab-size",
        "1000",
        "--max-model-len",
        "4096",
        "--quiet",
        "--num-requests",
        "16",
        "--output-len",
        "50:50",
        "--save-detailed",
    )
    check = res["client_check"]
    assert check["tok_per_s"] > 0 and res["client_absorption_tok_s"] == check["tok_per_s"]
    # every event read: one per token from the mock, and a finish chunk read apart from the last token's (timed
    # since d55bb23, as vLLM times it; "one per token" failed the check when one came so)
    events = sum(len(gaps) + 1 for gaps, ok in zip(res["itls"], res["success"]) if ok)
    assert res["total_output_tokens"] <= events <= res["total_output_tokens"] + 16
    assert res["client_used_fraction"] == pytest.approx(events / res["duration"] / check["tok_per_s"])
    assert 0 < res["client_used_fraction"] <= res["client_peak_used_fraction"]
    assert "client absorbed" in flat(out)


def _interrupted(tmp_path: Path, url: str, *args: str) -> tuple[int, str, str, dict | None]:
    """bench-serve --url as from a terminal, sent Ctrl-C (to its process group) a second after it first connects to
    the mock: exit status, stdout, stderr and the JSON (None: none written)."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    out, port = tmp_path / "serve.json", int(url.rsplit(":", 1)[1])
    cmd = [sys.executable, "-m", "minisgl_cli", "bench-serve", "--url", url, *URL_FLAGS, *args, "--json", str(out)]
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores SIGINT
        env={**os.environ, "COLUMNS": "200"},
    )
    t0 = time.monotonic()
    while not any(c.raddr and c.raddr.port == port for c in psutil.Process(p.pid).net_connections("tcp")):
        assert p.poll() is None and time.monotonic() - t0 < 120, p.communicate()
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    return p.returncode, flat(stdout), stderr, json.loads(out.read_text()) if out.exists() else None


def test_ctrl_c_hit_rate_covers_the_completed_requests(tmp_path):
    """In-process, a load's hit rate was the engine's counters, which take a prompt (and its hits) when it is
    admitted, while the load's figures cover the completed requests: Ctrl-C while a request that reused the shared
    prefix decoded read 128 of 216 prompt tokens (59%) against the completed two's 64 of 144 (44%). A load cut short
    now takes the completed requests' own hits, each one's in the JSON (as bench-trace since the sixtieth session)."""
    out = tmp_path / "serve.json"
    flags = ["--model", "dummy:tiny-llama", "--device", "cpu", "--num-requests", "3", "--max-concurrency", "1"]
    flags += ["--input-len", "8:8", "--output-len", "1500:1500", "--prefix-groups", "1", "--prefix-len", "64"]
    cmd = [sys.executable, "-m", "minisgl_cli", "bench-serve", *flags, "--warmup", "0", "--json", str(out)]
    rc, stdout, stderr = sigint_once_shown(cmd, rb"\b2/3 ")  # the live view's "done" column: the first two ended
    assert rc == 130 and b"Traceback" not in stderr, stderr.decode(errors="replace")[-4000:]  # where a traceback lands
    res = json.loads(out.read_text())
    assert (res["completed"], res["failed"], res["stopped"]) == (2, 0, "interrupted")
    assert res["cached_tokens"] == [0, 64] and res["input_lens"] == [72, 72]
    assert res["cache_hit_rate"] == pytest.approx(64 / 144)


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.01)], indirect=True)
def test_ctrl_c_mid_load_marks_the_load_and_the_run_partial(tmp_path, mock):
    """A single load cut by Ctrl-C (~0.1 s a request, one at a time, 100 of them): was written as `partial: false`,
    its row's flag (failures only) overwriting the run's, and no note printed."""
    png = tmp_path / "cut.png"
    rc, out, err, res = _interrupted(
        tmp_path, mock, "--num-requests", "100", "--output-len", "10:10", "--max-concurrency", "1", "--plot", str(png)
    )
    assert rc == 130 and "Traceback" not in err, out + err
    assert png.read_bytes()[:4] == b"\x89PNG"  # drawn from the finished requests, its title saying partial
    assert res is not None and res["partial"] is True and res["stopped"] == "interrupted"
    assert res["sweep"][0]["partial"] is True
    assert 0 < res["completed"] == len(res["success"]) < 100 and res["failed"] == 0
    assert res["indices"] == list(range(res["completed"]))  # one at a time: the first ones, in order
    assert res["planned_requests"] == 100 and res["planned_loads"] == 1
    # as bench-trace's: how many of the planned requests finished (was only "partial results: interrupted")
    done = f"partial results: interrupted after {res['completed']} of 100 requests finished"
    assert f"{done} in load {res['sweep'][0]['load']} (1 of 1 loads; 1 in flight not counted)" in out, out
    # a time-bounded load has no planned count to give (it drew 10,000 to send what its time allows)
    rc, out, err, res = _interrupted(
        tmp_path, mock, "--duration", "60", "--output-len", "10:10", "--max-concurrency", "1"
    )
    assert rc == 130 and res is not None and " of 10,000 " not in out, out + err
    assert f"partial results: interrupted after {res['completed']} requests finished in load" in out, out


def test_ctrl_c_counts_the_requests_in_flight(tmp_path):
    """Ctrl-C against a real `minisgl serve`, a closed loop of 4 (long outputs): the 4 requests in flight when it
    came were in no figure and no count ("those in flight are not counted"), where guidellm reports them as
    incomplete; now the row's `incomplete` and the note give their number."""
    with serve_subprocess(tmp_path) as (url, _):
        args = ["--input-len", "8", "--output-len", "300", "--max-concurrency", "4", "--num-requests", "100"]
        args += ["--vocab-size", "512", "--max-model-len", "2048"]  # the tiny model's (the last given is taken)
        rc, out, err, res = _interrupted(tmp_path, url, *args)
    assert rc == 130 and res is not None and res["stopped"] == "interrupted", out + err
    row = res["sweep"][0]
    assert row["incomplete"] == 4 and res["incomplete"] == 4  # a closed loop keeps its 4 slots full
    assert row["completed"] + row["failed"] < 100
    assert "(1 of 1 loads; 4 in flight not counted)" in out, out


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.01)], indirect=True)
def test_ctrl_c_in_the_warm_up_exits_130(tmp_path, mock):
    """Ctrl-C in the warm-up (2 requests of ~10 s): was 'error: no load point finished' and exit 1."""
    rc, out, err, res = _interrupted(
        tmp_path, mock, "--warmup", "2", "--num-requests", "2", "--output-len", "1000:1000"
    )
    assert rc == 130 and "Traceback" not in err, out + err
    assert "interrupted before a load point finished: no results; nothing written to" in out and res is None


# ---- bad input ------------------------------------------------------------------------------------------------------
def test_bad_input_is_named(tmp_path):
    def fails(*args: str) -> str:
        r = CliRunner().invoke(app, ["bench-serve", *args])
        assert r.exit_code == 2, r.output + repr(r.exception)
        assert "Traceback" not in r.output
        return flat(r.output)

    assert "--rate must be a finite number > 0" in fails("--rate", "0", "--url", "http://127.0.0.1:1")
    assert "--rate takes numbers" in fails("--rate", "fast", "--url", "http://127.0.0.1:1")
    assert "--max-concurrency must be >= 1" in fails("--max-concurrency", "4,0", "--url", "http://127.0.0.1:1")
    assert "--slo takes" in fails("--slo", "latency=3", "--url", "http://127.0.0.1:1")
    assert "--slo names ttft twice" in fails("--slo", "ttft=10ms,ttft=1s", "--url", "http://127.0.0.1:1")
    # --max-errors: a count (a whole number >= 1) or a share (0 < F < 1), one that a load could reach
    what = (
        "a count of failed requests (a whole number >= 1) or a share of the requests ended (a number between 0 and 1)"
    )
    for bad in ("0", "-2", "many", "nan", "inf", "1e999"):
        assert f"Invalid value for --max-errors: takes {what} (got '{bad}')" in fails("--max-errors", bad, *NOWHERE)
    out = fails("--max-errors", "1.5", *NOWHERE)
    assert "--max-errors: above 1 is a count of failed requests, a whole number; a share is below 1 (got '1.5')" in out
    out = fails("--max-errors", "0.1", "--num-requests", "20", *NOWHERE)
    assert "--max-errors: 0.1 judges the share of failed requests once 30 of a load's have ended" in out
    assert "each load sends at most 20: give a count" in out
    out = fails("--max-errors", "201", *NOWHERE)  # 200 requests a load by default
    assert "Invalid value for --max-errors: counts 201 failed requests, and each load sends at most 200" in out
    # a gap the gamma draw cannot make was a traceback once the model had loaded (inf itself: options' own check)
    tiny = ["--model", "dummy:tiny-llama", "--device", "cpu", "--num-requests", "2", "--rate", "10"]
    out = fails(*tiny, "--burstiness", "1e308")  # click's range check: its wording moves between versions
    assert "'--burstiness'" in out and "1000" in out
    assert "--rate 1e+306 with --burstiness 1000: the gaps' gamma scale" in fails(
        *tiny, "--rate", "1e306", "--burstiness", "1000"
    )
    # past float's range: was read as inf (no pacing); so small its mean gap is inf: waited forever
    for rate in ("1e309", "1e-320"):
        assert f"--rate must be a finite number > 0 requests/s, or inf for no pacing (got '{rate}')" in fails(
            "--rate", rate, "--url", "http://127.0.0.1:1"
        )
    assert "cannot reach" in fails("--url", f"http://127.0.0.1:{free_port()}", *URL_FLAGS)
    # --rate sweep: one load list of its own, at least one rate between its two measured ones, one cap
    assert "--rate sweep:N needs N >= 3" in fails("--rate", "sweep:2", *NOWHERE)
    assert "--rate sweep:N takes a whole number of loads (got 'x')" in fails("--rate", "sweep:x", *NOWHERE)
    assert "give it alone, not in a list (got 'sweep,4')" in fails("--rate", "sweep,4", *NOWHERE)
    out = fails("--rate", "sweep", "--max-concurrency", "2,4", *NOWHERE)
    assert "Invalid value for --max-concurrency: --rate sweep takes one cap" in out and "(got '2,4')" in out
    out = fails("--rate", "sweep", "--max-concurrency", "1", *NOWHERE)
    assert "--rate sweep's throughput load its synchronous one" in out
    out = fails("--rate", "sweep", "--duration", "5", *NOWHERE)
    assert "Invalid value for --duration: without --num-requests or --max-concurrency" in out
    # --url reads the served model's vocabulary and context (and, for text prompts, its tokenizer) from --model
    out = fails("--url", "http://127.0.0.1:1", "--model", str(tmp_path), "--quiet", "--endpoint", "chat")
    assert "Invalid value for --model" in out
    assert "--model names the served model's config and tokenizer; or pass --vocab-size and --max-model-len" in out
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"body": "hello", "lang": "en"}]))
    out = fails("--dataset", str(data), "--url", "http://127.0.0.1:1", "--model", "dummy:tiny-llama", *URL_FLAGS)
    assert "no 'conversations', 'messages' or text column" in out
    assert "body, lang" in out.replace(",", ", ").replace("  ", " ")


@pytest.mark.parametrize("command", ["bench-serve", "bench-trace"])
def test_a_server_that_never_answers_is_named(tmp_path, command):
    """A server that accepts the connection but never answers (hung, or its accept queue alone alive) said
    "cannot reach URL/v1/models: " and nothing more: a TimeoutError's text is empty."""
    import socket

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        args = ["--url", url, *URL_FLAGS, "--request-timeout", "1"]
        if command == "bench-trace":
            args = [str(Path(__file__).parent.parent / "traces" / "qwen_sample.jsonl"), *args]
        r = CliRunner().invoke(app, [command, *args])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"cannot reach {url}/v1/models: TimeoutError: no answer within 1 s" in flat(r.output)


NOWHERE = ["--url", "http://127.0.0.1:1"]  # a flag wrongly accepted beside it fails fast: cannot reach
IN_PROCESS = ["--model", "dummy:tiny-llama", "--device", "cpu", "--num-requests", "2", "--output-len", "2:2"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--client-check", "--rate", "3", "--quiet"], "--rate, --quiet: --client-check only measures the client's"),
        ([*IN_PROCESS, "--api-key", "k"], "--api-key: is for a run against --url, and there is no --url"),
        (
            [*IN_PROCESS, "--served-model", "m", "--request-timeout", "5", "--no-client-check"],
            "--served-model, --request-timeout, --no-client-check: is for a run against --url, and there is no --url",
        ),
        ([*NOWHERE, *URL_FLAGS, "--tp", "1"], "--tp: for the in-process engine, which --url does not start"),
        (
            [*NOWHERE, *URL_FLAGS, "--model", "dummy:tiny-llama"],
            "--model: is read for the served model's vocabulary and context, and --vocab-size and --max-model-len",
        ),
        ([*NOWHERE, *URL_FLAGS, "--label", "x"], "--label: is written to the --json file, and there is no --json"),
        ([*NOWHERE, *URL_FLAGS, "--save-detailed"], "--save-detailed: is written to the --json file, and there is"),
        (
            [*IN_PROCESS, "--dataset", "d.json", "--input-len", "4:4"],
            "--input-len: draws random prompts' lengths, and --dataset prompts have their own",
        ),
        (
            [*IN_PROCESS, "--dataset-column", "text"],
            "--dataset-column: names the --dataset file's prompt column, and there is no --dataset",
        ),
        (
            [*IN_PROCESS, "--endpoint", "chat", "--prompt-format", "ids"],
            "--prompt-format: --endpoint chat sends text prompts",
        ),
        ([*NOWHERE, *URL_FLAGS, "--prefix-len", "9"], "--prefix-len: is the length of each --prefix-groups group's"),
        (
            [*NOWHERE, *URL_FLAGS, "--arrival", "constant"],
            "--arrival: shapes the gaps between arrivals at a --rate, and --rate inf sends with no gaps",
        ),
        (
            [*NOWHERE, *URL_FLAGS, "--duration", "5", "--rate", "inf"],
            "--duration: stops sending after S seconds, and --rate inf without --max-concurrency sends everything",
        ),
    ],
)
def test_flags_the_run_would_not_read_are_refused(args, message):
    """Each was accepted and ignored; refused by name before anything loads or connects."""
    r = CliRunner().invoke(app, ["bench-serve", *args], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and f"Invalid value for {message}" in flat(r.output), r.output


def test_an_api_key_from_the_environment_is_no_flag_given():
    """OPENAI_API_KEY set for every shell is not --api-key given without --url: the in-process run goes on."""
    args = ["bench-serve", *IN_PROCESS, "--input-len", "4:4", "--quiet"]
    r = CliRunner().invoke(app, args, env={"OPENAI_API_KEY": "sk-global"})
    assert r.exit_code == 0 and "output tok/s" in flat(r.output), r.output


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = CliRunner().invoke(app, ["bench-serve", "--url", "http://127.0.0.1:1", "--plot", "x.png", *URL_FLAGS])
    assert r.exit_code == 2 and "needs matplotlib" in flat(r.output)


# ---- the engine: in-process and behind a real `minisgl serve` -------------------------------------------------------
def test_in_process_dataset_run(tmp_path):
    data = tmp_path / "sharegpt.json"
    turns = ["Why is the sky blue?", "Write a haiku about caches.", "What is 2+2?", "Name three rivers."]
    rows = [{"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "x"}]} for t in turns]
    # passed over and counted, never given another row's prompt: no user turn, an empty one
    rows[1:1] = [{"conversations": [{"from": "system", "value": "be brief"}]}, {"conversations": [{"from": "human"}]}]
    data.write_text(json.dumps(rows))
    png = tmp_path / "run.png"
    res, out = bench(
        tmp_path,
        "--model",
        "dummy:tiny-llama",
        "--device",
        "cpu",
        "--quiet",
        "--dataset",
        str(data),
        "--num-requests",
        "4",
        "--output-len",
        "6:6",
        "--max-concurrency",
        "2",
        "--plot",
        str(png),
    )
    assert (res["mode"], res["engine"], res["completed"], res["failed"]) == ("in-process", "minisgl", 4, 0)
    assert res["total_input_tokens"] == sum(len(t.encode()) for t in turns)  # byte tokenizer: one id per byte
    assert res["total_output_tokens"] == 24 and res["workload"]["source"] == str(data)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert res["workload"]["skipped_rows"] == 2 and res["workload"]["repeated_prompts"] == 0
    assert "2 rows with no user turn in 'conversations' were skipped (the first: row 2)" in " ".join(out.split())


def test_dataset_column_and_content_parts_in_process(tmp_path):
    """--dataset-column takes the prompts from the named column (conversations under another name here, a user
    turn's content a list of text parts, joined with "\n") and the JSON records it; without the flag, the file's own
    column; a column the file lacks is a CLI error naming its columns."""
    data = tmp_path / "chat.jsonl"
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "a page table?"}]
    rows = [
        {"prompt": "short", "dialog": [{"role": "user", "content": parts}]},
        {"prompt": "other", "dialog": [{"role": "system", "content": "s"}, {"role": "user", "content": "Why?"}]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [*IN_PROCESS, "--quiet", "--dataset", str(data)]
    res, _ = bench(tmp_path, *args, "--dataset-column", "dialog")
    assert (res["completed"], res["workload"]["dataset_column"]) == (2, "dialog")
    assert res["total_input_tokens"] == len("What is\na page table?") + len("Why?")  # byte tokenizer
    res, _ = bench(tmp_path, *args)
    assert (res["workload"]["dataset_column"], res["total_input_tokens"]) == ("prompt", len("short") + len("other"))
    _, out = bench(tmp_path, *args, "--dataset-column", "messages", code=2)
    why = f"dataset {data} has no column 'messages'; its columns: prompt, dialog"
    assert f"Invalid value for --dataset-column: {why}" in " ".join(out.split())


def test_a_sweep_over_a_dataset_gives_each_load_its_own_prompts(tmp_path):
    """Every load read the file's first prompts, so a sweep's later loads re-sent the first's (prefix-cache hits);
    and a file of fewer prompts than requests ran fewer requests without a word (vLLM oversamples). Now each load
    (then the warm-up) takes the next prompts, starting again from the first when the file runs out, and says so."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * n}) + "\n" for n in (1, 2, 3, 4, 5)))  # bytes: lengths 1-5
    res, out = bench(
        tmp_path, *IN_PROCESS[:4], "--dataset", str(data), "--num-requests", "2", "--output-len", "2:2",
        "--max-concurrency", "1,2", "--warmup", "2", "--quiet",
    )  # fmt: skip
    lens = [sorted(zip(row["requests"]["indices"], row["requests"]["input_lens"])) for row in res["sweep"]]
    assert lens == [[(0, 1), (1, 2)], [(0, 3), (1, 4)]]
    assert res["workload"]["repeated_prompts"] == 1  # the warm-up's second request: prompt 5, then prompt 1 again
    assert res["workload"]["input_len"] is None  # was the unused --input-len default
    assert "requests were given one of its prompts again" in flat(out)
    res, out = bench(tmp_path, *IN_PROCESS[:4], "--dataset", str(data), "--num-requests", "7", "--output-len", "2:2")
    assert res["completed"] == 7 and res["workload"]["repeated_prompts"] == 2
    assert sorted(zip(res["indices"], res["input_lens"]))[5:] == [(5, 1), (6, 2)]
    # a run bounded by time draws far more requests than it sends: the count is of those sent
    args = ["--dataset", str(data), "--output-len", "2:2", "--max-concurrency", "1", "--duration", "1"]
    res, out = bench(tmp_path, *IN_PROCESS[:4], *args)
    assert res["completed"] > 5 and res["workload"]["repeated_prompts"] == res["completed"] - 5


def test_a_cap_above_the_request_count_runs_as_that_count():
    """A closed loop started one worker per slot of --max-concurrency: a cap of 300,000, meant as "no cap", started
    300,000 tasks beside 4 requests' streams, and the event loop they shared charged its time to the server (TTFT
    51.7 ms at a cap of 4, 1,525 ms at 1,000,000, against a mock server answering in 50 ms)."""
    import asyncio

    from minisgl_cli import replay

    items = [replay.ReplayItem(i, i + 1, 0.0, [1, 2, 3], 2) for i in range(4)]
    tasks: list[int] = []
    in_flight: list[int] = [0, 0]  # now, most

    async def send(item, result, live) -> None:
        tasks.append(len(asyncio.all_tasks()))
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        result.output_tokens = item.output_len

    done = asyncio.run(replay.drive(items, send, max_concurrency=100_000, closed_loop=True))
    assert [r.index for r in done] == [0, 1, 2, 3] and all(r.ok and r.output_tokens == 2 for r in done)
    assert in_flight[1] == 4 and max(tasks) <= 4 + 1, (in_flight, max(tasks))  # the workers and the run's own task


def test_the_warm_up_goes_through_the_concurrency_cap(tmp_path, monkeypatch):
    """--warmup N sent all N at once whatever --max-concurrency said; vLLM's warm-up goes through its cap."""
    from minisgl_cli import replay

    caps: list = []
    real = replay.drive

    async def drive(items, send, max_concurrency=None, *args, **kwargs):
        caps.append((len(items), max_concurrency))
        return await real(items, send, max_concurrency, *args, **kwargs)

    monkeypatch.setattr(replay, "drive", drive)
    res, _ = bench(tmp_path, *IN_PROCESS, "--warmup", "3", "--max-concurrency", "2,4", "--quiet")
    assert caps == [(3, 2), (2, 2), (2, 4)] and [r["completed"] for r in res["sweep"]] == [2, 2]


def test_a_dataset_prompt_cut_to_the_context_goes_out_as_text(tmp_path):
    """--prompt-format text sent a dataset's prompts whole, undoing their cut to the context: the run was refused
    as "the longest request (... tokens) exceeds the context length" while --prompt-format ids ran it."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "y" * 300}) + "\n" + json.dumps({"prompt": "short"}) + "\n")
    args = [*IN_PROCESS[:4], "--dataset", str(data), "--num-requests", "2", "--output-len", "4:4", "--max-model-len"]
    for fmt in ("ids", "text"):
        res, _ = bench(tmp_path, *args, "100", "--prompt-format", fmt)
        assert res["completed"] == 2 and res["workload"]["truncated_prompts"] == 1, fmt
        assert sorted(res["input_lens"]) == [5, 96], fmt  # 100 - 4 output tokens


def test_a_cut_prompts_text_fits_the_context_with_a_byte_level_tokenizer(tmp_path):
    """A cut that splits a character (an emoji's bytes) decoded to U+FFFD, which re-encodes to more tokens than the
    cut kept: the text prompt overran the context by one, and bench-serve refused the run as too long."""
    from engine.tokenizer import load_tokenizer
    from minisgl_cli.workload import serve_workload

    tok = load_tokenizer(None)  # the embedded model's byte-level BPE
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "日本語のテキストです。😀🎉 emoji ünïcödé " * 5}) + "\n")
    for context in range(20, 60):
        w = serve_workload(1, (1, 1), (1, 1), 0, 49152, tok, True, data, max_model_len=context)
        assert w.cut == {0} and len(w.prompts[0]) + w.output_lens[0] <= context, context


def test_a_time_bounded_run_counts_the_cut_prompts_it_sent(tmp_path):
    """truncated_prompts counted every request drawn for a --duration run (10,000 for a closed loop), not those sent,
    as repeated_prompts did before 5c68a74."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "y" * 300}) + "\n" + json.dumps({"prompt": "short"}) + "\n")
    args = ["--dataset", str(data), "--output-len", "2:2", "--max-model-len", "100", "--max-concurrency", "1"]
    res, _ = bench(tmp_path, *IN_PROCESS[:4], *args, "--duration", "1", "--quiet")
    sent = res["completed"] + res["failed"]
    assert res["workload"]["truncated_prompts"] == (sent + 1) // 2  # was 10,000
    assert res["sweep"][0]["truncated_prompts"] == (sent + 1) // 2


def test_against_minisgl_serve(tmp_path):
    with serve_subprocess(tmp_path, "--served-model-name", "tiny") as (url, _):
        common = ["--url", url, "--model", "dummy:tiny-llama", "--quiet", "--no-client-check"]
        res, _ = bench(
            tmp_path,
            *common,
            "--num-requests",
            "8",
            "--input-len",
            "8:24",
            "--output-len",
            "8:8",
            "--prefix-groups",
            "2",
            "--prefix-len",
            "64",
            "--rate",
            "4,inf",
        )
        rows = res["sweep"]
        assert [r["request_rate"] for r in rows] == [4.0, "inf"] and res["model_id"] == "tiny"
        assert res["engine"] == "minisgl"  # from the server's /v1/models
        for r in rows:
            assert (r["completed"], r["failed"], r["total_output_tokens"]) == (8, 0, 64)  # ignore_eos honoured
            assert r["median_ttft_ms"] <= r["p99_ttft_ms"] <= r["p99_e2el_ms"]
            # at most 6 of 8 prompts reuse their group's 64-token prefix (all at once, fewer: same-step prefills)
            assert 0 < r["cache_hit_rate"] <= 6 * 64 / r["total_input_tokens"]
        # paced at 4 req/s: the seeded arrivals span 1.75 s (all at once: 0.05-0.08 s here, but a loaded 2-core
        # machine stalled that run for 1.8 s once, so the paced run is checked against its own arrival span)
        assert rows[0]["duration"] > 1.5
        # --flush-cache (SGLang's flag): every run starts cold, so one run again hits what it hit the first time, and
        # only without the flag does the repeat read the last run's pages
        again = [*common, "--num-requests", "4", "--input-len", "8:8", "--output-len", "2:2", "--max-concurrency", "1"]
        again += ["--prefix-groups", "1", "--prefix-len", "64"]
        first, _ = bench(tmp_path, *again, "--flush-cache")
        second, _ = bench(tmp_path, *again, "--flush-cache")
        unflushed, _ = bench(tmp_path, *again)
        assert 0 < first["cache_hit_rate"] == second["cache_hit_rate"] < unflushed["cache_hit_rate"]
        assert first["workload"]["flush_cache"] and not unflushed["workload"]["flush_cache"]
        res, _ = bench(tmp_path, *common, "--endpoint", "chat", "--num-requests", "4", "--output-len", "5:5")
        assert (res["completed"], res["total_output_tokens"], res["backend"]) == (4, 20, "openai-chat")
        # without --model the prompts are drawn from the embedded model's vocabulary, which the server refuses: every
        # request fails, the JSON is written and the command exits 1
        args = ("--url", url, "--quiet", "--no-client-check", "--num-requests", "2", "--rate", "inf")
        res, out = bench(tmp_path, *args, code=1)
        assert res["failed"] == 2 and "outside the vocabulary" in flat(out)
        assert "prompts drew ids below 49152: give the served model as --model, or --vocab-size" in flat(out)


def test_limits_against_minisgl_serve(tmp_path, monkeypatch):
    """A closed loop bounded by --duration alone draws a fixed supply (10,000) up front; a server that took them all
    before the time was up ended the load early with no word of it (at 200 req/s: 50 s of a 120 s
    --duration). The supply is cut to 12 here so the CPU server takes it all well within 60 s. A request past
    --request-timeout that was streaming was said to have had "no answer"."""
    from minisgl_cli import bench_serve

    monkeypatch.setattr(bench_serve, "CLOSED_LOOP_SUPPLY", 12)
    with serve_subprocess(tmp_path) as (url, _):
        common = ["--url", url, "--model", "dummy:tiny-llama", "--quiet", "--no-client-check", "--input-len", "4"]
        common += ["--output-len", "1", "--max-concurrency", "4"]
        res, out = bench(tmp_path, *common, "--duration", "60")
        assert (res["completed"], res["ran_out"], res["partial"]) == (12, True, False)
        assert res["duration"] < 30
        assert "concurrency 4 sent all 12 requests drawn for it" in flat(out) and "pass --num-requests" in flat(out)
        # --num-requests with --duration: whichever comes first, as asked (guidellm's max-requests and max-seconds)
        res, out = bench(tmp_path, *common, "--duration", "60", "--num-requests", "5")
        assert (res["completed"], res["ran_out"]) == (5, False) and "sent all" not in out
        # 2,000 tokens take the CPU server longer than 1 s (400 once came in under it): each streamed, then timed out
        args = ["--url", url, "--model", "dummy:tiny-llama", "--quiet", "--no-client-check", "--input-len", "4"]
        args += ["--output-len", "2000", "--num-requests", "2", "--max-concurrency", "2", "--request-timeout", "1"]
        res, out = bench(tmp_path, *args, code=1)
        assert res["failed"] == 2 and any(n > 0 for n in res["output_lens"])
        for err, n in zip(res["errors"], res["output_lens"]):
            # (a request a loaded 2-core machine did not start within the second had no answer indeed)
            said = f"not finished within 1 s ({n:,} chunks received)" if n else "no answer within 1 s"
            assert err["error"] == f"TimeoutError: {said}"


def test_rate_sweep_against_minisgl_serve(tmp_path):
    """--rate sweep:N is guidellm's sweep: a synchronous load (one request at a time), a throughput load (all at
    once), then N - 2 loads at rates guidellm spaces (linspace(synchronous, throughput, N - 1)[1:]) between the
    request rates those two measured; before it, those rates had to be measured and listed by hand."""
    np = pytest.importorskip("numpy")
    csv_path, png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    with serve_subprocess(tmp_path) as (url, _):
        common = ["--url", url, "--model", "dummy:tiny-llama", "--quiet", "--no-client-check", "--input-len", "8"]
        common += ["--output-len", "32", "--num-requests", "8"]
        args = [*common, "--rate", "sweep:5", "--arrival", "constant", "--csv", str(csv_path), "--plot", str(png)]
        res, out = bench(tmp_path, *args, env={"COLUMNS": "300"})
        rows = res["sweep"]
        # run in guidellm's order, named as guidellm names them
        assert [r["strategy"] for r in rows] == ["synchronous", "throughput", "constant", "constant", "constant"]
        assert [(r["request_rate"], r["max_concurrency"]) for r in rows[:2]] == [("inf", 1), ("inf", None)]
        assert all(r["completed"] == 8 and r["failed"] == 0 for r in rows) and res["planned_loads"] == 5
        sync, tput = rows[0]["request_throughput"], rows[1]["request_throughput"]
        rates = [r["request_rate"] for r in rows[2:]]
        assert rates == pytest.approx(list(np.linspace(sync, tput, 4)[1:]), rel=1e-9)
        assert rates[1] - rates[0] == pytest.approx(rates[2] - rates[1]) == pytest.approx((tput - sync) / 3)
        # strictly between the two measured rates, but the last: guidellm's runs at the throughput rate itself
        # (the server batches, so all at once measures more than one at a time; a stall on this shared 2-core
        # machine could turn that around, and guidellm's spacing then runs downwards: checked either way)
        lo, hi = sorted((sync, tput))
        assert all(lo < r < hi for r in rates[:2]) and rates[2] == tput and lo < hi
        assert sorted(rates) == (rates if sync < tput else rates[::-1])
        assert [r["load"] for r in rows] == ["synchronous", "throughput", *(f"constant@{r:.2f}" for r in rates)]
        assert [r["max_concurrency"] for r in rows[2:]] == [None] * 3 and rows[2]["burstiness"] == "inf"
        assert res["profile"] == {
            "type": "sweep",
            "loads": 5,
            "rate_type": "constant",
            "max_concurrency": None,
            "synchronous_rate": sync,
            "throughput_rate": tput,
            "rates": rates,
            "derivation": res["profile"]["derivation"],
        }
        assert "linspace(synchronous_rate, throughput_rate, loads - 1)[1:]" in res["profile"]["derivation"]
        # the knee and the plot read the loads in increasing load, not in the order they ran
        by_rate = [r["load"] for r in sorted(rows[2:], key=lambda r: r["request_rate"])]
        assert [r["load"] for r in by_load(rows)] == ["synchronous", *by_rate, "throughput"]
        assert sum(r["knee"] for r in rows) <= 1
        for name in ("synchronous", "throughput", *(f"constant@{r:.2f}" for r in rates)):
            assert name in out, out
        assert "sweep (guidellm's): synchronous" in flat(out)
        with csv_path.open() as f:
            assert [t["strategy"] for t in csv.DictReader(f)] == [r["strategy"] for r in rows]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # one --max-concurrency caps the throughput and rate loads (guidellm's max_concurrency); arrivals as --arrival
        res, _ = bench(tmp_path, *common, "--rate", "sweep:3", "--max-concurrency", "2", "--num-requests", "4")
        rows = res["sweep"]
        assert [(r["load"], r["max_concurrency"]) for r in rows[:2]] == [("synchronous", 1), ("throughput", 2)]
        assert rows[2]["strategy"] == "poisson" and rows[2]["max_concurrency"] == 2
        assert rows[2]["request_rate"] == rows[1]["request_throughput"] == res["profile"]["throughput_rate"]


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.01)], indirect=True)
def test_ctrl_c_in_a_sweeps_first_load_keeps_it(tmp_path, mock):
    """Ctrl-C in the synchronous load (~0.1 s a request, 100 of them): its finished requests are kept, the note
    counts the 10 loads planned, and the profile says no rate was measured yet."""
    rc, out, err, res = _interrupted(tmp_path, mock, "--rate", "sweep", "--num-requests", "100", "--output-len", "10")
    assert rc == 130 and res is not None and res["stopped"] == "interrupted", out + err
    assert [r["load"] for r in res["sweep"]] == ["synchronous"] and res["planned_loads"] == 10
    assert "in load synchronous (1 of 10 loads; 1 in flight not counted)" in out, out
    assert res["profile"]["rates"] == [] and res["profile"]["synchronous_rate"] is None


# ---- --max-errors: a load stops once too many of its requests failed -------------------------------------------------
@pytest.mark.parametrize("mock", [MockConfig(tpot=0.02, fail_every=2)], indirect=True)
def test_max_errors_stops_the_load_and_cancels_the_requests_in_flight(tmp_path, mock):
    """A closed loop of 2 against a mock that fails every 2nd request at once and streams the others for ~2 s
    (100 tokens, 20 ms apart): one failure at once, then at ~2 s the two streams end (2 completed) and their slots
    send the 4th to 6th requests, two failing at once: the 3rd failure. The one then streaming (the 5th) is cancelled:
    in no count but `incomplete`, and the load ends at ~2 s, not when it would have ended (~4 s). Nothing more is
    sent (6 of 20); the row, the table, the CSV and the exit status say so."""
    csv_path = tmp_path / "cut.csv"
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "20", "--output-len", "100", "--max-concurrency", "2"]
    res, out = bench(tmp_path, *args, "--max-errors", "3", "--csv", str(csv_path), env={"COLUMNS": "200"}, code=1)
    assert (res["completed"], res["failed"], res["incomplete"]) == (2, 3, 1)
    assert (res["sent_requests"], res["planned_requests"], res["stop_reason"]) == (6, 20, "max_errors")
    assert 1.9 < res["duration"] < 3.5  # the 5th request's stream was dropped, not waited for
    assert res["max_errors"] == 3 and res["partial"] and res["stopped"] is None
    # the cancelled request is in no per-request array: they hold the 5 that ended, 2 of them successes
    assert len(res["success"]) == len(res["indices"]) == 5 and sum(res["success"]) == 2 and len(res["errors"]) == 3
    assert "stopped early" in flat(out) and "max errors: 6 of 20 sent" in flat(out)
    note = "concurrency 2 reached --max-errors 3 (3 of 5 ended requests failed): stopped sending after 6 of 20"
    assert note in flat(out) and "requests; 1 then in flight cancelled" in flat(out)
    assert "error: concurrency 2 reached --max-errors 3 and stopped early" in flat(out)
    with csv_path.open() as f:
        (row,) = csv.DictReader(f)
    assert (row["stop_reason"], row["sent_requests"], row["incomplete"]) == ("max_errors", "6", "1")


@pytest.mark.parametrize("mock", [MockConfig(tpot=0.001, fail_every=4)], indirect=True)
def test_max_errors_as_a_count_or_a_share_of_the_requests_ended(tmp_path, mock):
    """One request at a time against a mock failing every 4th (the mock numbers requests across runs; each run here
    starts on a multiple of 4, so each sees the same pattern): a share of 0.24 is reached at the 32nd request (8 of 32
    failed), not at the 4th (1 of 4, 25%: judged only from 30 ended requests on, as guidellm's); a share of 0.3 never
    is (25% at most from 30 on): all 40 run and the command succeeds; a count of 8 is reached at the 32nd as well."""
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "40", "--output-len", "2", "--max-concurrency", "1"]
    res, out = bench(tmp_path, *args, "--max-errors", "0.24", code=1)
    assert (res["completed"], res["failed"], res["sent_requests"], res["incomplete"]) == (24, 8, 32, 0)
    assert res["stop_reason"] == "max_errors" and res["max_errors"] == 0.24
    assert "reached --max-errors 0.24 (8 of 32 ended requests failed)" in flat(out)
    res, out = bench(tmp_path, *args, "--max-errors", "0.3")
    assert (res["completed"], res["failed"], res["sent_requests"], res["stop_reason"]) == (30, 10, 40, None)
    assert "stopped early" not in flat(out)
    res, _ = bench(tmp_path, *args, "--max-errors", "8", code=1)
    assert (res["completed"], res["failed"], res["sent_requests"], res["stop_reason"]) == (24, 8, 32, "max_errors")


def test_a_sweep_goes_on_past_a_load_that_reached_max_errors_but_places_no_rate_from_one(tmp_path):
    """Each load has its own --max-errors, as each guidellm benchmark its own constraints: a load that reaches it
    stops, and the next load runs. The knee is found before the first such load (a load cut short is no measurement
    of itself, and its throughput was no point to compare). A --rate sweep whose throughput load reached it stops
    there: its rate loads would be placed by a rate measured on a run cut short."""
    common = [*URL_FLAGS, "--num-requests", "10", "--output-len", "10", "--max-errors", "2"]
    # every 7th request fails: concurrency 1 has request 7, 2 has 14, 4 has 21 and 28 (reached at 28), 8 runs after
    with mock_server_process(MockConfig(tpot=0.01, fail_every=7), free_port()) as url:
        res, out = bench(tmp_path, "--url", url, *common, "--max-concurrency", "1,2,4,8", code=1)
    rows = res["sweep"]
    assert [r["max_concurrency"] for r in rows] == [1, 2, 4, 8]
    assert [r["stop_reason"] for r in rows[:3]] == [None, None, "max_errors"] and rows[2]["failed"] == 2
    assert [(r["completed"], r["failed"]) for r in rows[:2]] == [(9, 1), (9, 1)]
    assert [(r["knee"], r["knee_reason"]) for r in rows[:2]] == [(False, None), (True, "max_errors")]
    assert "error: concurrency 4" in flat(out) and "reached --max-errors 2 and stopped early" in flat(out)
    # --rate sweep:3 capped at 2: the synchronous load has request 6, the throughput load 12 and 18 (reached)
    with mock_server_process(MockConfig(tpot=0.01, fail_every=6), free_port()) as url:
        res, out = bench(tmp_path, "--url", url, *common, "--rate", "sweep:3", "--max-concurrency", "2", code=1)
    rows = res["sweep"]
    assert [(r["load"], r["stop_reason"]) for r in rows] == [("synchronous", None), ("throughput", "max_errors")]
    assert res["planned_loads"] == 3 and res["profile"]["rates"] == [] and rows[1]["failed"] == 2
    profile = res["profile"]  # the synchronous load ran whole: its rate is the profile's; the cut one measured none
    assert (profile["synchronous_rate"], profile["throughput_rate"]) == (rows[0]["request_throughput"], None)
    assert res["stopped"] == "throughput reached --max-errors: its measured rate cannot place the sweep's rate loads"
    assert (rows[0]["knee"], rows[0]["knee_reason"]) == (True, "max_errors")
    assert "its measured rate cannot place the sweep's rate loads" in flat(out)
    # the synchronous load cut (requests 3, 6): the sweep stops there; the throughput load ran for nothing before
    with mock_server_process(MockConfig(tpot=0.01, fail_every=3), free_port()) as url:
        res, out = bench(tmp_path, "--url", url, *common, "--rate", "sweep:3", "--max-concurrency", "2", code=1)
    assert [(r["load"], r["stop_reason"]) for r in res["sweep"]] == [("synchronous", "max_errors")]
    assert res["stopped"] == "synchronous reached --max-errors: its measured rate cannot place the sweep's rate loads"


@pytest.mark.parametrize("mock", [MockConfig(tpot=0.01, fail_every=3)], indirect=True)
def test_a_load_cut_with_requests_in_flight_is_no_dead_server(tmp_path, mock):
    """A server refusing every 3rd request at once and streaming the others for 0.3 s, --max-errors 1: at concurrency
    4 the refusal comes back first and the 3 streams are cancelled (0 completed, 1 failed, 3 incomplete). That was
    taken for "every request of concurrency 4 failed": the sweep stopped there (concurrency 8 never ran) and the
    command said every request of a load had failed, where 3 of its 4 were streaming when cancelled."""
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "10", "--output-len", "30", "--max-errors", "1"]
    res, out = bench(tmp_path, *args, "--max-concurrency", "1,4,8", code=1)
    rows = res["sweep"]
    assert [r["max_concurrency"] for r in rows] == [1, 4, 8] and res["stopped"] is None
    assert all(r["stop_reason"] == "max_errors" for r in rows)
    assert [(r["completed"], r["failed"], r["incomplete"]) for r in rows[:2]] == [(2, 1, 0), (0, 1, 3)]
    assert "every request of" not in flat(out) and "error: concurrency 1, concurrency 4, concurrency 8" in flat(out)


def test_max_errors_in_process(tmp_path):
    """The in-process engine: prompts drawn below --vocab-size 1024 from a 512-token vocabulary, one id each, so about
    half are refused at once (ids outside the vocabulary). One at a time (seed 0: requests 0, 3 and 6 are refused),
    the 3rd failure stops the load after 7 of 20; four at a time with 300-token outputs, the 2nd refusal comes while
    the others still generate: they are aborted, counted as incomplete, and the load ends long before they would."""
    args = [*IN_PROCESS[:4], "--quiet", "--input-len", "1", "--vocab-size", "1024", "--num-requests", "20"]
    res, out = bench(tmp_path, *args, "--output-len", "4", "--max-concurrency", "1", "--max-errors", "3", code=1)
    assert (res["completed"], res["failed"], res["sent_requests"], res["incomplete"]) == (4, 3, 7, 0)
    assert res["success"] == [False, True, True, False, True, True, False] and res["stop_reason"] == "max_errors"
    assert "outside the vocabulary" in res["errors"][0]["error"]
    res, out = bench(tmp_path, *args, "--output-len", "300", "--max-concurrency", "4", "--max-errors", "2", code=1)
    assert (res["completed"], res["failed"], res["stop_reason"]) == (0, 2, "max_errors")
    assert res["incomplete"] >= 2 and res["sent_requests"] == 2 + res["incomplete"] < 20
    assert "error: concurrency 4 reached --max-errors 2 and stopped early" in flat(out)


# ---- the URL sender's timing, event by event (no network) ----------------------------------------------------------
class _ScriptedClient:
    """Streams the given events as OpenAIClient.stream would."""

    timeout = 5.0

    def __init__(self, events):
        self.events = events

    async def stream(self, path, body):
        for ev in self.events:
            yield ev


def _timed(events, output_len: int):
    import asyncio

    from minisgl_cli.replay import LiveCounters, ReplayItem, RequestResult, url_sender

    res = RequestResult(0, 0, 2, output_len, scheduled=0.0)
    send = url_sender(_ScriptedClient(events), "m", 0.0, chat=True)

    async def run() -> None:
        await send(ReplayItem(0, 0, 0.0, "hi", output_len), res, LiveCounters())

    asyncio.run(run())
    return res


def test_a_stream_whose_last_tokens_have_no_text_ends_at_its_finish_chunk():
    """minisgl serve sends no event for a token whose text is empty (bytes that complete no character yet) and puts
    it in the finish chunk, one decode step after the last text: E2E ended at the last text and TPOT divided 2 gaps
    by 3 (vLLM's bench serve ends the latency at the last chunk)."""
    from minisgl_cli.openai_client import Event

    usage = {"prompt_tokens": 2, "completion_tokens": 4}
    events = [Event(1.0, "a"), Event(1.1, "b"), Event(1.2, "c"), Event(1.3, "", None, "length"), Event(1.3, "", usage)]
    res = _timed(events, 4)
    assert res.ok and res.output_tokens == 4
    assert res.ttft == pytest.approx(1.0) and res.e2e == pytest.approx(1.3) and res.tpot == pytest.approx(0.1)
    # a finish chunk that arrives with the last text (one read) adds no gap
    events = [Event(1.0, "a"), Event(1.1, "b"), Event(1.2, "c"), Event(1.2, "", None, "length"), Event(1.2, "", usage)]
    res = _timed(events, 4)
    assert res.e2e == pytest.approx(1.2) and len(res.itls) == 2


def test_reasoning_content_is_output_for_ttft():
    """A server with a reasoning parser streams a thinking model's first tokens as `reasoning_content`: the first
    token came at 1.0 s, not at the first answer text (vLLM's bench serve counts reasoning_content as output)."""
    from minisgl_cli.openai_client import Event

    usage = {"prompt_tokens": 2, "completion_tokens": 4}
    events = [Event(1.0, "", reasoning="think"), Event(1.1, "", reasoning="ing"), Event(1.2, "x"), Event(1.3, "y")]
    res = _timed([*events, Event(1.3, "", None, "length"), Event(1.3, "", usage)], 4)
    assert res.ttft == pytest.approx(1.0) and res.e2e == pytest.approx(1.3) and len(res.itls) == 3
    # an answer cut off while it still thinks (max_tokens reached) completed, timed from its first thought
    res = _timed([events[0], events[1], Event(1.2, "", None, "length"), Event(1.2, "", usage)], 4)
    assert res.ok and res.ttft == pytest.approx(1.0)


# ---- --ramp-up-strategy: one load whose rate grows request by request (vLLM's ramp-up) ------------------------------
RAMP = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "4", "--ramp-up-end-rps", "40"]


def vllm_rate(strategy: str, start: float, end: float, i: int, n: int) -> float:
    """vLLM's _get_current_request_rate, written out again here."""
    p = i / max(n - 1, 1)
    return start + (end - start) * p if strategy == "linear" else start * (end / start) ** p


def test_ramped_poisson_gaps_are_exponential_at_each_requests_rate():
    """Poisson (gamma) arrivals at the ramp's rate for each request: a gap times the rate it was drawn at is Exp(1)
    (gamma of CV 2 at burstiness 0.25) all along the ramp, and the draw spans the ramp's planned span."""
    from minisgl_cli.arrivals import Ramp

    ramp = Ramp("linear", 10.0, 100.0, 20_000)
    for burstiness, cv in ((1.0, 1.0), (0.25, 2.0)):
        t = arrival_times(ramp.requests, 0, burstiness, seed=1, ramp=ramp)
        assert t[0] == 0 and t[-1] == pytest.approx(ramp.span(), rel=1e-12)
        unit = [(b - a) * ramp.rate(i) for i, (a, b) in enumerate(zip(t, t[1:]), 1)]
        for part in (unit[:5000], unit[-5000:]):  # the slow start and the fast end alike
            assert statistics.fmean(part) == pytest.approx(1.0, rel=0.06)
            assert statistics.pstdev(part) / statistics.fmean(part) == pytest.approx(cv, rel=0.08)
        if burstiness == 1.0:
            mean = statistics.fmean(unit)
            assert sum(x < mean for x in unit) / len(unit) == pytest.approx(1 - math.exp(-1), abs=0.015)


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.005, tpot=0.002)], indirect=True)
def test_a_ramp_sends_each_request_at_vllms_rate_for_it(tmp_path, mock):
    """--ramp-up-strategy linear 4 -> 40 over 12 requests, constant arrivals: request i goes out 1/rate(i) after the
    one before it, rate(i) = 4 + 36 * i/11 (vLLM's), so the gaps shrink from 1/7.3 s to 1/40 s; the JSON records
    each request's rate, how the load was ramped (vLLM's ramp_up_* fields) and vLLM's rps_change_events, and the
    warm-up is no part of it. Exponential: rate(i) = 4 * 10^(i/11), the same ratio between neighbours."""
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "12", "--output-len", "2", "--arrival", "constant"]
    res, out = bench(tmp_path, *args, *RAMP, "--warmup", "2", env={"COLUMNS": "250"})
    rates = [vllm_rate("linear", 4, 40, i, 12) for i in range(12)]
    assert res["indices"] == list(range(12)) and res["completed"] == 12  # the warm-up's 2 are in no array
    assert res["request_rates"] == pytest.approx(rates, rel=1e-12)
    gaps = [b - a for a, b in zip(res["send_times"], res["send_times"][1:])]
    assert gaps == pytest.approx([1 / r for r in rates[1:]], abs=2e-6)  # send_times keep 6 decimals
    assert all(b < a for a, b in zip(gaps, gaps[1:]))
    span = sum(1 / r for r in rates[1:])
    ramp = {"ramp_up_strategy": "linear", "ramp_up_start_rps": 4.0, "ramp_up_end_rps": 40.0, "ramp_up_requests": 12}
    assert {k: res[k] for k in ramp} == ramp and res["ramp_up_span_s"] == pytest.approx(span)
    assert res["ramp_up_reached_rps"] == 40.0 and res["request_rate"] is None  # a ramp has no one rate
    assert res["duration"] >= span and res["sweep"][0]["load"] == "linear ramp 4->40" and res["burstiness"] == "inf"
    assert res["sweep"][0]["requests"]["request_rates"] == res["request_rates"]
    events = res["rps_change_events"]  # vLLM's: each whole req/s the rate passed, when
    assert [e["rps"] for e in events] == list(range(4, 41))
    assert [e["timestamp"] for e in events] == sorted(e["timestamp"] for e in events)
    said = flat(out)
    assert "ramp (vLLM's --ramp-up-strategy linear): 4 to 40 req/s over N = 12 requests" in said
    assert "reached 40.000 req/s" in said and "along the ramp" in said and "linear ramp 4->40" in said
    res, _ = bench(tmp_path, *args, *RAMP[:1], "exponential", *RAMP[2:])
    rates = [vllm_rate("exponential", 4, 40, i, 12) for i in range(12)]
    assert res["request_rates"] == pytest.approx(rates, rel=1e-12)
    assert [b / a for a, b in zip(rates, rates[1:])] == pytest.approx([10 ** (1 / 11)] * 11)
    gaps = [b - a for a, b in zip(res["send_times"], res["send_times"][1:])]
    assert gaps == pytest.approx([1 / r for r in rates[1:]], abs=2e-6)


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.05, tpot=0.002)], indirect=True)
def test_a_ramp_under_a_cap_and_its_seed(tmp_path, mock):
    """--max-concurrency still caps a ramp (vLLM's semaphore): one request at a time, each ~55 ms, against arrivals
    up to 50/s, so requests queue in the client and their latency (from when each was due) grows along the ramp.
    Poisson arrivals are drawn from --seed: the same seed sends at the same times, another at others over the same
    span."""
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "10", "--output-len", "2", "--ramp-up-strategy", "linear"]
    args += ["--ramp-up-start-rps", "5", "--ramp-up-end-rps", "50"]
    res, _ = bench(tmp_path, *args, "--max-concurrency", "1", "--arrival", "constant")
    assert (
        res["sweep"][0]["load"] == "linear ramp 5->50, conc 1"
        and res["max_concurrency"] == 1
        and res["completed"] == 10
    )
    rates = [vllm_rate("linear", 5, 50, i, 10) for i in range(10)]
    assert [b - a for a, b in zip(res["send_times"], res["send_times"][1:])] == pytest.approx(
        [1 / r for r in rates[1:]], abs=2e-6
    )  # when each was due: the cap delays the sending, not the schedule
    assert res["ttfts"][-1] > res["ttfts"][0] + 0.1 and res["p99_queue_ms"] > 50
    first, _ = bench(tmp_path, *args, "--seed", "3")
    again, _ = bench(tmp_path, *args, "--seed", "3")
    other, _ = bench(tmp_path, *args, "--seed", "4")
    assert first["send_times"] == again["send_times"] != other["send_times"]
    assert first["send_times"][-1] == other["send_times"][-1] == pytest.approx(sum(1 / r for r in rates[1:]), abs=2e-6)
    assert first["request_rates"] == other["request_rates"] == pytest.approx(rates)


def test_a_ramp_bounded_by_duration_spans_it_in_process(tmp_path):
    """--duration alone: the ramp is spread over as many requests as span less than it (N with span(N) < S <=
    span(N + 1), span(N) the sum of 1/rate(i) for i = 1 to N - 1), so it ends at its end rate as the time does; the
    in-process engine is driven as a server is."""
    args = [*IN_PROCESS[:4], "--quiet", "--output-len", "2", "--input-len", "4", "--duration", "1.2"]
    args += ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "20"]
    res, out = bench(tmp_path, *args)

    def span(n: int) -> float:
        return sum(1 / vllm_rate("exponential", 2, 20, i, n) for i in range(1, n))

    n = res["ramp_up_requests"]
    assert span(n) < 1.2 <= span(n + 1) and res["completed"] == res["sent_requests"] == res["planned_requests"] == n
    assert res["send_times"][-1] == pytest.approx(span(n), abs=2e-6) and max(res["send_times"]) < 1.2
    assert res["request_rates"] == pytest.approx([vllm_rate("exponential", 2, 20, i, n) for i in res["indices"]])
    assert res["request_rates"][-1] == res["ramp_up_reached_rps"] == 20 and res["mode"] == "in-process"


def test_a_ramp_cut_short_by_duration_says_where_it_stopped(tmp_path):
    """--num-requests and --duration, whichever comes first: a ramp over 40 requests whose time runs out first ends
    below its end rate, and the run says at which rate (a ramp that never reached its top measured none of it)."""
    args = [*IN_PROCESS[:4], "--quiet", "--output-len", "2", "--input-len", "4", "--num-requests", "40"]
    res, out = bench(tmp_path, *args, *RAMP, "--arrival", "constant", "--duration", "0.5", env={"COLUMNS": "250"})
    rates = [vllm_rate("linear", 4, 40, i, 40) for i in range(40)]
    sent = sum(t < 0.5 for t in [sum(1 / r for r in rates[1:k]) for k in range(1, 41)])
    assert res["sent_requests"] == sent < 40 and res["ramp_up_reached_rps"] == pytest.approx(rates[sent - 1])
    assert f"--duration 0.5 s ended the ramp at request {sent} of 40, before its end rate" in flat(out)


@pytest.mark.parametrize("mock", [MockConfig(tpot=0.002, fail_from=7)], indirect=True)
def test_max_errors_stops_a_ramp_at_the_rate_it_reached(tmp_path, mock, monkeypatch):
    """A server failing every request from the 7th on: --max-errors 3 stops the ramp at its 9th request (or the
    10th, due before the 9th's failure came back), and the note, the row and the plot say at which rate; --plot
    draws the load against the rate each request was sent at."""
    from minisgl_cli import plots

    drawn: list = []
    real = plots.plot_ramp
    monkeypatch.setattr(plots, "plot_ramp", lambda results, rates, *a: (drawn.append(rates), real(results, rates, *a)))
    png = tmp_path / "ramp.png"
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "30", "--output-len", "2", "--arrival", "constant"]
    res, out = bench(tmp_path, *args, *RAMP, "--max-errors", "3", "--plot", str(png), env={"COLUMNS": "250"}, code=1)
    assert res["stop_reason"] == "max_errors" and res["failed"] == 3 and res["sent_requests"] in (9, 10)
    reached = vllm_rate("linear", 4, 40, res["sent_requests"] - 1, 30)
    assert res["ramp_up_reached_rps"] == pytest.approx(reached)
    assert f"stopped sending after {res['sent_requests']} of 30 requests (the ramp at {reached:.3g} req/s)" in flat(out)
    assert drawn == [res["request_rates"]] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.01, tpot=0.05)], indirect=True)
def test_ctrl_c_before_a_ramps_first_request_ended_still_plots(tmp_path, mock):
    """Ctrl-C a second into an exponential ramp whose requests stream 5 s each: none has ended, so the plot has no
    point, and its log rate axis (matplotlib: "Data cannot be log-scaled because all values are <= 0") crashed the
    command with a traceback and exit 1 after the JSON was written, instead of the partial run's plot and 130."""
    png = tmp_path / "ramp.png"
    ramp = ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "20"]
    args = ["--num-requests", "20", "--output-len", "100", *ramp, "--plot", str(png)]
    rc, out, err, res = _interrupted(tmp_path, mock, *args)
    assert rc == 130 and "Traceback" not in err, out + err
    assert res is not None and res["completed"] == res["failed"] == 0 and res["incomplete"] >= 1
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_ramps_failed_requests_show_on_a_log_ttft_axis(tmp_path, monkeypatch):
    """A ramp's failed requests were drawn at TTFT 0, which a log axis (TTFTs 20x apart) cannot show: the legend said
    "failed (2)" over no mark. They stand at the axis' foot now, at the rate they were sent at."""
    from minisgl_cli import plots
    from minisgl_cli.replay import RequestResult

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    results, rates = [], []
    for i in range(40):
        ttft = 0.01 if i < 20 else 0.5  # 10 ms early in the ramp, 500 ms late: a log TTFT axis
        r = RequestResult(i, i, 8, 8, scheduled=i * 0.1, ttft=ttft, e2e=ttft + 0.1, output_tokens=8, itls=[0.01] * 7)
        if i in (5, 30):
            r = RequestResult(i, i, 8, 8, scheduled=i * 0.1, error="HTTP 500")
        results.append(r)
        rates.append(1.0 + i)
    plots.plot_ramp(results, rates, tmp_path / "ramp.png", "linear ramp 1->40", False)
    ttft_ax = figs[0].axes[1]
    assert ttft_ax.get_yscale() == "log"
    [marks] = [c for c in ttft_ax.collections if c.get_label() == "failed (2)"]
    xs, ys = zip(*marks.get_offsets())
    assert xs == (6.0, 31.0) and all(0 < y < 0.1 for y in ys)  # in the axes' height: at its foot, on any scale


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.005, tpot=0.002)], indirect=True)
def test_a_capped_ramps_plot_is_titled_by_its_load(tmp_path, mock, monkeypatch):
    """The ramp plot's title put "req/s" after the load's name, which ends with its cap: "linear ramp 4->40, conc 2
    req/s", a concurrency in requests per second."""
    from minisgl_cli import plots

    titles: list[str] = []
    real = plots.plot_ramp
    monkeypatch.setattr(
        plots, "plot_ramp", lambda r, rates, path, title, *a: (titles.append(title), real(r, rates, path, title, *a))
    )
    png = tmp_path / "ramp.png"
    args = ["--url", mock, *URL_FLAGS, "--num-requests", "6", "--output-len", "2", *RAMP, "--max-concurrency", "2"]
    bench(tmp_path, *args, "--plot", str(png))
    assert titles == [f"bench-serve linear ramp 4->40, conc 2 -> {mock}"] and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        ([*RAMP, "--rate", "4"], "Invalid value for --rate: sets one rate, and --ramp-up-strategy sends at its ramp"),
        ([*RAMP, "--rate", "sweep"], "Invalid value for --rate: sets one rate"),
        ([*RAMP, "--rate", "2,8"], "Invalid value for --rate: sets one rate"),
        # vLLM takes --request-rate inf beside a ramp (its default): the refusal said vLLM refused it too
        ([*RAMP, "--rate", "inf"], "vLLM refuses any --request-rate but its default inf beside a ramp"),
        (RAMP[2:], "--ramp-up-start-rps, --ramp-up-end-rps: is a --ramp-up-strategy's rate, and there is no"),
        (RAMP[:2], "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps"),
        (
            ["--ramp-up-strategy", "step", *RAMP[2:]],
            "--ramp-up-strategy must be one of linear, exponential (got 'step')",
        ),
        (
            [*RAMP[:3], "40", "--ramp-up-end-rps", "4"],
            "--ramp-up-end-rps must be above --ramp-up-start-rps (got 40 to 4)",
        ),
        (
            [*RAMP[:3], "4", "--ramp-up-end-rps", "4"],
            "--ramp-up-end-rps must be above --ramp-up-start-rps (got 4 to 4)",
        ),
        (
            ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", *RAMP[4:]],
            "--ramp-up-start-rps must be above 0 for an exponential ramp: from 0 it stays at 0",
        ),
        ([*RAMP[:3], "0", *RAMP[4:]], "--ramp-up-start-rps must be a finite number > 0 requests/s (got 0)"),
        ([*RAMP[:3], "-1", *RAMP[4:]], "--ramp-up-start-rps must be a finite number > 0 requests/s (got -1)"),
        ([*RAMP[:5], "nan"], "--ramp-up-end-rps"),
        ([*RAMP[:5], "inf"], "--ramp-up-end-rps"),
        ([*RAMP, "--max-concurrency", "1,2"], "Invalid value for --max-concurrency: a ramp is one load"),
        ([*RAMP, "--num-requests", "1"], "a ramp needs at least 2 requests, one at each end (got --num-requests 1)"),
        ([*RAMP, "--duration", "0.02"], "--duration 0.02 s is too short for a ramp"),
        ([*RAMP, "--max-errors", "201"], "counts 201 failed requests, and each load sends at most 200"),
        ([*RAMP, "--duration", "2", "--max-errors", "60"], "counts 60 failed requests, and each load sends at most 33"),
        ([*RAMP, "--arrival", "constant", "--burstiness", "2"], "Invalid value for --burstiness: shapes Poisson"),
    ],
)
def test_ramps_that_make_no_sense_are_refused(args, message):
    """Refused by name before anything loads or connects (--rate beside a ramp too: vLLM refuses both); the ramp's
    count of requests is known up front, --duration's too, so a --max-errors no load could reach is refused."""
    r = CliRunner().invoke(app, ["bench-serve", *NOWHERE, *URL_FLAGS, *args], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and message in flat(r.output) and "Traceback" not in r.output, r.output


@pytest.mark.timeout(60)
def test_a_ramp_from_near_zero_over_a_duration_is_counted_at_once():
    """--duration alone: the ramp's count was found by stepping one request at a time from an estimate, each step
    summing the whole ramp. From a start near 0 the estimate is far off (0.00001 -> 10 req/s over 60 s: 300,000
    against 114), and bench-serve hung before sending anything (2.4 s from 0.0001, hours from 0.000001). The count is
    checked here through the --max-errors refusal that names it."""
    from minisgl_cli.arrivals import Ramp

    ramp = ["--ramp-up-strategy", "linear", "--ramp-up-end-rps", "10", "--duration", "60", "--max-errors", "5000"]
    for start in ("0.00001", "0.000001"):
        r = CliRunner().invoke(
            app, ["bench-serve", *NOWHERE, *URL_FLAGS, *ramp, "--ramp-up-start-rps", start], env={"COLUMNS": "300"}
        )
        assert r.exit_code == 2 and "each load sends at most " in flat(r.output), r.output
        n = int(flat(r.output).split("each load sends at most ")[1].split()[0])
        assert Ramp("linear", float(start), 10, n).span() < 60 <= Ramp("linear", float(start), 10, n + 1).span()


def test_the_live_view_shows_the_ramps_rate_by_then():
    """The live view's ramp req/s: the rate of the last request due by then, on the run's own clock."""
    import time

    from minisgl_cli.arrivals import Load, Ramp
    from minisgl_cli.bench_serve import _ramp_now
    from minisgl_cli.live_view import LiveView
    from minisgl_cli.replay import LiveCounters, ReplayItem

    ramp = Ramp("linear", 1.0, 10.0, 4)
    items = [ReplayItem(i, 0, t, [1], 1) for i, t in enumerate((0.0, 0.25, 0.4, 10.0))]
    rate_at = _ramp_now(Load(10.0, None, ramp=ramp), items)
    assert rate_at is not None and [rate_at(t) for t in (0.1, 0.3, 5.0, 11.0)] == [1.0, 4.0, 7.0, 10.0]
    counters = LiveCounters(started=time.perf_counter() - 0.3)
    table = LiveView("ramp", 4, counters, quiet=True, rate_at=rate_at).render()
    assert table.columns[0].header == "ramp req/s" and list(table.columns[0].cells) == ["4"]


def test_url_without_model_draws_for_the_served_model(tmp_path):
    """Without --model the prompts were drawn from the default model's 49,152 ids for whatever was served: against
    the tiny model (512 ids) every request failed ('outside the vocabulary'). Now the served model's own config where
    this machine can read the id /v1/models lists, and the context it lists (here --max-model-len 256)."""
    with serve_subprocess(tmp_path, "--max-model-len", "256") as (url, _):
        flags = ["--url", url, "--num-requests", "6", "--input-len", "32:64", "--output-len", "4:4", "--quiet"]
        res, _ = bench(tmp_path, *flags, "--no-client-check")
        assert (res["completed"], res["failed"]) == (6, 0), res.get("errors")
        r = CliRunner().invoke(app, ["bench-serve", *flags, "--no-client-check", "--input-len", "300:300"])
        assert r.exit_code == 2 and "exceeds the context length 256" in flat(r.output), r.output


@pytest.mark.parametrize("mock", [MockConfig(ttft=0.001, tpot=0.001, model="dummy:tiny-llama")], indirect=True)
@pytest.mark.parametrize("model", [["--model", "dummy:tiny-llama"], []], ids=["--model", "the served one"])
def test_a_url_run_of_text_prompts_loads_the_tokenizer_once(tmp_path, monkeypatch, mock, model):
    """bench-serve --url with text prompts loaded --model's tokenizer to refuse an unreadable --model early, then again
    for the workload (the embedded model's GGUF: 8 s here, twice); without --model it loaded the default's early
    (wasted), then the served model's. Counted on the real loader, each call still loading."""
    import engine.tokenizer

    loaded: list[str | None] = []
    real = engine.tokenizer.load_tokenizer

    def counted(spec, *args, **kwargs):
        loaded.append(spec)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "load_tokenizer", counted)
    args = ["--url", mock, *model, "--prompt-format", "text", "--num-requests", "2", "--input-len", "8:8"]
    res, _ = bench(tmp_path, *args, "--output-len", "2:2", "--max-model-len", "4096", "--quiet", "--no-client-check")
    assert res["completed"] == 2 and res["workload"]["prompt_format"] == "text"
    assert loaded == ["dummy:tiny-llama"]
