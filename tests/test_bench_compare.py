"""`minisgl bench-compare` over real results of the three benchmarks, and the --plot of bench-offline and bench-trace
(each run's PNG drawn from its own per-step / per-request data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minisgl_cli.app import app
from minisgl_cli.bench_compare import load_runs
from minisgl_cli.mock_server import MockConfig, mock_server_process
from tests.conftest import free_port
from tests.test_bench_offline import flat

TRACE = Path(__file__).resolve().parent.parent / "traces" / "qwen_sample.jsonl"
TINY = ["--model", "dummy:tiny-llama", "--device", "cpu", "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> str:
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, list(args))  # wide: no cell folded mid-word
    assert r.exit_code == 0, r.output + repr(r.exception)
    return flat(r.output)


def test_a_bench_offline_compare_result_shows_its_peers_rows():
    """`bench-offline --compare vllm` writes the peers' figures beside minisgl's (here a stored H200 run of
    Llama-3.1-8B): bench-compare showed the minisgl row alone, and dropped the peer measured in the same run."""
    path = Path(__file__).resolve().parent.parent / "benchmarks/results/bench_offline_vllm_llama-3.1-8b_h200.json"
    d = json.loads(path.read_text())
    runs = load_runs(path)
    assert [r["engine"] for r in runs] == ["minisgl", "vllm"]
    assert [r["rows"][0]["output_throughput"] for r in runs] == [
        d["output_throughput"],
        d["peers"][0]["output_throughput"],
    ]
    out = run("bench-compare", str(path))
    assert "minisgl" in out and "vllm" in out and "#2" in out
    # the peer's row shows the flags its child was given: it repeated minisgl's --compare, --vllm-env and engine flags
    assert "--max-batch-tokens 8192" in runs[0]["flags"] and "--compare vllm" in runs[0]["flags"]
    assert runs[1]["flags"] == "--runs 3 --model dummy:Llama-3.1-8B"


def test_an_older_files_unset_switch_is_no_flag():
    """`--compare` was a switch (false when not given) before it took a list of peers: bench-compare showed the
    stored Qwen3-30B-A3B run as given `--compare False`."""
    path = Path(__file__).resolve().parent.parent / "benchmarks/results/bench_offline_qwen3-30b-a3b_h200_c664dbc.json"
    assert json.loads(path.read_text())["flags"]["compare"] is False
    (only,) = load_runs(path)
    assert "--compare" not in only["flags"] and only["flags"].startswith("--runs 2 --model dummy:Qwen3-30B-A3B")


def test_an_older_bench_offline_file_with_one_peer_shows_its_row():
    """Files written before the list of peers (and the `benchmark` field) name one `peer`: its row was dropped
    without a word (the H200 run docs/benchmarks.md cites for the 28x over transformers)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks/results/bench_offline_qwen3-0.6b_64seqs_h200.json"
    d = json.loads(path.read_text())
    assert "peers" not in d and "benchmark" not in d  # the older layout
    runs = load_runs(path)
    assert [r["engine"] for r in runs] == ["minisgl", "transformers"]
    assert runs[1]["rows"][0]["output_throughput"] == d["peer"]["output_throughput"]


def test_vllm_files_show_their_load_and_failed_requests(tmp_path):
    """`vllm bench serve --save-result` files: two runs at other loads looked alike (no load shown), their failed
    requests (num_prompts - completed) appeared nowhere, and unknown fields printed as "None"."""
    files = []
    for name, rate, cap, done in (("a", "inf", None, 100), ("b", 4, 16, 90)):
        f = tmp_path / f"{name}.json"
        f.write_text(
            json.dumps(
                {
                    "backend": "vllm",
                    "request_rate": rate,
                    "max_concurrency": cap,
                    "num_prompts": 100,
                    "completed": done,
                    "output_throughput": 900.0,
                }
            )
        )
        files.append(str(f))
    out = run("bench-compare", *files)
    assert "#1 rate inf" in out and "#2 rate 4, concurrency 16" in out
    assert "100 / 0" in out and "90 / 10" in out
    assert "None" not in out


