"""`minisgl bench-offline`: nano-vllm's workload, the bandwidth floor, and real end-to-end runs on tiny models
(minisgl and the transformers peer, in-process and as a --compare child) with the JSON checked against the workload.
vLLM cannot run on this CPU: its tests cover the --compare list, the errors, and the child mechanism it shares."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from engine.model_config import PRESETS
from minisgl_cli.app import app
from minisgl_cli.bench_offline import OFFLINE_ENGINE, parse_peers, workload_digest
from minisgl_cli.roofline import decode_floor, weight_bytes_per_step
from minisgl_cli.workload import parse_range, random_workload, warmup_like
from tests.conftest import make_llm

TINY = ["--model", "dummy:tiny-llama", "--device", "cpu", "--quiet"]


def flat(text: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def bench(tmp_path, *args: str, code: int = 0) -> dict:
    out = tmp_path / "result.json"
    r = CliRunner().invoke(app, ["bench-offline", *args, "--json", str(out)])
    assert r.exit_code == code, r.output + repr(r.exception)
    return json.loads(out.read_text()) if code == 0 else {"output": r.output}


def test_default_workload_is_nano_vllms():
    w = random_workload()
    assert (w.num_seqs, w.output_tokens) == (256, 133_966)  # the figure nano-vllm publishes
    assert all(100 <= len(p) <= 1024 for p in w.prompts) and all(100 <= n <= 1024 for n in w.output_lens)
    assert max(t for p in w.prompts for t in p) == 10_000 and w.folded_ids == 0


def test_small_vocab_keeps_the_lengths_and_folds_the_ids():
    w, tiny = random_workload(), random_workload(vocab_size=512)
    assert [len(p) for p in tiny.prompts] == [len(p) for p in w.prompts] and tiny.output_lens == w.output_lens
    assert all(0 <= t < 512 for p in tiny.prompts for t in p)
    assert tiny.prompts[0] == [t % 512 for t in w.prompts[0]]
    assert tiny.folded_ids == sum(t >= 512 for p in w.prompts for t in p) > 0


def test_warm_up_prompts_have_the_workloads_lengths_and_share_no_page_with_it():
    w = random_workload()
    warm = warmup_like(w, vocab_size=151_936)
    assert [len(p) for p in warm.prompts] == [len(p) for p in w.prompts]
    # one request ends a step: decode runs at every batch size the timed run's tail goes through (with all at 8, the
    # full batch alone was warmed, and a first timed run on a CPU took 1.7-1.9x as long as the next ones)
    assert warm.output_lens == [min(8 + i, n) for i, n in enumerate(w.output_lens)] and len(set(warm.output_lens)) > 200
    assert all(0 <= t <= 10_000 for p in warm.prompts for t in p)
    assert not {tuple(p[:16]) for p in warm.prompts} & {tuple(p[:16]) for p in w.prompts}  # no radix page in common
    assert all(0 <= t < 512 for p in warmup_like(w, vocab_size=512).prompts for t in p)


@pytest.mark.parametrize("text, expect", [("100:1024", (100, 1024)), ("7", (7, 7)), ("3:3", (3, 3))])
def test_parse_range(text, expect):
    assert parse_range(text, "--input-len") == expect


@pytest.mark.parametrize("text", ["5:2", "0:4", "a:b", "1:2:3", ""])
def test_parse_range_rejects(text):
    with pytest.raises(ValueError, match="--input-len"):
        parse_range(text, "--input-len")


def test_floor_of_the_published_workload_matches_gpu_md():
    # The GPU guide's figures for Qwen3-0.6B bf16: ~13.9 TB of KV and ~1.2 TB of weights over the workload;
    # ~36,000 tok/s on an H200.
    w = random_workload()
    f = decode_floor([len(p) for p in w.prompts], w.output_lens, PRESETS["Qwen3-0.6B"], 2, "H200", 4.3e12)
    assert PRESETS["Qwen3-0.6B"].kv_bytes_per_token(2) == 114_688
    assert f.kv_bytes == pytest.approx(13.9e12, rel=0.01)
    assert f.weight_bytes == pytest.approx(1.2e12, rel=0.05) and f.decode_steps == 1023
    assert 34_000 < f.output_throughput < 40_000
    h100 = decode_floor([len(p) for p in w.prompts], w.output_lens, PRESETS["Qwen3-0.6B"], 2, "H100", 3.0e12)
    assert h100.output_throughput == pytest.approx(f.output_throughput * 3.0 / 4.3)


def test_an_fp8_kv_cache_halves_the_floors_kv_bytes():
    w = random_workload()
    lens = [len(p) for p in w.prompts]
    bf16 = decode_floor(lens, w.output_lens, PRESETS["Qwen3-0.6B"], 2, "H200", 4.3e12)
    fp8 = decode_floor(lens, w.output_lens, PRESETS["Qwen3-0.6B"], 2, "H200", 4.3e12, kv_dtype_bytes=1)
    assert fp8.kv_bytes == bf16.kv_bytes / 2 and fp8.weight_bytes == bf16.weight_bytes
    assert fp8.output_throughput > 1.8 * bf16.output_throughput  # the KV is ~92% of the bytes


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe"])
def test_weight_bytes_match_the_engines_model(name):
    # Per step: every parameter once, except an untied input embedding (only its rows are gathered) and, in a MoE
    # layer, the experts beyond num_experts_per_tok (a step's tokens may all use the same k).
    model = make_llm(f"dummy:{name}", num_pages=64).engine.loaded.model
    cfg = PRESETS[name]
    params = {id(p): p.numel() for p in model.parameters()}  # tied weights counted once
    total = sum(params.values()) - (0 if cfg.tie_word_embeddings else model.embed_tokens.weight.numel())
    sparse = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
    total -= len(sparse) * (cfg.num_experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    assert (len(sparse) > 0) == (name == "tiny-qwen3-moe")
    assert weight_bytes_per_step(cfg, 4) == 4 * total


def test_moe_floor_counts_the_active_experts():
    """Qwen3-30B-A3B: 3.3 B active parameters (the embedding among them, though a step reads only its rows) of 30.5 B
    in all, as published; its floor on the published workload, and the reference figure for uniform routing."""
    cfg = PRESETS["Qwen3-30B-A3B"]
    active = weight_bytes_per_step(cfg, 1) + cfg.vocab_size * cfg.hidden_size  # + the embedding, for the param count
    assert active == pytest.approx(3.35e9, rel=0.01)
    every = weight_bytes_per_step(cfg, 1, experts_per_layer=cfg.num_experts) + cfg.vocab_size * cfg.hidden_size
    assert every == pytest.approx(30.5e9, rel=0.01)
    w = random_workload()
    f = decode_floor([len(p) for p in w.prompts], w.output_lens, cfg, 2, "H200", 4.3e12)
    assert f.weight_bytes == pytest.approx(1023 * weight_bytes_per_step(cfg, 2))
    assert f.seconds_uniform_routing is not None and f.seconds_uniform_routing > 3 * f.seconds
    assert decode_floor([100], [10], PRESETS["Qwen3-0.6B"], 2, "H200", 4.3e12).seconds_uniform_routing is None


def test_minisgl_run_reports_the_workload(tmp_path):
    res = bench(tmp_path, *TINY, "--num-seqs", "8", "--input-len", "16:64", "--output-len", "8:32", "--seed", "3")
    w = random_workload(8, (16, 64), (8, 32), seed=3, vocab_size=512)
    assert (res["engine"], res["model"], res["device"]) == ("minisgl", "tiny-llama", "cpu")
    assert (res["completed"], res["failed"]) == (8, 0)
    assert res["total_input_tokens"] == w.input_tokens and res["total_output_tokens"] == w.output_tokens
    assert res["duration"] > 0 and res["startup_seconds"] > 0
    assert res["startup_breakdown"]["load"] > 0 and res["startup_breakdown"]["graph_capture"] == 0.0  # CPU
    assert res["output_throughput"] == pytest.approx(w.output_tokens / res["duration"])
    assert res["total_token_throughput"] == pytest.approx((w.input_tokens + w.output_tokens) / res["duration"])
    assert res["request_throughput"] == pytest.approx(8 / res["duration"])
    assert res["cache_hit_tokens"] == 0  # the warm-up used other prompts
    assert res["floor"] is None and res["floor_fraction"] is None  # CPU
    assert res["gpu_busy"] is None and [r["gpu_busy"] for r in res["runs"]] == [None]  # no NVML samples off CUDA
    assert res["workload"]["seed"] == 3 and res["workload"]["folded_ids"] == w.folded_ids
    # the engine settings benchmarks/step_profile.py and the other scripts of this workload take from OFFLINE_ENGINE
    assert {k: res["flags"][k] for k in OFFLINE_ENGINE} == OFFLINE_ENGINE
    assert "peer" not in res and res["environment"]["torch"]


def test_repeated_runs_start_cold_and_report_the_median(tmp_path):
    res = bench(tmp_path, *TINY, "--num-seqs", "4", "--input-len", "40:64", "--output-len", "4:8", "--runs", "3")
    assert len(res["runs"]) == 3
    durations = sorted(r["duration"] for r in res["runs"])
    assert res["duration"] == durations[1]
    assert res["cache_hit_tokens"] == 0  # runs 2 and 3 repeat run 1's prompts, but the cache was cleared
    # an even count: the median is the middle two's mean (it was the faster of them, labelled the median)
    res = bench(tmp_path, *TINY, "--num-seqs", "4", "--input-len", "40:64", "--output-len", "4:8", "--runs", "2")
    durations = sorted(r["duration"] for r in res["runs"])
    assert res["duration"] == pytest.approx(sum(durations) / 2) and durations[0] < res["duration"] < durations[1]


def test_each_timed_run_finds_the_engine_idle(tmp_path, monkeypatch):
    """The cache is cleared before a timed generate(), not at its first step: a pending clear made generate() add
    every prompt before its first step (ADD_AS_NEEDED off: its steps might take another call's requests), 16-44 ms
    of an H200 run outside the GPU's steps (docs/gpu.md, sixty-seventh session)."""
    from engine.llm import LLM

    generate, idle_at_entry = LLM.generate, []

    def spy(self, *args, **kw):
        idle_at_entry.append(not self.engine.has_work())
        return generate(self, *args, **kw)

    monkeypatch.setattr(LLM, "generate", spy)
    res = bench(tmp_path, *TINY, "--num-seqs", "4", "--input-len", "40:64", "--output-len", "4:8", "--runs", "3")
    assert idle_at_entry == [True] * 4  # the warm-up and the three timed runs
    assert res["cache_hit_tokens"] == 0 and [r["cache_hit_tokens"] for r in res["runs"]] == [0, 0, 0]  # still cold


def test_the_cache_and_preemption_counters_are_the_median_runs(tmp_path):
    """Every top-level figure describes the median run: cache_hit_tokens and preemptions once added up all runs
    (3 runs of 4 equal prompts: 3x one run's hits, more hit tokens than prompt tokens)."""
    prompt = {"prompt": "The quick brown fox jumps over the lazy dog. " * 8}
    (tmp_path / "same.jsonl").write_text((json.dumps(prompt) + "\n") * 4)
    args = ["--dataset", str(tmp_path / "same.jsonl"), "--num-seqs", "4", "--output-len", "4:4"]
    res = bench(tmp_path, *TINY, *args, "--max-batch-tokens", "400", "--runs", "3")
    hits = [r["cache_hit_tokens"] for r in res["runs"]]
    assert len(set(hits)) == 1 and 0 < hits[0] < res["total_input_tokens"]  # each run cold, its later prompts hit
    assert res["cache_hit_tokens"] == hits[0] and "preemptions" in res["runs"][0]


def test_compare_runs_transformers_on_the_same_workload(tmp_path, capfd):
    """Bare --compare (transformers, as before the list): the peer runs as a child `bench-offline --engine
    transformers --json ...` given this run's flags, and its JSON is merged after a check of the workload's digest.
    The child shows no table of its own (the combined one has its row) and names no temporary file: under --quiet it
    printed its whole table, then "results written to /tmp/minisgl-peer-.../transformers.json", deleted by then."""
    args = ("--num-seqs", "6", "--input-len", "16:48", "--output-len", "4:16", "--seed", "5", "--temperature", "0")
    # minisgl's --max-running-requests is not passed on: the child would refuse it as a flag it does not read
    res = bench(tmp_path, *TINY, *args, "--max-running-requests", "4", "--compare")
    child = capfd.readouterr()  # the child writes to the file descriptors, which CliRunner does not capture
    assert "minisgl-peer-" not in child.out and "output tok/s" not in child.out, child.out
    w = random_workload(6, (16, 48), (4, 16), seed=5, vocab_size=512)
    peer = res["peer"]
    assert (peer["engine"], peer["api"], peer["completed"]) == ("transformers", "generate_batch", 6)
    assert peer["total_input_tokens"] == w.input_tokens and peer["total_output_tokens"] == w.output_tokens
    for key in ("total_input_tokens", "total_output_tokens"):
        assert peer[key] == res[key]
    assert res["peers"] == [peer] and "workload" not in peer and peer["environment"]["torch"]
    assert peer["gpu_busy"] is None and [r["gpu_busy"] for r in peer["runs"]] == [None]  # CPU
    assert res["workload"]["digest"] == workload_digest(w)
    assert res["speedup"] == pytest.approx(res["output_throughput"] / peer["output_throughput"])
    assert res["speedups"] == {"transformers": res["speedup"]}


@pytest.mark.parametrize(
    "text, peers",
    [("transformers", ["transformers"]), ("transformers,vllm", ["transformers", "vllm"]), (" VLLM, vllm ", ["vllm"])],
)
def test_compare_list(text, peers):
    assert parse_peers(text) == peers


@pytest.mark.parametrize("text", ["", ",", "minisgl", "transformers,sglang"])
def test_compare_list_rejects(text):
    with pytest.raises(ValueError, match="transformers, vllm"):
        parse_peers(text)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
@pytest.mark.parametrize("args", [["--engine", "vllm"], ["--compare", "transformers,vllm"]])
def test_vllm_missing_is_a_clear_error(args):
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *args])
    assert r.exit_code == 2, r.output
    assert "vLLM does not import here" in flat(r.output) and "--vllm-env" in flat(r.output)
    # the hint is one the command takes: --vllm-env goes with --compare vllm (refused beside --engine vllm)
    assert "--compare vllm --vllm-env" in flat(r.output) and "before --engine vllm" in flat(r.output)
    assert "Traceback" not in r.output


@pytest.mark.parametrize("name", ["Qwen3-0.6B", "Llama-3.1-8B"])
def test_vllm_model_dir_describes_the_preset(tmp_path, name):
    """vLLM builds a dummy:<preset> from the config.json written for it: read back (as the engine and transformers,
    which vLLM uses, read a HF directory) it is the very same model."""
    import dataclasses

    from transformers import AutoConfig

    from engine import weights
    from minisgl_cli.vllm_peer import write_config_dir

    write_config_dir(PRESETS[name], tmp_path)
    assert dataclasses.replace(weights.hf_config(tmp_path), name=name) == PRESETS[name]
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert (hf.architectures, hf.num_hidden_layers) == ([PRESETS[name].architecture], PRESETS[name].num_layers)
    assert not (tmp_path / "generation_config.json").exists()  # no sampling defaults to leak into the workload


def _draw_a_bar() -> None:
    from tqdm import tqdm  # type: ignore[import-untyped]

    for _ in tqdm(range(3), desc="Capturing CUDA graphs"):
        pass


@pytest.mark.parametrize("start", ["in-process", "fork", "fresh"])
def test_no_tqdm_bars_reaches_a_forked_or_fresh_engine_core(capfd, start):
    """vLLM draws its graph-capture bars with plain tqdm in its engine-core process, forked from this one (tqdm
    already imported) or started afresh (spawn: a new import of tqdm). Under --quiet the vLLM peers start inside
    no_tqdm_bars: a bar drawn in this process, a forked one or a fresh interpreter shows nothing; outside it, the bar
    shows (the control), and tqdm is as before."""
    import multiprocessing
    import subprocess
    import sys

    from minisgl_cli.peers import no_tqdm_bars

    def draw() -> None:
        if start == "in-process":
            _draw_a_bar()
        elif start == "fork":
            child = multiprocessing.get_context("fork").Process(target=_draw_a_bar)
            child.start()
            child.join()
            assert child.exitcode == 0
        else:
            code = "from tqdm import tqdm\nfor _ in tqdm(range(3), desc='Capturing CUDA graphs'): pass"
            subprocess.run([sys.executable, "-c", code], check=True)

    import tqdm.std  # type: ignore[import-untyped]  # imported before the peer starts, as in bench-offline

    init = vars(tqdm.std.tqdm)["__init__"]
    for quiet in (True, False, True, False):
        with no_tqdm_bars(quiet):
            draw()
        err = capfd.readouterr().err
        assert ("Capturing CUDA graphs" in err) is not quiet, err
    assert "TQDM_DISABLE" not in __import__("os").environ and vars(tqdm.std.tqdm)["__init__"] is init