def test_json_lines_of_runs_show_a_row_each(tmp_path):
    """SGLang's bench_serving (and `vllm bench serve --append-result`) append one JSON line per run to one file: it
    was refused as "Extra data: line 2" where it holds two runs. A file that is neither is still refused by name."""
    runs = tmp_path / "sglang.jsonl"
    lines = [
        {"backend": "sglang", "request_rate": rate, "max_concurrency": 64, "output_throughput": tput}
        for rate, tput in ((2, 700.0), (8, 1500.0))
    ]
    runs.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    assert [(r["name"], r["rows"][0]["output_throughput"]) for r in load_runs(runs)] == [
        ("sglang:1 (sglang)", 700.0),
        ("sglang:3 (sglang)", 1500.0),
    ]
    out = run("bench-compare", str(runs))
    assert "rate 2, concurrency 64" in out and "rate 8, concurrency 64" in out and "1,500" in out
    # a bad run is named by its line
    runs.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"backend": "sglang"}) + "\n")
    r = CliRunner(env={"COLUMNS": "500"}).invoke(app, ["bench-compare", str(runs)])
    assert r.exit_code == 2 and f"{runs} line 2 is not a bench-serve" in flat(r.output), r.output
    # trailing text after one (pretty-printed) document is no JSON Lines: the error is the document's
    runs.write_text(json.dumps(lines[0], indent=2) + "\nfast\n")
    r = CliRunner().invoke(app, ["bench-compare", str(runs)])
    assert r.exit_code == 2 and "cannot read" in flat(r.output) and "Extra data: line 7" in flat(r.output), r.output