def test_a_failing_peer_child_stops_the_run(tmp_path):
    # The vLLM child starts as `bash -c 'source ENV && exec python -m minisgl_cli ...'`; an environment script that
    # fails (no bundle there) ends the run before minisgl starts.
    env = tmp_path / "env.sh"
    env.write_text("echo 'vllm-env: no unpacked bundle' >&2; return 1\n")
    r = CliRunner().invoke(app, ["bench-offline", *TINY, "--compare", "vllm", "--vllm-env", str(env)])
    assert r.exit_code == 1 and "the vllm peer failed (exit status 1)" in flat(r.output)


def test_vllm_args_reach_the_peer_child(tmp_path):
    # The child's command line, as its environment script sees it: the overrides travel, once per value; minisgl's
    # engine flags do not (the child would refuse them as flags vLLM does not read), nor does --peer-api.
    seen = tmp_path / "argv.txt"
    env = tmp_path / "env.sh"
    env.write_text(f'echo "$*" > {seen}; return 1\n')
    args = ["--compare", "vllm", "--vllm-env", str(env), "--vllm-arg", "max_num_seqs=256", "--page-size", "32"]
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *args, "--vllm-arg", "enforce_eager=true", "--runs", "2"])
    assert r.exit_code == 1 and "the vllm peer failed (exit status 1)" in flat(r.output)
    argv = seen.read_text()
    assert "--vllm-arg max_num_seqs=256 --vllm-arg enforce_eager=true" in argv and "--engine vllm" in argv
    assert "--runs 2" in argv and "--page-size" not in argv


def test_compare_both_peers_with_a_vllm_arg(tmp_path):
    """--compare transformers,vllm --vllm-arg: the transformers child got --vllm-arg too, refused it as a flag for
    the vLLM peer, and the run ended before vLLM started. Each child now gets only what its peer reads."""
    seen = tmp_path / "argv.txt"
    env = tmp_path / "env.sh"
    env.write_text(f'echo "$*" > {seen}; return 1\n')
    args = ["--num-seqs", "2", "--input-len", "4:8", "--output-len", "2:2", "--compare", "transformers,vllm"]
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *args, "--vllm-env", str(env), "--vllm-arg", "max_num_seqs=8"])
    assert r.exit_code == 1 and "the vllm peer failed (exit status 1)" in flat(r.output), r.output
    assert "--vllm-arg max_num_seqs=8" in seen.read_text()


def test_vllm_args_parse():
    from minisgl_cli.options import vllm_args

    got = vllm_args(["max_num_seqs=256", "enforce-eager=true", "kv_cache_dtype=fp8", "max_model_len=null"])
    assert got == {"max_num_seqs": 256, "enforce_eager": True, "kv_cache_dtype": "fp8", "max_model_len": None}
    for bad in ("max_num_seqs", "=3", "max num=3"):
        with pytest.raises(typer.BadParameter, match="is not KEY=VALUE"):
            vllm_args([bad])


def test_peer_child_sources_its_environment_and_needs_no_server_packages(tmp_path, capfd):
    # vllm-env.sh exports only when sourced (BASH_SOURCE[0] != $0) and drops the project's bundle, FastAPI and
    # uvicorn with it, from PYTHONPATH: the child must source it and run the CLI without the server's packages.
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('uvicorn', 'fastapi', 'starlette', 'vllm'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = tmp_path / "env.sh"
    env.write_text(
        '[ "${BASH_SOURCE[0]}" = "$0" ] && { echo "env.sh was run, not sourced" >&2; exit 1; }\n'
        f"export PYTHONPATH={block}${{PYTHONPATH:+:$PYTHONPATH}}\n"
    )
    r = CliRunner().invoke(app, ["bench-offline", *TINY, "--compare", "vllm", "--vllm-env", str(env)])
    err = flat(capfd.readouterr().err)
    assert r.exit_code == 2 and "the vllm peer failed (exit status 2)" in flat(r.output), err
    assert "vLLM does not import here" in err and "not sourced" not in err and "uvicorn" not in err


def test_transformers_padded_generate_fallback(tmp_path):
    res = bench(
        tmp_path,
        *TINY,
        "--engine",
        "transformers",
        "--peer-api",
        "generate",
        "--peer-batch-size",
        "3",
        "--num-seqs",
        "5",
        "--input-len",
        "8:40",
        "--output-len",
        "4:12",
        "--temperature",
        "0",
    )
    w = random_workload(5, (8, 40), (4, 12), vocab_size=512)
    assert (res["engine"], res["api"], res["completed"]) == ("transformers", "generate", 5)
    assert res["total_output_tokens"] == w.output_tokens and res["total_input_tokens"] == w.input_tokens


def test_dataset_prompts_sharegpt_jsonl_and_parquet(tmp_path):
    convs = [
        {
            "conversations": [
                {"from": "system", "value": "be nice"},
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": "answer"},
            ]
        }
        for i in range(5)
    ]
    (tmp_path / "sharegpt.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    res = bench(
        tmp_path, *TINY, "--dataset", str(tmp_path / "sharegpt.jsonl"), "--num-seqs", "3", "--output-len", "4:8"
    )
    # The dummy models' tokenizer is byte-level: "question 0" is 10 tokens.
    assert res["completed"] == 3 and res["total_input_tokens"] == 3 * len("question 0")
    assert res["workload"]["source"].endswith("sharegpt.jsonl")
    assert res["workload"]["input_len"] is None  # was the unused --input-len default, "100:1024"
    # asked for more than it holds: its prompts are given again (as vLLM oversamples), and the run says so
    args = ["--dataset", str(tmp_path / "sharegpt.jsonl"), "--num-seqs", "8", "--output-len", "4:8"]
    r = CliRunner(env={"COLUMNS": "300"}).invoke(
        app, ["bench-offline", *TINY, *args, "--json", str(tmp_path / "o.json")]
    )
    assert r.exit_code == 0, r.output
    assert "holds 5 non-empty prompts: 3 of the 8 requests were given one again" in flat(r.output)
    res = json.loads((tmp_path / "o.json").read_text())
    assert res["completed"] == 8 and res["workload"]["repeated_prompts"] == 3

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["héllo wörld", "x" * 300]
    pq.write_table(pa.table({"id": [1, 2], "text": texts}), tmp_path / "p.parquet")
    res = bench(
        tmp_path, *TINY, "--dataset", str(tmp_path / "p.parquet"), "--num-seqs", "2", "--output-len", "4:4",
        "--max-model-len", "100",
    )  # fmt: skip
    assert res["completed"] == 2 and res["workload"]["truncated_prompts"] == 1
    assert res["total_input_tokens"] == len(texts[0].encode()) + 96  # 100 - 4 output tokens
    assert res["total_output_tokens"] == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input-len", "5:2"], "--input-len"),
        (["--output-len", "x"], "--output-len"),
        (["--engine", "sglang"], "minisgl, transformers, vllm"),
        (["--compare", "--tp", "2"], "--compare runs with --tp 1"),  # bare --compare does not take --tp as its value
        (["--compare", "vllm", "--vllm-env", "/nonexistent.sh"], "is not a file"),
        (["--vllm-arg", "max_num_seqs=256"], "is for the vLLM peer"),
        (["--compare", "vllm", "--vllm-arg", "max_num_seqs"], "is not KEY=VALUE"),
        (["--input-len", "1500:1500", "--output-len", "600:600"], "context length 2048"),
        (["--model", "dummy:nope"], "unknown dummy model"),
        (["--page-size", "0"], "--page-size"),
        (["--kv-cache-dtype", "fp8", "--compare"], "Invalid value for --compare: the transformers peer has no fp8"),
        (["--kv-cache-dtype", "fp8", "--engine", "transformers"], "Invalid value for --engine: the transformers peer"),
        # flags the run would not read: refused by name, never accepted and ignored
        (["--peer-api", "generate"], "--peer-api: is for the transformers peer: give --engine transformers or"),
        (["--compare", "vllm", "--peer-batch-size", "8"], "--peer-batch-size: is for the transformers peer"),
        (
            ["--engine", "transformers", "--peer-api", "generate_batch", "--peer-batch-size", "8"],
            "--peer-batch-size: sizes the padded `generate` batches, and the transformers peer batches continuously",
        ),
        (
            ["--engine", "transformers", "--tp", "1", "--page-size", "32"],
            "--page-size, --tp: for minisgl's engine, which --engine transformers does not run",
        ),
        (
            ["--engine", "vllm", "--memory-fraction", "0.5", "--no-radix-cache"],
            "--memory-fraction, --no-radix-cache: for minisgl's engine, which --engine vllm does not run (vLLM's own",
        ),
        (
            ["--engine", "transformers", "--runs", "3"],
            "--runs: times minisgl's and vLLM's runs; transformers runs once",
        ),
        (["--engine", "transformers", "--plot", "p.png"], "--plot: draws minisgl's engine steps, and --engine"),
        (["--compare", "transformers", "--vllm-arg", "max_num_seqs=8"], "--vllm-arg: is for the vLLM peer"),
        (["--engine", "vllm", "--vllm-env", "/bin/sh"], "--vllm-env: is sourced before the vLLM peer's own process"),
        (["--vllm-env", "/bin/sh"], "--vllm-env: is sourced before the vLLM peer's process: give --compare vllm"),
        (["--engine", "transformers", "--compare", "vllm"], "--engine: --compare runs minisgl beside the peers it"),
        (["--dataset", "d.json", "--input-len", "8:8"], "--input-len: draws random prompts' lengths, and --dataset"),
        (["--dataset-column", "text"], "--dataset-column: names the --dataset file's prompt column, and there is no"),
    ],
)
def test_bad_flags_exit_with_a_clear_message(tmp_path, args, message):
    # a small workload: a flag wrongly accepted runs it in seconds and the test fails, rather than running the default
    small = ["--num-seqs", "2", "--input-len", "4:8", "--output-len", "2:2"]
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *small, *args], env={"MINISGL_VLLM_ENV": None})
    assert r.exit_code == 2, r.output
    assert message in flat(r.output)


def test_values_from_the_environment_are_not_flags_given(tmp_path, monkeypatch):
    """MINISGL_VLLM_ENV set for every shell (even to a file that is not there) is no --vllm-env given to a run
    without the vLLM peer."""
    monkeypatch.setenv("MINISGL_VLLM_ENV", str(tmp_path / "missing.sh"))
    res = bench(tmp_path, *TINY, "--num-seqs", "2", "--input-len", "4:8", "--output-len", "2:2")
    assert (res["engine"], res["completed"]) == ("minisgl", 2)


def test_dataset_without_prompts_is_a_clear_error(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps([{"a": 1, "b": "x"}]))
    r = CliRunner().invoke(app, ["bench-offline", *TINY, "--dataset", str(tmp_path / "d.json")])
    assert r.exit_code == 2 and "no 'conversations', 'messages' or text column" in flat(r.output)


TRACE_ARGS = ["bench-trace", str(Path(__file__).parent.parent / "traces" / "qwen_sample.jsonl")]
OUTPUT_FLAGS = [
    *((["bench-offline"], flag) for flag in ("--json", "--plot")),
    *((TRACE_ARGS, flag) for flag in ("--json", "--plot", "--step-log")),
    *((["bench-serve"], flag) for flag in ("--json", "--plot", "--csv")),
]


@pytest.mark.parametrize("command, flag", OUTPUT_FLAGS, ids=[f"{c[0]} {f}" for c, f in OUTPUT_FLAGS])
@pytest.mark.parametrize("where", ["dir", "parent-file", "read-only"])
def test_bad_output_paths_fail_before_the_run(tmp_path, monkeypatch, command, flag, where):
    import minisgl_cli.options as o

    def no_load(*a, **k):
        raise AssertionError("the model loaded before the output paths were checked")

    monkeypatch.setattr(o, "load_llm", no_load)
    (tmp_path / "file").write_text("x")
    path, message = {
        "dir": (tmp_path, f"{tmp_path} is a directory"),
        "parent-file": (tmp_path / "file" / "out", f"{tmp_path / 'file'} is a file, not a directory"),
        "read-only": (Path("/proc/minisgl-out"), "cannot write in /proc"),
    }[where]
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [*command, *TINY, flag, str(path)])
    assert r.exit_code == 2, r.output + repr(r.exception)
    out = flat(r.output)
    assert f"Invalid value for {flag}: " in out and message in out, out