def test_compare_offline_trace_and_serve_runs(tmp_path):
    off, trace, sweep = tmp_path / "off.json", tmp_path / "trace.json", tmp_path / "sweep.json"
    run(
        "bench-offline",
        *TINY,
        "--num-seqs",
        "6",
        "--input-len",
        "16:32",
        "--output-len",
        "8:16",
        "--json",
        str(off),
        "--plot",
        str(tmp_path / "off.png"),
    )
    run(
        "bench-trace",
        str(TRACE),
        *TINY,
        "--num-requests",
        "8",
        "--time-scale",
        "0",
        "--json",
        str(trace),
        "--plot",
        str(tmp_path / "trace.png"),
    )
    with mock_server_process(MockConfig(ttft=0.01, tpot=0.002), free_port()) as url:
        run(
            "bench-serve",
            "--url",
            url,
            "--vocab-size",
            "1000",
            "--max-model-len",
            "4096",
            "--quiet",
            "--no-client-check",
            "--num-requests",
            "8",
            "--output-len",
            "10:10",
            "--rate",
            "20,inf",
            "--label",
            "mock engine",
            "--json",
            str(sweep),
        )
    for png in ("off.png", "trace.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG
    offline = json.loads(off.read_text())
    assert offline["benchmark"] == "bench-offline" and offline["engine_steps"] > 0 and "_steps" not in offline
    traced = json.loads(trace.read_text())
    assert traced["flags"]["num_requests"] == 8

    out = run("bench-compare", str(off), str(trace), str(sweep), "--plot", str(tmp_path / "cmp.png"))
    assert (tmp_path / "cmp.png").read_bytes()[:8] == PNG
    for needle in (
        "bench-offline",
        "bench-trace",
        "bench-serve",
        "mock engine",
        "#3 rate 20",
        "#3 rate inf",
        f"{offline['output_throughput']:,.2f}",
        offline["environment"]["commit"],
        "--num-seqs 6",
        "TBT p50/p99 ms",
        f"{traced['median_itl_ms']:,.2f} / {traced['p99_itl_ms']:,.2f}",  # the replay's inter-token gap
    ):
        assert needle in out, needle
    # flags shown are those given that differ from the command's defaults, and never the output switches
    assert "--quiet" not in out and "--tp 1" not in out and "--mixed-batch" not in out and "--page-size" not in out
    # bench-trace's trace is its argument, not a flag; the vLLM overrides it derives from --vllm-arg are no flag
    flags = f"{TRACE} --time-scale 0.0 --num-requests 8 --model dummy:tiny-llama --device cpu"
    assert load_runs(trace)[0]["flags"] == flags
    assert "--trace" not in out and "--vllm-args" not in out


def test_a_url_run_and_an_in_process_run_of_one_model_are_one_model(tmp_path):
    """An in-process run records the model by its config's name ("tiny-llama"), a --url run by the name it asked the
    server for ("dummy:tiny-llama"): bench-compare called them different models. Both record the --model given."""
    here, there = tmp_path / "here.json", tmp_path / "there.json"
    few = ["--num-requests", "3", "--output-len", "4:4", "--input-len", "8:8", "--quiet"]
    run("bench-serve", *TINY, *few, "--json", str(here))
    with mock_server_process(MockConfig(ttft=0.01, tpot=0.002), free_port()) as url:
        url_args = ["--url", url, "--model", "dummy:tiny-llama"]  # its vocabulary and context read from --model
        run("bench-serve", *url_args, "--no-client-check", *few, "--json", str(there))
    assert json.loads(here.read_text())["model_id"] != json.loads(there.read_text())["model_id"]
    out = run("bench-compare", str(here), str(there))
    assert "different models" not in out and "dummy:tiny-llama" in out


def test_compare_single_runs_and_bad_files(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, tput in ((a, 100.0), (b, 250.0)):  # two single runs of the same shape from another engine
        path.write_text(
            json.dumps(
                {
                    "label": path.stem,
                    "output_throughput": tput,
                    "request_throughput": 1.0,
                    "median_ttft_ms": 10.0,
                    "p99_ttft_ms": 20.0,
                }
            )
        )
    out = run("bench-compare", str(a), str(b), "--plot", str(tmp_path / "bars.png"))
    assert "250.00" in out and "100.00" in out and (tmp_path / "bars.png").read_bytes()[:8] == PNG
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    r = CliRunner().invoke(app, ["bench-compare", str(bad)])
    assert r.exit_code == 2 and "is not a bench-serve, bench-trace or bench-offline result" in flat(r.output)
    r = CliRunner().invoke(app, ["bench-compare", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "cannot read" in flat(r.output)


def test_a_figure_a_run_lacks_is_no_zero_bar(tmp_path, monkeypatch):
    """Single runs as bars: a figure one file does not have (here the other engine's TPOT) was drawn as a bar of 0,
    which reads as a measured zero; it is now no bar and an "n/a" where the bar would stand."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    rows = ({"output_throughput": 100.0, "median_tpot_ms": 5.0, "p99_tpot_ms": 9.0}, {"output_throughput": 250.0})
    plots.plot_compare([{"name": f"r{i}", "rows": [row]} for i, row in enumerate(rows)], tmp_path / "bars.png")
    tput, _, tpot, _ = figs[0].axes
    assert [(round(b.get_x() + b.get_width() / 2), b.get_height()) for b in tput.patches] == [(0, 100.0), (1, 250.0)]
    assert [(round(b.get_x() + b.get_width() / 2, 6), b.get_height()) for b in tpot.patches] == [
        (-0.2, 5.0),
        (0.2, 9.0),
    ]
    assert sorted((round(t.get_position()[0], 6), t.get_text()) for t in tpot.texts) == [(0.8, "n/a"), (1.2, "n/a")]
    assert not tput.texts


def test_sweeps_of_other_loads_share_one_axis_of_achieved_rate(tmp_path, monkeypatch):
    """Two sweeps over different loads were drawn at their points' places in order (0, 1, 2) under the longest
    sweep's load names, so the other sweep's points stood under loads they were not run at. Each point now stands at
    the request rate its load achieved, named in the top panel."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))

    def sweep(name: str, loads: list[tuple[str, float]]) -> dict:
        rows = [{"load": load, "request_throughput": rps, "output_throughput": 100 * rps} for load, rps in loads]
        return {"name": name, "rows": [{**r, "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0} for r in rows]}

    a = sweep("a", [("rate 1", 1.0), ("rate 2", 2.0), ("rate 4", 3.9), ("rate 8", 5.1), ("rate inf", 5.15)])
    b = sweep("b", [("concurrency 1", 0.7), ("concurrency 16", 6.0)])
    plots.plot_compare([a, b], tmp_path / "sweeps.png")
    tput = figs[0].axes[0]
    assert [list(line.get_xdata()) for line in tput.lines] == [[1.0, 2.0, 3.9, 5.1, 5.15], [0.7, 6.0]]
    named = {t.get_text(): t.xy for t in tput.texts}
    assert named["rate 4"] == (3.9, 390.0) and named["concurrency 16"] == (6.0, 600.0)
    assert named["rate 8 / rate inf"] == pytest.approx((5.1, 510.0))  # saturated loads at one place: one name, readable
    assert "requests/s achieved" in figs[0].axes[-1].get_xlabel()


def test_a_sweep_without_request_rates_says_it_is_not_drawn(tmp_path, monkeypatch):
    """Sweeps stand at the request rate each load achieved, a figure bench-compare reads as optional: a sweep file
    without it (its loads' TTFT, TPOT, ...) vanished from the plot, its name in the legend over no point."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    bare = {"name": "bare", "rows": [{"load": f"rate {r}", "output_throughput": 100.0 * r} for r in (1, 2)]}
    some = {"name": "some", "rows": [{"load": "rate 1", "output_throughput": 90.0, "request_throughput": 1.0}]}
    some["rows"] += [{"load": "rate 2", "output_throughput": 170.0}]
    plots.plot_compare([bare, some], tmp_path / "sweeps.png")
    legend = [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()]
    assert legend == [
        "#1 bare (2 of 2 loads without requests/s, not drawn)",
        "#2 some (1 of 2 loads without requests/s, not drawn)",
    ]


def test_malformed_results_are_refused_by_name(tmp_path):
    cases = {
        "text.json": ("throughput: fast", "cannot read"),
        "string.json": ({"output_throughput": "fast"}, "has no numeric output_throughput (got 'fast')"),
        "sweep_str.json": ({"sweep": "abc"}, "'sweep' must be a non-empty list of load points"),
        "sweep_row.json": ({"sweep": [{"load": "rate 1"}]}, "sweep[0] has no numeric output_throughput"),
        "client.json": ({"benchmark": "client-check", "tok_per_s": 5.0}, "(a client-check result)"),
        "list.json": ([1, 2], "list.json is not a bench-serve, bench-trace or bench-offline result"),
        "sweep_empty.json": ({"sweep": []}, "sweep_empty.json is not a bench-serve, bench-trace or bench-offline"),
        "bool.json": ({"output_throughput": True}, "the result has no numeric output_throughput (got True)"),
        # "Expecting value: line 1 column 1 (char 0)"
        "empty.json": ("", "cannot read {path}: the file is empty"),
        "blank.json": ("\n  \n", "cannot read {path}: the file is empty"),
        # "is not a bench-serve, bench-trace or bench-offline result (a bench-serve result)"
        "bare.json": ({"benchmark": "bench-serve", "sweep": None}, "this bench-serve result has no figures"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-compare", str(path)])
        assert r.exit_code == 2 and message.format(path=path) in flat(r.output), (name, r.output, r.exception)
    # a directory was "[Errno 21] Is a directory"
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-compare", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"{tmp_path}: is a directory: give the result files in it ({tmp_path}/*.json)" in flat(r.output)


def test_a_vllm_result_and_runs_of_different_kinds(tmp_path):
    vllm = tmp_path / "vllm.json"  # the fields `vllm bench serve --save-result` writes
    vllm.write_text(json.dumps({"backend": "vllm", "model_id": "Qwen/Qwen3-0.6B", "output_throughput": 900.0}))
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps({"benchmark": "bench-serve", "model_id": "Qwen/Qwen3-0.6B", "output_throughput": 5.0}))
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"benchmark": "bench-offline", "model": "tiny-llama", "output_throughput": 7.0}))
    # bench-serve writes vLLM's field names so that exactly this compare works: no "not like for like" note (it
    # showed on the docs' own example, teaching to ignore it)
    out = run("bench-compare", str(vllm), str(serve))
    assert "serving (vLLM/SGLang) vllm Qwen/Qwen3-0.6B" in out and "not like for like" not in out
    out = run("bench-compare", str(serve), str(off))
    assert "different benchmarks (#1 bench-serve; #2 bench-offline)" in out
    assert "different models (#1 Qwen/Qwen3-0.6B; #2 tiny-llama)" in out
    out = run("bench-compare", str(vllm), str(off))
    assert "different benchmarks (#1 serving (vLLM/SGLang); #2 bench-offline)" in out


DROP = object()  # a field taken out of the result
# A bench-trace result's fields bench-compare reads (trimmed), each of the right type: accepted.
RESULT = {
    "benchmark": "bench-trace",
    "label": "base run",
    "engine": "minisgl",
    "model": "dummy:tiny-llama",
    "device": "cpu",
    "gpu": None,
    "partial": False,
    "output_throughput": 913.96,
    "request_throughput": 26.11,
    "median_ttft_ms": 51.98,
    "p99_ttft_ms": 60.5,
    "flags": {"trace": "t.jsonl", "num_requests": 4},
    "environment": {"commit": "2b19e0e", "dirty": True},
}


@pytest.mark.parametrize(
    "change, message",
    [
        # label, engine, flags, environment, commit and workload were tracebacks (exit 1: rich's NotRenderableError,
        # AttributeError, TypeError); the others were shown as they came
        ({"label": 123}, "'label' must be a string (got 123)"),
        ({"engine": ["x"]}, "'engine' must be a string (got ['x'])"),
        ({"model": {"a": 1}}, "'model' must be a string (got {'a': 1})"),
        ({"benchmark": 5}, "'benchmark' must be a string (got 5)"),
        ({"flags": ["a"]}, "'flags' must be an object (got ['a'])"),
        ({"flags": "abc"}, "'flags' must be an object (got 'abc')"),
        ({"environment": ["a"]}, "'environment' must be an object (got ['a'])"),
        ({"environment": {"commit": 5}}, "'environment.commit' must be a string (got 5)"),
        ({"environment": {"dirty": "yes"}}, "'environment.dirty' must be true or false (got 'yes')"),
        ({"partial": 1}, "'partial' must be true or false (got 1)"),
        ({"benchmark": DROP, "workload": 5}, "'workload' must be an object (got 5)"),
        # NaN and Infinity parse, and were shown as nan / inf
        ({"output_throughput": float("nan")}, "'output_throughput' must be a finite number (got nan)"),
        ({"output_throughput": float("inf")}, "'output_throughput' must be a finite number (got inf)"),
        ({"output_throughput": 10**400}, "'output_throughput' must be a finite number (got 1000000"),
        ({"median_ttft_ms": "x"}, "'median_ttft_ms' must be a finite number (got 'x')"),
        ({"request_throughput": [1]}, "'request_throughput' must be a finite number (got [1])"),
        (
            {"sweep": [{"output_throughput": 1.0}, {"output_throughput": 2.0, "p99_itl_ms": float("-inf")}]},
            "'sweep[1].p99_itl_ms' must be a finite number (got -inf)",
        ),
        (
            {"sweep": [{"output_throughput": 1.0, "load": {"rate": 1}}]},
            "'sweep[0].load' must be a string or a number (got {'rate': 1})",
        ),
        # a hand-edited null load was shown as "#2 None"
        (
            {"sweep": [{"output_throughput": 1.0, "load": None}]},
            "'sweep[0].load' must be a string or a number (got None)",
        ),
        ({"load": None}, "'load' must be a string or a number (got None)"),
        # what the notes compare runs on
        ({"dtype": 16}, "'dtype' must be a string (got 16)"),
        ({"kv_cache_dtype": ["fp8"]}, "'kv_cache_dtype' must be a string (got ['fp8'])"),
        ({"vllm_version": 0.26}, "'vllm_version' must be a string (got 0.26)"),
        ({"tp": [2]}, "'tp' must be a number (got [2])"),
    ],
)
def test_fields_of_the_wrong_type_are_refused_by_name(tmp_path, change, message):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RESULT))
    out = run("bench-compare", str(good))
    assert "base run" in out and "2b19e0e (dirty)" in out and "913.96" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in {**RESULT, **change}.items() if v is not DROP}))
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-compare", str(good), str(bad)])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert f"{bad}: {message}" in flat(r.output)


def test_json_nested_too_deeply_is_refused(tmp_path):
    """json's parser ends deep nesting in a RecursionError, which was not caught (a traceback, exit 1)."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-compare", str(deep)])
    assert r.exit_code == 2 and f"cannot read {deep}: JSON nested too deeply" in flat(r.output), r.output


def test_ramped_runs_are_named_by_their_ramp(tmp_path):
    """A ramped bench-serve run (one row, request_rate null) reads as one run named by its ramp; a `vllm bench serve
    --ramp-up-strategy` file (request_rate "inf", which vLLM requires beside a ramp) was named "rate inf", the name
    of everything sent at once."""
    ours, theirs, png = tmp_path / "ramp.json", tmp_path / "vllm.json", tmp_path / "cmp.png"
    ramp = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "20"]
    run(
        "bench-serve", *TINY, "--num-requests", "6", "--output-len", "2", "--input-len", "4", *ramp, "--json", str(ours)
    )
    vllm = {"backend": "vllm", "request_rate": "inf", "max_concurrency": 8, "output_throughput": 900.0}
    vllm |= {"ramp_up_strategy": "exponential", "ramp_up_start_rps": 1, "ramp_up_end_rps": 32}
    theirs.write_text(json.dumps(vllm))
    assert [r["rows"][0]["load"] for r in load_runs(ours) + load_runs(theirs)] == [
        "linear ramp 2->20",
        "exponential ramp 1->32, concurrency 8",
    ]
    out = run("bench-compare", str(ours), str(theirs), "--plot", str(png))
    assert "#1 linear ramp 2->20" in out and "#2 exponential ramp 1->32, concurrency 8" in out
    assert "--ramp-up-strategy linear --ramp-up-start-rps 2.0 --ramp-up-end-rps 20.0" in out
    assert png.read_bytes()[:8] == PNG


def test_a_load_cut_short_is_marked_in_the_table_and_the_plot(tmp_path, monkeypatch):
    """A --rate sweep whose throughput load reached --max-errors: bench-serve marks that load (its table's "stopped
    early" row, its plot's "max errors") and finds the knee before it, its figures measuring no load. bench-compare
    showed it as any other load: "throughput 0 / 2" in the table and a point at 0 requests/s in the plot, the
    sweep's line falling to it, with nothing to say it was cut short. It now says so in both."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    result, png = tmp_path / "sweep.json", tmp_path / "cmp.png"
    common = ["--vocab-size", "1000", "--max-model-len", "4096", "--quiet", "--no-client-check"]
    # the synchronous load has requests 1-10, the throughput load fails from its 2nd (12) on: cut at 2 failures
    with mock_server_process(MockConfig(ttft=0.2, fail_from=12), free_port()) as url:
        r = CliRunner(env={"COLUMNS": "300"}).invoke(
            app,
            ["bench-serve", "--url", url, *common, "--rate", "sweep:3", "--num-requests", "10", "--output-len", "2"]
            + ["--max-errors", "2", "--json", str(result)],
        )
    assert r.exit_code == 1, r.output
    rows = json.loads(result.read_text())["sweep"]
    assert [(row["load"], row["stop_reason"]) for row in rows] == [("synchronous", None), ("throughput", "max_errors")]
    out = run("bench-compare", str(result), "--plot", str(png))
    assert "#1 synchronous ◀ knee" in out and "#1 throughput (max errors)" in out
    named = [t.get_text() for t in figs[0].axes[0].texts]
    assert named == ["synchronous", "throughput (max errors)"]


@pytest.mark.parametrize("sweep_beside", [False, True])
def test_a_single_run_cut_short_is_named_so_in_the_plot(tmp_path, monkeypatch, sweep_beside):
    """A single run that --max-errors or Ctrl-C cut short is "rate 50 (max errors)" in the figures table, but the plot
    drew it under its bare name (a bar, or a reference line beside sweeps), as a measurement of its load."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    cut = {"name": "cut", "rows": [{"load": "rate 50", "stop_reason": "max_errors", "output_throughput": 500.0}]}
    whole = {"name": "whole", "rows": [{"load": "rate inf", "stop_reason": None, "output_throughput": 900.0}]}
    runs = [cut, whole]
    if sweep_beside:
        rows = [{"load": f"rate {r}", "request_throughput": r, "output_throughput": 10.0 * r} for r in (1, 2)]
        runs.append({"name": "sweep", "rows": rows})
    plots.plot_compare(runs, tmp_path / "cmp.png")
    tput = figs[0].axes[0]
    if sweep_beside:
        names = [t.get_text() for t in tput.get_legend().get_texts()]
    else:
        names = [t.get_text() for t in figs[0].axes[-1].get_xticklabels()]  # under the bottom panel
    assert "#1 cut (max errors)" in names and "#2 whole" in names


def test_runs_of_different_workloads_are_noted(tmp_path):
    """bench-offline writes its workload's digest (of the prompts and output lengths) so that runs can be checked to
    be on the same workload, but bench-compare put two runs of one model on different workloads (another --seed,
    other lengths) side by side with no word: their tok/s read as like for like."""
    off = json.loads(
        (
            Path(__file__).resolve().parent.parent / "benchmarks/results/bench_offline_vllm_qwen3-0.6b_h200.json"
        ).read_text()
    )
    same, other = tmp_path / "same.json", tmp_path / "other.json"
    same.write_text(json.dumps(off))
    other.write_text(json.dumps(off | {"workload": off["workload"] | {"seed": 1, "digest": "0123456789abcdef"}}))
    first = tmp_path / "first.json"
    first.write_text(json.dumps(off))
    out = run("bench-compare", str(first), str(same))  # minisgl and its vLLM peer twice: one workload
    assert "workloads" not in out
    out = run("bench-compare", str(first), str(other))
    assert "note: these runs are of different workloads" in out and "#1, #2" in out and "#3, #4" in out
    # bench-serve: other prompt lengths are another workload; other loads (rates) are not
    base = {"benchmark": "bench-serve", "model_id": "m", "output_throughput": 1.0, "request_rate": "inf"}
    wl = {"source": "random", "input_len": "16:32", "output_len": "8:16", "seed": 0, "arrival": "poisson"}
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(base | {"workload": wl}))
    b.write_text(json.dumps(base | {"workload": wl | {"arrival": "constant"}, "request_rate": 4.0}))
    c.write_text(json.dumps(base | {"workload": wl | {"input_len": "100:1024"}}))
    assert "workloads" not in run("bench-compare", str(a), str(b))
    assert "different workloads" in run("bench-compare", str(a), str(c))
    # a dataset's other prompt column, or the chat endpoint (the chat template around each prompt): other requests
    dataset = wl | {"source": "prompts.jsonl", "input_len": None, "dataset_column": "prompt"}
    d1, d1b, d2, d3 = (tmp_path / f"{n}.json" for n in ("d1", "d1b", "d2", "d3"))
    for path in (d1, d1b):
        path.write_text(json.dumps(base | {"backend": "openai", "workload": dataset}))
    d2.write_text(json.dumps(base | {"backend": "openai", "workload": dataset | {"dataset_column": "question"}}))
    d3.write_text(json.dumps(base | {"backend": "openai-chat", "workload": dataset}))
    assert "workloads" not in run("bench-compare", str(d1), str(d1b))
    assert "different workloads" in run("bench-compare", str(d1), str(d2))
    assert "different workloads" in run("bench-compare", str(d1), str(d3))


def test_hand_edited_nulls_read_as_not_recorded(tmp_path):
    """A null `benchmark` was shown as the benchmark "None" (every flag then shown, the defaults unknown), and a null
    flag as "--time-scale None": a null is now a field not recorded, as in a file written before it."""
    path = Path(__file__).resolve().parent.parent / "benchmarks/results/trace_qwen1000_h200_inproc_x5_408f948.json"
    d = json.loads(path.read_text())
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d | {"benchmark": None, "flags": d["flags"] | {"time_scale": None}}))
    assert "--time-scale 0.2 " in run("bench-compare", str(path))
    out = run("bench-compare", str(edited))
    assert "edited (minisgl) bench-trace minisgl" in out and "--time-scale" not in out and "None" not in out


def test_a_file_given_twice_is_refused(tmp_path):
    """The same file given twice (or under another name: a symlink, `dir/../file`) showed its runs twice, as two runs
    that agreed, without a word."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        path.write_text(json.dumps(RESULT))
    (tmp_path / "link.json").symlink_to(a)
    (tmp_path / "sub").mkdir()
    assert "#2" in run("bench-compare", str(a), str(b))  # two files of one content are two runs
    for again, message in (
        (str(a), f"{a}: is given twice"),
        (str(tmp_path / "link.json"), f"{tmp_path / 'link.json'}: is the same file as {a}"),
        (str(tmp_path / "sub" / ".." / "a.json"), f"{tmp_path / 'sub' / '..' / 'a.json'}: is the same file as {a}"),
    ):
        r = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["bench-compare", str(a), str(b), again])
        assert r.exit_code == 2 and message in flat(r.output) and "give it once" in flat(r.output), r.output


def test_runs_on_different_setups_are_noted():
    """Runs on different GPUs, dtypes, KV cache dtypes, TP sizes or engine versions sat side by side with no word
    (stored runs of this repository: each pair differs in one of them, and the note names that one alone)."""
    results = Path(__file__).resolve().parent.parent / "benchmarks/results"
    pairs = {
        ("kv_fp8_h100/offline_ab_auto.json", "kv_fp8_h100/offline_ab_fp8.json"): (
            "KV cache dtypes (#1 bfloat16; #2 float8_e4m3fn)"
        ),
        ("bench_offline_llama-3.1-8b_h100_d419ef2.json", "bench_offline_llama-3.1-8b_h200_ec2a3d2.json"): (
            "GPUs / devices (#1 NVIDIA H100 80GB HBM3; #2 NVIDIA H200)"
        ),
        ("bench_offline_llama-3.1-8b_h200_tp1.json", "bench_offline_llama-3.1-8b_2xh200_tp2.json"): (
            "TP sizes (#1 TP 1; #2 TP 2)"
        ),
    }
    for (a, b), differ in pairs.items():
        notes = [line for line in run("bench-compare", str(results / a), str(results / b)).split("note: ")[1:]]
        assert notes == [f"these runs are of different {differ}: their figures are not like for like"], (a, b)


def test_engine_versions_and_dtypes_are_noted(tmp_path):
    """Two `bench-trace --engine vllm` runs of other vLLM versions, and a float32 run beside bfloat16 ones; the peer a
    bench-offline --compare file holds is compared on its own fields (its version, dtype, and the run's GPU)."""
    results = Path(__file__).resolve().parent.parent / "benchmarks/results"
    vllm = json.loads((results / "throughput_h100/session16/trace_vllm_612c421.json").read_text())
    old, new = tmp_path / "vllm_old.json", tmp_path / "vllm_new.json"
    old.write_text(json.dumps(vllm | {"vllm_version": "0.10.1"}))
    new.write_text(json.dumps(vllm))
    out = run("bench-compare", str(old), str(new))
    assert "different engine versions (#1 vllm 0.10.1; #2 vllm 0.26.0)" in out and out.count("note:") == 1
    both = results / "kv_fp8_h100/bench_offline_vllm_qwen3-0.6b_bf16.json"  # minisgl and its vLLM peer: one setup
    assert "note:" not in run("bench-compare", str(both))
    fp32 = tmp_path / "fp32.json"
    fp32.write_text(json.dumps(json.loads(both.read_text()) | {"dtype": "float32", "kv_cache_dtype": "float32"}))
    out = run("bench-compare", str(both), str(fp32))
    assert "different dtypes (#1, #2, #4 bfloat16; #3 float32)" in out
    assert "different KV cache dtypes (#1 bfloat16; #3 float32)" in out  # the peer records none
    assert "engine versions" not in out and "GPUs" not in out
    auto = (results / "kv_fp8_h100/offline_ab_auto.json").read_text()
    copies = [tmp_path / f"auto{i}.json" for i in range(3)]
    for copy in copies:
        copy.write_text(auto)
    out = run("bench-compare", *map(str, copies), str(results / "kv_fp8_h100/offline_ab_fp8.json"))
    assert "different KV cache dtypes (#1-#3 bfloat16; #4 float8_e4m3fn)" in out  # 300 runs were listed each


def test_one_result_in_two_files_is_noted(tmp_path):
    """Two files holding one result (a run copied; here also written again in another layout) showed as two runs
    that agree, without a word. The note names the runs of each copy by #, a bench-offline --compare file's peer
    with its run; a copy with one field changed, or a run merely alike, is another run."""
    results = Path(__file__).resolve().parent.parent / "benchmarks/results"
    original = results / "bench_offline_vllm_llama-3.1-8b_h200.json"  # minisgl and its vLLM peer
    copy, edited = tmp_path / "copy.json", tmp_path / "edited.json"
    d = json.loads(original.read_text())
    copy.write_text(json.dumps(dict(reversed(d.items()))))  # not byte for byte: the same fields and values
    edited.write_text(json.dumps(d | {"output_throughput": d["output_throughput"] + 1}))
    other = results / "bench_offline_qwen3-0.6b_64seqs_h200.json"
    out = run("bench-compare", str(original), str(other), str(copy), str(edited))
    assert out.count("one result") == 1, out
    assert f"these runs are one result, field for field (#1, #2 {original}; #5, #6 {copy}): a run copied" in out
    lines = "".join(f"{json.dumps({**d, 'label': name})}\n" for name in ("a", "b", "a"))
    (tmp_path / "runs.jsonl").write_text(lines)  # SGLang's bench_serving appends a line per run: one twice
    out = run("bench-compare", str(tmp_path / "runs.jsonl"))
    assert f"one result, field for field (#1, #2 {tmp_path / 'runs.jsonl'} line 1; #5, #6 " in out, out
    assert "note:" not in run("bench-compare", str(original), str(edited))


def test_a_plot_names_runs_by_their_number_and_shows_figures_no_run_has(tmp_path, monkeypatch):
    """--plot of one bench-offline run (no latencies): its latency panels were blank, their "n/a" drawn outside the
    axis (fitted to the one bar's width). File names of 80 characters, written under every panel's bars, ran into
    each other; beside a sweep, 14 runs' names filled each panel's legend over the points, the 11th run in the 1st's
    colour. Runs are now "#i" and their names cut to 48 characters in the middle, under the bottom panel alone, and
    more than 6 lines get one legend under the panels, in 20 colours."""
    from minisgl_cli import plots

    figs: list = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, rect=None: figs.append(fig))
    long = "serve_run_with_a_really_quite_long_descriptive_file_name_number_12_on_h200_bf16 (minisgl)"
    plots.plot_compare([{"name": long, "rows": [{"load": "-", "output_throughput": 900.0}]}], tmp_path / "one.png")
    tput, ttft, _, bottom = figs[0].axes
    assert [t.get_text() for t in tput.get_xticklabels()] == ["#1"]
    (name,) = [t.get_text() for t in bottom.get_xticklabels()]
    assert name == "#1 serve_run_with_a_really…2_on_h200_bf16 (minisgl)" and len(name) == len("#1 ") + plots.NAME_CHARS
    lo, hi = ttft.get_xlim()
    assert [t.get_text() for t in ttft.texts] == ["n/a", "n/a"]
    assert all(lo < t.get_position()[0] < hi for t in ttft.texts)

    sweep = {
        "name": "sweep",
        "rows": [{"load": f"rate {r}", "request_throughput": r, "output_throughput": r} for r in (1, 2)],
    }
    singles = [{"name": f"run {i}", "rows": [{"load": "rate inf", "output_throughput": 10.0 * i}]} for i in range(13)]
    plots.plot_compare([sweep, *singles], tmp_path / "many.png")
    fig = figs[-1]
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["#1 sweep", *(f"#{i + 2} run {i}" for i in range(13))]
    from matplotlib.colors import to_rgba

    assert len({to_rgba(h.get_color()) for h in legend.legend_handles}) == 14  # "C11" is "C1"