def test_bench_compare_and_cache_export_check_their_output_paths(tmp_path):
    (tmp_path / "file").write_text("x")
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"output_throughput": 1.0, "benchmark": "bench-offline"}))
    runner = CliRunner(env={"COLUMNS": "300"})
    r = runner.invoke(app, ["bench-compare", str(res), "--plot", str(tmp_path / "file" / "p.png")])
    assert r.exit_code == 2 and "Invalid value for --plot: cannot create" in flat(r.output), r.output
    r = runner.invoke(app, ["cache", "export", str(tmp_path)])
    assert r.exit_code == 2 and f"Invalid value for ARCHIVE: {tmp_path} is a directory" in flat(r.output), r.output
    r = runner.invoke(app, ["cache", "export", str(tmp_path / "file" / "x.tar.gz")])
    assert r.exit_code == 2 and "is a file, not a directory" in flat(r.output), r.output


@pytest.mark.parametrize("command", [["bench-offline"], TRACE_ARGS, ["bench-serve"]], ids=lambda c: c[0])
@pytest.mark.parametrize("name, says", [("p.txt", "has its extension '.txt'"), ("pnoext", "has no extension")])
def test_a_plot_file_name_without_an_image_extension_fails_before_the_run(tmp_path, monkeypatch, command, name, says):
    """--plot p.txt ran the whole benchmark, then matplotlib's ValueError ended it in a traceback (exit 1); --plot
    pnoext said "plot written to pnoext" while matplotlib wrote pnoext.png."""
    import minisgl_cli.options as o

    def no_load(*a, **k):
        raise AssertionError("the model loaded before the output paths were checked")

    monkeypatch.setattr(o, "load_llm", no_load)
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [*command, *TINY, "--plot", str(tmp_path / name)])
    out = flat(r.output)
    assert r.exit_code == 2 and f"Invalid value for --plot: {tmp_path / name} {says}: an image file" in out, out
    assert ".png, .svg" in out and not list(tmp_path.iterdir())


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_output_that_fails_as_it_is_written_is_one_line_and_exit_1(tmp_path):
    """--json /dev/full (a full disk) passed the check before the run and failed as the result was written: a
    traceback (OSError: No space left on device). Now one line naming the file, exit status 1, the table shown."""
    small = ["--num-seqs", "4", "--output-len", "4:4"]  # (the default workload took 40 s of the suite's time)
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *small, "--json", "/dev/full"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output + repr(r.exception)
    out = flat(r.output)
    assert "error: cannot write /dev/full: No space left on device" in out and "output tok/s" in out, out


def test_one_file_for_two_outputs_is_refused(tmp_path):
    out = str(tmp_path / "r.json")
    r = CliRunner().invoke(app, ["bench-offline", *TINY, "--json", out, "--plot", out])
    assert r.exit_code == 2 and "is also given to --json" in flat(r.output), r.output


def _parquet(path: Path, **columns: list) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


@pytest.mark.parametrize(
    "name, data, message",
    [
        # the parser's words and where, not datasets' "An error occurred while generating the dataset" chain
        ("broken.jsonl", b'{"prompt": "hi"}\n{"prompt": "ok"\n', "line 2 column 16: invalid JSON: Expecting ','"),
        ("list.json", b'[\n {"prompt": "a"},\n {"prompt": "b",}\n]', "line 3 column 17: invalid JSON: Expecting prop"),
        ("trailing.json", b'[{"prompt": "a"}] x', "line 1 column 19: invalid JSON: Extra data"),
        ("conv.jsonl", b'{"conversations": "hello"}', "line 1: 'conversations' must be a list of turns"),
        ("turns.jsonl", b'{"conversations": [["human", "hi"]]}', "'conversations': a turn must be an object"),
        # str() of anything made it a prompt
        ("numbers.json", b"[1, 2, 3]", "row 1 is int '1', not an object (expected JSON lines, or a JSON list"),
        ("prompt.jsonl", b'{"prompt": "a"}\n\n{"prompt": 5}', "line 3: 'prompt' must be text, got int '5'"),
        ("value.jsonl", b'{"conversations": [{"from": "human", "value": [1]}]}', "the user turn in 'conversations'"),
        (
            "parts.jsonl",
            b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}',
            "line 1: 'messages': the user turn's part 1 (type 'text') has no text, got None",
        ),
        # content parts the text prompt would silently lose: an image, audio
        (
            "image.jsonl",
            b'{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [{"role": "user", "content": '
            b'[{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]}',
            "line 2: 'messages': the user turn's part 2 is of type 'image_url': only text parts can be a prompt",
        ),
        (
            "audio.json",
            b'[{"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA=="}}]}'
            b"]}]",
            "row 1: 'messages': the user turn's part 1 is of type 'input_audio': only text parts",
        ),
        ("empty.jsonl", b"", "empty.jsonl is empty"),  # was "cannot read dataset empty.jsonl:  (expected ...)"
        ("blank.json", b"\n\n", "blank.json is empty"),
        ("latin1.jsonl", b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}', "line 2 is not UTF-8 (byte 0xe9 at byte 16 of"),
        ("object.json", b'{"data": [{"prompt": "a"}], "v": 1}', "no 'conversations', 'messages' or text column ("),
        ("quote.csv", b'id,prompt\n1,"open\n', "quote.csv: after line 1: unexpected end of data"),
        ("none.json", b"[]", "none.json holds no rows"),
        ("header.csv", b"id,prompt\n", "header.csv holds no rows"),
        ("cells.csv", b"prompt\nhi\nhello, world\n", "line 3 has more cells than the header's 1 (quote a cell"),
        ("numbers.parquet", None, "numbers.parquet: row 1: 'text' must be text, got int '7'"),
        ("notext.parquet", None, "notext.parquet has no 'conversations', 'messages' or text column (prompt, text,"),
        ("bad.parquet", b"PAR1 not really", "as Parquet: Parquet magic bytes not found in footer"),
        ("prompts.txt", b"hi", "prompts.txt: use a .json, .jsonl, .csv or .parquet file"),
        ("missing.jsonl", None, "missing.jsonl does not exist"),
        ("folder.json", None, "folder.json is a directory, not a file"),
    ],
)
def test_malformed_datasets_are_clear_errors(tmp_path, name, data, message):
    path = tmp_path / name
    if name == "numbers.parquet":
        _parquet(path, text=[7, 8])
    elif name == "notext.parquet":
        _parquet(path, id=[1], score=[0.5])
    elif name == "folder.json":
        path.mkdir()
    elif data is not None:
        path.write_bytes(data)
    r = CliRunner(env={"COLUMNS": "300"}).invoke(
        app, ["bench-offline", *TINY, "--num-seqs", "2", "--dataset", str(path)]
    )
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "Invalid value for --dataset: " in flat(r.output) and message in flat(r.output), flat(r.output)


def test_a_broken_dataset_is_one_message_on_stderr(tmp_path):
    """datasets logged its own "Failed to load JSON from file ... JSON parse error ... in row 1" on stderr before
    ours, which named no line ("Trailing data at position 16"). The whole stderr is now click's usage lines and one
    error naming the file, the line and the column; nothing on stdout; exit status 2."""
    import subprocess
    import sys

    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "hi"}\n{"prompt": "ok"\n')
    cmd = [sys.executable, "-m", "minisgl_cli", "bench-offline", *TINY, "--output-len", "2:2", "--dataset", str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout) == (2, ""), p.stderr
    assert p.stderr.splitlines() == [
        "Usage: python -m minisgl_cli bench-offline [OPTIONS]",
        "Try 'python -m minisgl_cli bench-offline -h' for help.",
        "",
        f"Error: Invalid value for --dataset: dataset {path}: line 2 column 16: invalid JSON: Expecting ',' delimiter",
    ]


def test_the_prompt_column_is_the_files_and_rows_without_a_prompt_are_counted(tmp_path):
    """The prompt is the file's first column of TEXT_COLUMNS (guidellm's rule: one column for the whole file, never
    another column's text for one row); a row whose prompt is empty, blank or missing is skipped, as vLLM's ShareGPT
    reader drops a conversation without a reply, and the run says how many (the table's note, the JSON's
    workload.skipped_rows)."""
    rows = [{"prompt": "first prompt", "text": "t"}, {"prompt": "", "text": "not this"}, {"text": "nor this"}]
    rows += [{"prompt": " \n "}, {"prompt": None}, {"prompt": "second prompt"}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["bench-offline", *TINY, "--dataset", str(path), "--num-seqs", "2", "--output-len", "2:2"]
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, [*args, "--json", str(tmp_path / "o.json")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    res = json.loads((tmp_path / "o.json").read_text())
    # the byte tokenizer: one id per byte of the two prompts the file holds, each once
    assert res["total_input_tokens"] == len("first prompt") + len("second prompt")
    assert (res["workload"]["skipped_rows"], res["workload"]["repeated_prompts"]) == (4, 0)
    assert f"note: {path}: 4 rows with no text in 'prompt' were skipped (the first: line 2)" in flat(r.output)


def test_dataset_files_that_read(tmp_path):
    """What a user may hand in besides ShareGPT JSON: a byte-order mark, UTF-16 (PowerShell's `>`), CRLF lines,
    U+2028 inside a JSON string, JSON lines in a .json, OpenAI `messages` after a system turn, a JSON list of strings,
    a file of one column of another name (guidellm's rule), CSV with quoted commas, newlines and a cell longer than
    the csv module's default limit of 131,072 characters, and a Parquet file of conversations."""
    from minisgl_cli.workload import read_dataset_prompts

    def prompts(name: str, data: bytes, limit: int = 10) -> list[str]:
        (tmp_path / name).write_bytes(data)
        return read_dataset_prompts(tmp_path / name, limit).texts

    assert prompts("bom.jsonl", b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": "b"}') == ["a", "b"]
    assert prompts("bom.jsonl", b'{"prompt": "changed"}') == ["changed"]  # a file's prompts are kept until it changes
    assert prompts("ps.jsonl", '{"prompt": "sixteen"}\r\n'.encode("utf-16")) == ["sixteen"]
    assert prompts("crlf.jsonl", b'{"prompt": "a"}\r\n{"prompt": "b"}\r\n') == ["a", "b"]
    assert prompts("ls.jsonl", '{"text": "a\u2028b"}\n{"text": "c"}'.encode()) == ["a\u2028b", "c"]
    assert prompts("lines.json", b'{"question": "q1"}\n{"question": "q2"}\n') == ["q1", "q2"]
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, {"role": "user", "content": "2"}]
    assert prompts("chat.jsonl", json.dumps({"messages": msgs}).encode()) == ["hi"]
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": ""}, {"type": "text", "text": "two"}]
    msgs = [{"role": "user", "content": parts}]  # OpenAI content parts, joined with "\n" as vLLM joins them
    assert prompts("parts.jsonl", json.dumps({"messages": msgs}).encode()) == ["one\n\ntwo"]
    assert prompts("strings.json", b'["one", "", "two"]') == ["one", "two"]
    assert prompts("query.jsonl", b'{"query": "q"}') == ["q"]
    long = "y" * 200_000
    assert prompts("p.csv", f'id,prompt\n1,"a, b"\n2,"c\nd"\n3,{long}\n'.encode()) == ["a, b", "c\nd", long]
    assert prompts("p.csv", f'id,prompt\n1,"a, b"\n2,"c\nd"\n3,{long}\n'.encode(), limit=1) == ["a, b"]
    assert prompts("semi.csv", b'id;prompt\n1;"a; b, c"\n') == ["a; b, c"]  # was the one column 'id;prompt'
    assert prompts("tabs.csv", b"prompt\tid\nhello\t1\n") == ["hello"]
    conv = [[{"from": "gpt", "value": "x"}], [{"from": "human", "value": "pq"}]]
    _parquet(tmp_path / "c.parquet", conversations=conv)
    read = read_dataset_prompts(tmp_path / "c.parquet", 5)
    assert (read.texts, read.skipped, read.first_skipped) == (["pq"], 1, "row 1")


CHAT_ROWS = [  # OpenAI messages, a user turn's content as a list of text parts; a text column of another name
    {
        "id": 1,
        "answer": "the first answer",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "first line"}, {"type": "text", "text": "second"}]},
        ],
    },
    {"id": 2, "answer": "", "messages": [{"role": "user", "content": "a plain string"}]},
    {"id": 3, "answer": "the third answer", "messages": [{"role": "user", "content": []}]},
]


def test_dataset_column_and_content_parts_read(tmp_path):
    """--dataset-column's reader: the named column, whether text or conversations (one of another name too); the
    file's own column without it; one it lacks an error naming the file's columns (JSON lines, CSV, Parquet, a saved
    dataset). A user turn's text parts are joined with "\n", as vLLM's string-format chat templates join them."""
    import datasets

    from minisgl_cli.workload import read_dataset_prompts

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT_ROWS))
    read = read_dataset_prompts(path, 10)  # the file's own choice: messages; an empty parts list has no user text
    assert (read.texts, read.column, read.skipped, read.first_skipped) == (
        ["first line\nsecond", "a plain string"], "messages", 1, "line 3"
    )  # fmt: skip
    read = read_dataset_prompts(path, 10, "answer")
    assert (read.texts, read.column, read.turns, read.skipped) == (
        ["the first answer", "the third answer"],
        "answer",
        False,
        1,
    )
    assert read.skipped_note(path) == f"{path}: line 2 has no text in 'answer' and was skipped"
    with pytest.raises(ValueError, match=r"chat.jsonl: line 1: 'id' must be text, got int '1'"):
        read_dataset_prompts(path, 10, "id")
    with pytest.raises(ValueError, match=r"chat.jsonl has no column 'Answer'; its columns: id, answer, messages$"):
        read_dataset_prompts(path, 10, "Answer")
    # conversations under another name are read as turns when named (and as a file's only column)
    convs = [[{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "x"}], [{"from": "gpt", "value": "y"}]]
    path = tmp_path / "dialog.json"
    path.write_text(json.dumps([{"dialog": c, "text": f"t{i}"} for i, c in enumerate(convs)]))
    read = read_dataset_prompts(path, 10, "dialog")
    assert (read.texts, read.turns) == (["hi there"], True)
    assert read.skipped_note(path) == f"{path}: row 2 has no user turn in 'dialog' and was skipped"
    assert read_dataset_prompts(path, 10).texts == ["t0", "t1"]
    path = tmp_path / "trl.jsonl"  # TRL's conversational format: a prompt column of messages
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "asked"}], "completion": "c"}))
    assert (read_dataset_prompts(path, 10).texts, read_dataset_prompts(path, 10).turns) == (["asked"], True)
    csv_path = tmp_path / "p.csv"
    csv_path.write_text('prompt,reference\n"p, 1",r1\np2,r2\n')
    assert read_dataset_prompts(csv_path, 10, "reference").texts == ["r1", "r2"]
    with pytest.raises(ValueError, match="p.csv has no column 'text'; its columns: prompt, reference$"):
        read_dataset_prompts(csv_path, 10, "text")
    # Parquet and a saved dataset read the named column alone, of any name (not one of the known ones)
    _parquet(tmp_path / "q.parquet", question=["q1", "q2"], body=["b1", "b2"], dialog=convs)
    assert read_dataset_prompts(tmp_path / "q.parquet", 10, "body").texts == ["b1", "b2"]
    assert read_dataset_prompts(tmp_path / "q.parquet", 10, "dialog").texts == ["hi there"]
    assert read_dataset_prompts(tmp_path / "q.parquet", 1).texts == ["q1"]
    with pytest.raises(ValueError, match="q.parquet has no column 'text'; its columns: question, body, dialog$"):
        read_dataset_prompts(tmp_path / "q.parquet", 10, "text")
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "body": ["c", "d"]}).save_to_disk(tmp_path / "saved")
    assert read_dataset_prompts(tmp_path / "saved", 10, "body").texts == ["c", "d"]
    with pytest.raises(ValueError, match="saved has no column 'x'; its columns: prompt, body$"):
        read_dataset_prompts(tmp_path / "saved", 10, "x")


def test_dataset_column_on_the_command_line(tmp_path):
    """bench-offline --dataset-column reads the prompts from that column and records it in the JSON
    (workload.dataset_column, the file's own column without the flag); a column the file lacks is a CLI error naming
    its columns."""
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT_ROWS))
    args = ["--dataset", str(path), "--num-seqs", "2", "--output-len", "2:2"]
    res = bench(tmp_path, *TINY, *args)
    # the byte tokenizer: one id per byte of each prompt; the parts joined with one "\n"
    assert res["total_input_tokens"] == len("first line\nsecond") + len("a plain string")
    assert (res["workload"]["dataset_column"], res["workload"]["skipped_rows"]) == ("messages", 1)
    res = bench(tmp_path, *TINY, *args, "--dataset-column", "answer")
    assert res["total_input_tokens"] == len("the first answer") + len("the third answer")
    assert (res["workload"]["dataset_column"], res["flags"]["dataset_column"]) == ("answer", "answer")
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench-offline", *TINY, *args, "--dataset-column", "prompt"])
    assert r.exit_code == 2, r.output
    why = f"dataset {path} has no column 'prompt'; its columns: id, answer, messages"
    assert f"Invalid value for --dataset-column: {why}" in flat(r.output)


def test_a_dataset_saved_by_datasets_reads(tmp_path):
    """A directory `datasets` saved (save_to_disk) is read through `datasets`: a Dataset's, a DatasetDict's 'train'
    split; a dict of other splits, a damaged save and a plain directory are errors naming the problem."""
    import datasets

    from minisgl_cli.workload import read_dataset_prompts

    datasets.Dataset.from_dict({"id": [1, 2, 3], "prompt": ["a", "", "b"]}).save_to_disk(tmp_path / "one")
    read = read_dataset_prompts(tmp_path / "one", 10)
    assert (read.texts, read.column, read.skipped, read.first_skipped) == (["a", "b"], "prompt", 1, "row 2")
    splits = {s: datasets.Dataset.from_dict({"text": [s]}) for s in ("test", "train")}
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "dict")
    assert read_dataset_prompts(tmp_path / "dict", 10).texts == ["train"]
    datasets.DatasetDict({s: splits[s] for s in ("test",)}).save_to_disk(tmp_path / "only")
    assert read_dataset_prompts(tmp_path / "only", 10).texts == ["test"]
    datasets.Dataset.from_dict({"id": [1], "score": [0.5]}).save_to_disk(tmp_path / "notext")  # said "holds no rows"
    with pytest.raises(ValueError, match=r"notext has no 'conversations', 'messages' or text column \(.*: id, score$"):
        read_dataset_prompts(tmp_path / "notext", 10)
    datasets.DatasetDict({"a": splits["test"], "b": splits["train"]}).save_to_disk(tmp_path / "ab")
    with pytest.raises(ValueError, match="holds the splits a, b: none is 'train'"):
        read_dataset_prompts(tmp_path / "ab", 10)
    for arrow in (tmp_path / "one").glob("*.arrow"):
        arrow.unlink()
    with pytest.raises(ValueError, match="cannot read dataset .*one as a directory `datasets` saved"):
        read_dataset_prompts(tmp_path / "one", 10)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="plain is a directory, not a file"):
        read_dataset_prompts(tmp_path / "plain", 10)


@pytest.mark.parametrize("command", ["bench-offline", "bench-serve"])
def test_quiet_shows_no_dataset_reader_output(tmp_path, command):
    """--quiet left datasets' own bar ("Generating train split: 2 examples") as it read a dataset file the first
    time; the files are now read without it."""
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"prompt number {i}"}) for i in range(3)) + "\n")
    args = [command, *TINY, "--dataset", str(data), "--output-len", "2:2"]
    args += ["--num-seqs", "2"] if command == "bench-offline" else ["--num-requests", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "Generating train split" not in r.output and "examples" not in r.output, r.output


def _start_bench(tmp_path: Path, *args: str):
    """bench-offline as from a terminal: a session of its own (its process group gets the Ctrl-C), SIGINT at its
    default (a background job ignores it); stdout to a file, stderr (progress, run lines) piped to be watched."""
    import os
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "minisgl_cli", "bench-offline", *TINY[:4], *args]
    with open(tmp_path / "stdout", "w") as stdout:
        return subprocess.Popen(
            cmd,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            env={**os.environ, "COLUMNS": "200"},
        )


def _wait_for(p, text: str, seen: list[str], timeout: float = 240.0) -> None:
    """Read p's stderr line by line until one holds `text` (the lines go to `seen`)."""
    import time

    t0 = time.monotonic()
    for line in p.stderr:
        seen.append(line)
        if text in line:
            return
        assert time.monotonic() - t0 < timeout, "".join(seen)
    raise AssertionError(f"{text!r} never came (exit status {p.wait()}):\n" + "".join(seen))


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _session(pid: int) -> list:
    """The live processes of the session `pid` leads (the benchmark and every process it started, peer children in
    their own process groups too)."""
    import os

    import psutil

    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid and _alive(proc):
                alive.append(proc)
        except OSError:  # gone meanwhile
            continue
    return alive


def _interrupt(p, seen: list[str]) -> tuple[str, list]:
    """Ctrl-C as a terminal sends it (to the foreground process group); the whole stderr, and the processes the run
    had started that are still alive once it has exited."""
    import os
    import signal

    started = _session(p.pid)
    assert started, "the benchmark is not running"
    os.killpg(p.pid, signal.SIGINT)
    _, rest = p.communicate(timeout=120)
    return "".join(seen) + rest, [proc for proc in started if _alive(proc)] + _session(p.pid)


def test_ctrl_c_keeps_the_finished_runs_as_partial_results(tmp_path):
    """--runs 3 --compare transformers, SIGINT once minisgl's first timed run has finished: the finished runs (and
    the peer, which ran first) are reported in the table and the JSON, marked partial with how many of the planned
    runs finished; exit 130, no traceback, no process left."""
    out = tmp_path / "r.json"
    args = ["--num-seqs", "2", "--input-len", "16:32", "--output-len", "256:512", "--max-running-requests", "1"]
    p = _start_bench(tmp_path, *args, "--runs", "3", "--compare", "--temperature", "0", "--json", str(out))
    seen: list[str] = []
    _wait_for(p, "minisgl run 1/3 finished", seen)
    stderr, left = _interrupt(p, seen)
    stdout = flat((tmp_path / "stdout").read_text())
    assert p.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    assert not left, left
    res = json.loads(out.read_text())
    n = res["completed_runs"]
    assert 1 <= n < 3 and res["planned_runs"] == 3 and len(res["runs"]) == n, res["runs"]  # the cut run is dropped
    assert res["partial"] is True and res["stopped"] == "interrupted"
    assert f"partial results: interrupted after {n} of 3 timed runs finished" in stdout, stdout
    assert "minisgl (torch)" in stdout and "transformers" in stdout  # the normal table, peer column too
    # the figures are those of a whole finished run: the median of the finished ones
    w = random_workload(2, (16, 32), (256, 512), vocab_size=512)
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (2, 0, w.output_tokens)
    assert res["duration"] == sorted(r["duration"] for r in res["runs"])[(n - 1) // 2]
    assert res["output_throughput"] == pytest.approx(w.output_tokens / res["duration"])
    peer = res["peer"]  # ran to its end before minisgl started
    assert (peer["engine"], peer["completed"]) == ("transformers", 2)
    assert (peer["completed_runs"], peer["planned_runs"]) == (1, 1)
    assert peer["total_output_tokens"] == w.output_tokens and res["speedups"]["transformers"] > 0
    assert res["benchmark"] == "bench-offline" and res["workload"]["digest"] == workload_digest(w)


_FINALIZER_CTRL_C = """
import os, signal, sys, time
if sys.argv[1] == "hook":
    from minisgl_cli.ctrl_c import deliver_after_finalizers
    deliver_after_finalizers()

class Freed:
    def __del__(self):  # Ctrl-C arrives while Python runs this finalizer
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)

Freed()
for _ in range(200):
    time.sleep(0.01)
print("ran on")
"""


@pytest.mark.parametrize("hook", ["hook", "none"])
def test_a_ctrl_c_inside_a_finalizer_still_stops_the_command(hook):
    """A Ctrl-C that lands in a __del__ (a peer child stopped while it imports transformers) is printed as "Exception
    ignored" with a traceback and lost: the process runs on. The CLI's entry points deliver it again instead; without
    that (`none`, plain Python) the process runs on, which is what this test's other case shows."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, "-c", _FINALIZER_CTRL_C, hook], capture_output=True, text=True, timeout=60, cwd=root
    )
    if hook == "none":
        assert p.returncode == 0 and "ran on" in p.stdout and "Exception ignored" in p.stderr, (p.stdout, p.stderr)
        return
    assert p.returncode != 0 and "ran on" not in p.stdout, (p.stdout, p.stderr)
    assert "KeyboardInterrupt" in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def test_ctrl_c_before_a_run_finished_writes_nothing_and_stops_the_peer(tmp_path):
    """SIGINT while the --compare peer child runs: the child (in a process group of its own, so the terminal's
    Ctrl-C reaches the parent alone) is stopped by the parent and waited for; no timed run of minisgl finished, so
    the command says so, writes no results file, and exits 130 with no process left."""
    import time

    import psutil

    out = tmp_path / "r.json"
    args = ["--num-seqs", "4", "--input-len", "16:32", "--output-len", "512:1024", "--json", str(out)]
    p = _start_bench(tmp_path, *args, "--compare", "--quiet")
    seen: list[str] = []
    _wait_for(p, "in a process of its own", seen)
    t0 = time.monotonic()
    while not (kids := psutil.Process(p.pid).children()) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    assert kids, "no peer child"
    time.sleep(4)  # the child imports, loads transformers and runs; stopped wherever it is
    assert p.poll() is None and kids[0].is_running()
    stderr, left = _interrupt(p, seen)
    stdout = flat((tmp_path / "stdout").read_text())
    assert p.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert not left, left
    assert "stopping the transformers peer" in flat(stderr)
    assert f"interrupted before a timed run of minisgl finished: no results; nothing written to {out}" in stdout
    assert not out.exists()


@pytest.mark.parametrize("temperature, gguf", [("0", False), ("0.6", False), ("0.6", True)])
def test_the_transformers_peer_under_quiet_prints_nothing(tmp_path, temperature, gguf):
    """--quiet: the peer's run writes nothing to stderr. transformers warned on every run about the EOS the peer turns
    off on purpose and, greedy, about the sampling flags it ignores; from a GGUF file (the embedded default is one)
    its conversion bar showed, plain tqdm that transformers' own switch does not reach."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env
    from tests.test_bad_input import _tiny_gguf

    model = ["--model", str(tmp_path / "tiny.gguf")] if gguf else []
    if gguf:
        _tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "peer.json"
    args = ["--engine", "transformers", *TINY, *model, "--num-seqs", "4", "--input-len", "16:32", "--output-len", "4:8"]
    r = subprocess.run(
        [sys.executable, "-m", "minisgl_cli", "bench-offline", *args, "--temperature", temperature, "--json", str(out)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    res = json.loads(out.read_text())
    assert (res["engine"], res["api"], res["completed"]) == ("transformers", "generate_batch", 4)


def test_dataset_output_len_of_the_whole_context_is_a_cli_error(tmp_path):
    """With --dataset only the output length is checked against the context before the run; an --output-len equal
    to it left a cut prompt no room, and its first token went over: a traceback (ContextOverflow, exit 1)."""
    (tmp_path / "d.json").write_text(json.dumps([{"prompt": "tell me a story about a dragon"}]))
    args = ["--dataset", str(tmp_path / "d.json"), "--num-seqs", "2", "--max-model-len", "64"]
    out = bench(tmp_path, *TINY, *args, "--output-len", "64:64", code=2)["output"]
    assert "exceeds the model's context length 64: lower --output-len" in flat(out), out
    assert "--input-len" not in flat(out)
    assert bench(tmp_path, *TINY, *args, "--output-len", "63:63")["total_input_tokens"] == 2  # one token each


def test_truncated_dataset_prompts_are_noted_under_the_table(tmp_path):
    """A prompt cut to fit the context was counted in the JSON alone (workload.truncated_prompts): the table's input
    tokens were silently fewer than the file's."""
    (tmp_path / "d.json").write_text(json.dumps([{"prompt": "short"}, {"prompt": "x " * 400}]))
    out = tmp_path / "r.json"
    args = ["--dataset", str(tmp_path / "d.json"), "--num-seqs", "2", "--output-len", "4:4", "--max-model-len", "100"]
    r = CliRunner().invoke(app, ["bench-offline", *TINY, *args, "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["workload"]["truncated_prompts"] == 1
    assert "1 of the 2 requests' prompts were too long for the context" in flat(r.output), r.output
