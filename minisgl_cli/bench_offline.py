"""`minisgl bench-offline`: throughput of one batch workload (nano-vllm's by default), optionally side by side
with peers (Hugging Face transformers, vLLM) on the same prompts.

`--compare transformers,vllm` runs each peer first, each as a child process `bench-offline --engine NAME --json
FILE` with the same flags (the vLLM one under `--vllm-env`, so that vLLM and the project's FlashInfer never share a
process or a PYTHONPATH), then minisgl in this process, and merges the children's JSON into one table and file."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from engine.config import EngineConfig
from minisgl_cli import options as o
from minisgl_cli.peers import PEER_ENGINE_FLAGS, PEERS

ENGINES = ("minisgl", *PEERS)
# The per-step token budget of an offline run, where every prompt is there at the start and no stream waits on a
# step: twice serve's, as vLLM's offline LLM class (16384) has twice its server's. On an H100, bench-offline's
# default workload ran 1.2% faster than at 8192 (median of 6 interleaved pairs, ahead in 5; docs/gpu.md).
OFFLINE_BATCH_TOKENS = 16384
# bench-offline's engine settings where they differ from the engine's defaults; the benchmarks/ scripts that time its
# workload build their engine with them too, so that they time what bench-offline runs
OFFLINE_ENGINE: dict[str, Any] = dict(
    max_batch_tokens=OFFLINE_BATCH_TOKENS,
    mixed_prefill_tokens=None,  # no stream waits on a step here
)
PEER_CHILD_ENV = "MINISGL_PEER_CHILD"  # set in the environment of the child a --compare run starts for each peer


class _BareCompare(o.PlainCommand):
    """`--compare` with no value (the next word is another flag, or none) keeps its old meaning: transformers.
    Typer has no optional option values, so the bare form is rewritten before parsing."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        args = [
            "--compare=transformers" if a == "--compare" and (i + 1 == len(args) or args[i + 1].startswith("-")) else a
            for i, a in enumerate(args)
        ]
        return super().parse_args(ctx, args)


def parse_peers(text: str) -> list[str]:
    """`--compare`'s list: peer names, comma separated, each once."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PEERS]
    if not names or bad:
        raise ValueError(
            f"must name peers among {', '.join(PEERS)}, comma separated (got {text!r}); minisgl always runs"
        )
    return list(dict.fromkeys(names))


def register(app: typer.Typer) -> None:
    @app.command("bench-offline", cls=_BareCompare)
    @o.with_engine_flags(**OFFLINE_ENGINE)
    def bench_offline(
        ctx: typer.Context,
        num_seqs: Annotated[int, typer.Option(help="number of requests", min=1)] = 256,
        input_len: Annotated[str, typer.Option(help="prompt length range A:B (uniform), or N")] = "100:1024",
        output_len: Annotated[str, typer.Option(help="output length range A:B (uniform), or N")] = "100:1024",
        seed: Annotated[int, typer.Option(help="seed of the workload draw and of the engines")] = 0,
        temperature: Annotated[float, typer.Option(help="sampling temperature (0: greedy)", min=0.0)] = 0.6,
        dataset: o.Dataset = None,
        dataset_column: o.DatasetColumn = None,
        engine: Annotated[str, typer.Option(help="minisgl | transformers | vllm")] = "minisgl",
        compare: Annotated[
            str | None,
            typer.Option(
                "--compare",
                help="peers to run on the same workload beside minisgl, each in a process of its own, "
                "e.g. transformers,vllm (bare --compare: transformers); prints minisgl's speed-up over each",
            ),
        ] = None,
        vllm_env: Annotated[
            Path | None,
            typer.Option(
                envvar="MINISGL_VLLM_ENV",
                help="shell script sourced before the vLLM peer's process starts "
                "(the GPU machine: /root/vllm-site/vllm-env.sh)",
            ),
        ] = None,
        peer_api: Annotated[
            str,
            typer.Option(
                help="transformers API: auto (generate_batch when the installed "
                "version has it) | generate_batch | generate"
            ),
        ] = "auto",
        peer_batch_size: Annotated[int, typer.Option(help="batch size of the padded `generate` fallback", min=1)] = 64,
        vllm_arg: o.VllmArgs = None,
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results to this JSON file")] = None,
        runs: Annotated[
            int,
            typer.Option(
                help="timed runs of the workload (minisgl and vLLM; transformers runs once); the median is "
                "reported (a fresh GPU machine runs slower for its first ~30 s)",
                min=1,
            ),
        ] = 1,
        plot: Annotated[
            Path | None,
            typer.Option("--plot", help="PNG of the (median) minisgl run: batch size per step and tok/s over time"),
        ] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
        **engine_flags: Any,
    ) -> None:
        """Offline throughput: output tokens / wall time of one generate() after a warm-up.

        The default workload is the one nano-vllm and mini-sglang publish: 256 requests, seed 0, prompt and output
        lengths uniform in [100, 1024], random prompt ids in [0, 10000] (folded as id % vocab for models with a
        smaller vocabulary), temperature 0.6, ignore_eos: 133,966 output tokens."""
        flags = dict(locals())
        flags.update(flags.pop("engine_flags"))
        del flags["ctx"]
        from rich.console import Console

        from minisgl_cli.report import INTERRUPTED_EXIT, check_outputs

        check_outputs(json=json_path, plot=plot)
        console = Console()
        engine, peers, config, overrides = _checked(ctx, flags)
        main_engine = "minisgl" if peers else engine
        try:
            workload = _build_workload(config, num_seqs, input_len, output_len, seed, dataset, dataset_column)
            # Peers first: one that cannot run fails in seconds, and each finds the GPU free (vLLM claims 90% of it).
            peer_results = [_run_child(name, ctx, workload, vllm_env if name == "vllm" else None) for name in peers]
            if main_engine == "minisgl":
                main = _run_minisgl(config, workload, temperature, quiet, repeats=runs)
            else:
                main = _run_peer(
                    engine, config, workload, temperature, quiet, runs, peer_api, peer_batch_size, overrides
                )
        except KeyboardInterrupt:
            # Ctrl-C before one timed run of the main engine finished (a run cut short after one has finished
            # returns the finished ones instead): its engine and any peer child are stopped by now.
            child = os.environ.get(PEER_CHILD_ENV) == "1"  # its --json is the parent's temporary file
            written = f"; nothing written to {json_path}" if json_path is not None and not child else ""
            console.print(
                f"[yellow]interrupted[/yellow] before a timed run of {main_engine} finished: no results{written}"
            )
            _exit(INTERRUPTED_EXIT)
        result = _result(main, peer_results, workload, flags)
        interrupted = main["completed_runs"] < main["planned_runs"]
        _report(console, result, [main, *peer_results], workload, flags)
        _exit(INTERRUPTED_EXIT if interrupted else 0)


def _checked(ctx: typer.Context, flags: dict[str, Any]) -> tuple[str, list[str], EngineConfig, dict[str, Any]]:
    """Every refusal of the command line before anything loads: the engine (lower-cased), the --compare peers, the
    engine config and the --vllm-arg overrides."""
    engine, compare, peer_api = flags["engine"].lower(), flags["compare"], flags["peer_api"]
    vllm_env, dataset, plot = flags["vllm_env"], flags["dataset"], flags["plot"]
    if engine not in ENGINES:
        raise typer.BadParameter(f"must be one of {', '.join(ENGINES)} (got {engine!r})", param_hint="--engine")
    if peer_api not in ("auto", "generate_batch", "generate"):
        raise typer.BadParameter("must be auto, generate_batch or generate", param_hint="--peer-api")
    try:
        peers = [] if compare is None else parse_peers(compare)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--compare") from e
    if peers and engine != "minisgl":
        raise typer.BadParameter(
            "--compare runs minisgl beside the peers it names: name them all there (e.g. --compare transformers,vllm)",
            param_hint="--engine",
        )
    engines = ["minisgl", *peers] if peers else [engine]
    unread = [unread_flags(e) for e in engines]
    o.refuse_each(ctx, {name: why for name, why in unread[0].items() if all(name in u for u in unread[1:])})
    if "vllm" not in peers:  # MINISGL_VLLM_ENV set for every shell is no error: only the flag given here is
        why = (
            "is sourced before the vLLM peer's own process (--compare vllm); --engine vllm runs vLLM in this "
            "one: source the script before the command"
            if engine == "vllm"
            else "is sourced before the vLLM peer's process: give --compare vllm"
        )
        o.refuse_given(ctx, why, "vllm_env")
    if dataset is not None:
        o.refuse_given(ctx, "draws random prompts' lengths, and --dataset prompts have their own", "input_len")
    else:
        o.refuse_given(ctx, "names the --dataset file's prompt column, and there is no --dataset", "dataset_column")
    if "transformers" in engines and o.given(ctx, "peer_batch_size"):
        from minisgl_cli.hf_peer import batches_continuously

        if batches_continuously(peer_api):
            raise typer.BadParameter(
                "sizes the padded `generate` batches, and the transformers peer batches continuously here "
                "(generate_batch): give --peer-api generate",
                param_hint="--peer-batch-size",
            )
    if peers and flags["tp"] > 1:
        raise typer.BadParameter(
            "--compare runs with --tp 1 (each torchrun rank would start the peers): run `--engine vllm --tp N` "
            "apart and set the JSON files side by side with bench-compare",
            param_hint="--compare",
        )
    kv_cache_dtype = flags["kv_cache_dtype"]
    if kv_cache_dtype != "auto" and "transformers" in [engine, *peers]:  # checked again where the peer loads
        hint = "--engine" if engine == "transformers" else "--compare"
        raise typer.BadParameter(f"the transformers peer has no {kv_cache_dtype} KV cache", param_hint=hint)
    overrides = o.vllm_args(flags["vllm_arg"])
    if "vllm" in peers and vllm_env is not None and not vllm_env.is_file():
        raise typer.BadParameter(f"{vllm_env} is not a file", param_hint="--vllm-env")
    if "vllm" in peers and vllm_env is None:
        import importlib.util

        from minisgl_cli.vllm_peer import missing

        # The child would have this environment: fail now rather than after it imports torch. vLLM itself is
        # never imported in this process.
        if importlib.util.find_spec("vllm") is None:
            raise typer.BadParameter(missing("no module named 'vllm'"), param_hint="--compare")
    if plot is not None:
        from minisgl_cli.plots import require_matplotlib

        require_matplotlib()
    config = o.engine_config(**flags)
    if "minisgl" in engines:
        o.refuse_unread_engine_flags(ctx, config)
    return engine, peers, config, overrides


def _result(
    main: dict[str, Any], peer_results: list[dict[str, Any]], workload, flags: dict[str, Any]
) -> dict[str, Any]:
    """The JSON: the main engine's figures, each peer's and minisgl's speed-up over it, the workload, the
    environment and the flags."""
    from minisgl_cli.report import command_flags, environment, interrupted_fields

    result: dict[str, Any] = dict(main)
    result.update(interrupted_fields(main["completed_runs"] < main["planned_runs"]))
    if peer_results:
        speedups = {p["engine"]: main["output_throughput"] / max(p["output_throughput"], 1e-9) for p in peer_results}
        # `peer` and `speedup` (the first peer) as before the list, for the files and scripts that read them
        first = peer_results[0]["engine"]
        result.update(peers=peer_results, speedups=speedups, peer=peer_results[0], speedup=speedups[first])
    result["workload"] = {
        "source": workload.source,
        "num_seqs": workload.num_seqs,
        "input_len": None if flags["dataset"] else flags["input_len"],  # a dataset's prompts have their own
        "output_len": flags["output_len"],
        "seed": flags["seed"],
        "temperature": flags["temperature"],
        "ignore_eos": True,
        "folded_ids": workload.folded_ids,
        "truncated_prompts": workload.truncated,
        "repeated_prompts": workload.repeated,
        "skipped_rows": workload.skipped_rows,  # a dataset's rows with an empty prompt, passed over
        "dataset_column": workload.column,  # the dataset's prompt column: --dataset-column or the file's
        "digest": workload_digest(workload),
    }
    result["environment"] = environment()
    result["benchmark"] = "bench-offline"
    result["flags"] = command_flags(flags)
    return result


def _report(console, result: dict[str, Any], results: list[dict[str, Any]], workload, flags: dict[str, Any]) -> None:
    """The table, notes and speed-ups on the terminal; the JSON and the plot where asked for."""
    from minisgl_cli.report import interrupted_note, write_json

    main = results[0]
    steps = result.pop("_steps", None)
    for r in results:
        r.pop("_steps", None)
    if os.environ.get(PEER_CHILD_ENV) == "1":  # a --compare peer: its parent shows every table and writes the files
        if flags["json_path"] is not None:  # (its table showed twice, and "results written to" a deleted file)
            write_json(flags["json_path"], result)
        return
    console.print(_table(results, workload))
    if workload.skipped:
        console.print(f"[yellow]note:[/yellow] {workload.skipped} (workload.skipped_rows)")
    if workload.repeated:
        console.print(
            f"[yellow]note:[/yellow] {workload.source} holds {workload.num_seqs - workload.repeated:,} non-empty "
            f"prompts: {workload.repeated:,} of the {workload.num_seqs:,} requests were given one again (as vLLM's "
            "benchmarks oversample), and a prefix cache keeps what an earlier request of the same prompt computed"
        )
    if workload.truncated:  # only the JSON said so: the table's input tokens were fewer than the file's
        console.print(
            f"[yellow]note:[/yellow] {workload.truncated:,} of the {workload.num_seqs:,} requests' prompts were too "
            "long for the context beside their output length and keep only their first tokens "
            "(workload.truncated_prompts)"
        )
    for r in results:
        if r.get("settings"):
            console.print(f"{r['engine']} settings: " + ", ".join(f"{k} {v}" for k, v in r["settings"].items()))
    for name, x in result.get("speedups", {}).items():
        console.print(f"[bold]minisgl / {name} output throughput: {x:.2f}x[/bold]")
    if main["completed_runs"] < main["planned_runs"]:
        note = " (the run in progress is not counted; the figures are the median of those that finished)"
        console.print(interrupted_note(main["completed_runs"], main["planned_runs"], "timed runs", note))
    if flags["json_path"] is not None:
        write_json(flags["json_path"], result)
        console.print(f"results written to {flags['json_path']}")
    if flags["plot"] is not None and steps is not None:
        from minisgl_cli.plots import plot_steps

        title = f"bench-offline: {result['model']} on {result['device']}, {workload.num_seqs} requests"
        plot_steps(steps, flags["plot"], title)
        console.print(f"plot written to {flags['plot']}")


def _exit(code: int) -> NoReturn:
    """End the command with `code`. A peer child is done once its JSON is written (or, interrupted, once its engine
    is closed): vLLM's engine-core process can hold up a normal exit."""
    if os.environ.get(PEER_CHILD_ENV) == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def _build_workload(
    config: EngineConfig,
    num_seqs: int,
    input_len: str,
    output_len: str,
    seed: int,
    dataset: Path | None,
    column: str | None = None,
):
    from engine.tokenizer import load_tokenizer
    from engine.weights import model_config_for
    from minisgl_cli.workload import ColumnError, dataset_workload, parse_range, random_workload

    try:
        in_range = parse_range(input_len, "--input-len")
        out_range = parse_range(output_len, "--output-len")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    try:
        mc = model_config_for(config.model)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="--model") from e
    context = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
    # a dataset's prompt cut to fit keeps at least its first token: an --output-len of the whole context left it
    # none, and the engine refused the request with a traceback (prompt (1 tokens) + max_tokens (64) = 65 ...)
    longest = (1 if dataset else in_range[1]) + out_range[1]
    if longest > context:
        lower = "--output-len (a dataset's prompt keeps at least 1 token)" if dataset else "--input-len / --output-len"
        raise typer.BadParameter(
            f"the longest request ({longest} tokens) exceeds the model's context length {context}: lower {lower}"
        )
    if dataset is None:
        return random_workload(num_seqs, in_range, out_range, seed, mc.vocab_size)
    try:
        encode = load_tokenizer(config.model).encode
        return dataset_workload(dataset, encode, num_seqs, out_range, seed, context, column=column)
    except ValueError as e:
        raise typer.BadParameter(
            str(e), param_hint="--dataset-column" if isinstance(e, ColumnError) else "--dataset"
        ) from e


def _progress(quiet: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=quiet,
    )


def _summary(engine: str, n: int, input_tokens: int, output_tokens: int, duration: float) -> dict[str, Any]:
    """vLLM/SGLang field names."""
    return {
        "engine": engine,
        "completed": n,
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": n / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }


def _add_floor(result: dict[str, Any], workload, mc, dtype, kv_dtype, device, tp: int) -> None:
    """The bandwidth floor of the run as configured: an fp8 KV cache moves half the KV bytes."""
    import torch

    from minisgl_cli.roofline import gpu_floor

    lens = [len(p) for p in workload.prompts]
    floor = gpu_floor(lens, workload.output_lens, mc, dtype.itemsize, device, tp, kv_dtype.itemsize)
    result["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    result["floor"] = floor.as_dict() if floor else None
    result["floor_fraction"] = result["output_throughput"] / floor.output_throughput if floor else None
    if floor and floor.seconds_uniform_routing:  # MoE: the same run against experts spread as uniform routing would
        uniform_tps = sum(workload.output_lens) / floor.seconds_uniform_routing
        result["floor_fraction_uniform_routing"] = result["output_throughput"] / uniform_tps


def _run_minisgl(
    config: EngineConfig, workload, temperature: float, quiet: bool, repeats: int = 1, **_: Any
) -> dict[str, Any]:
    """Start-up, a warm-up, then `repeats` timed runs, the median reported. Ctrl-C after a timed run has finished
    ends the runs there and reports those that finished (`completed_runs` < `planned_runs`); before that it
    propagates."""
    from engine.sampling_params import SamplingParams
    from minisgl_cli.gpu_busy import GpuBusy
    from minisgl_cli.workload import warmup_like

    t0 = time.perf_counter()
    # Tensor parallelism: under torchrun the follower ranks branch off right after this load (rank 0 goes on).
    llm = o.load_llm(config, quiet=quiet)
    try:
        startup = time.perf_counter() - t0
        vocab = llm.engine.model_cfg.vocab_size

        # Token ids only, as the peers run (vLLM with skip_tokenizer_init): the benchmark counts tokens, not text.
        def params_for(lens: list[int]) -> list[SamplingParams]:
            return [
                SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True, detokenize=False) for n in lens
            ]

        params = params_for(workload.output_lens)

        # Warm-up on other random prompts of the same lengths (the timed run gets no radix-cache hits from it).
        t0 = time.perf_counter()
        warm = warmup_like(workload, vocab)
        llm.generate(warm.prompts, params_for(warm.output_lens), use_tqdm=False)
        warmup = time.perf_counter() - t0

        timed = []
        try:
            for i in range(repeats):
                # Every run starts cold, as the first does, and the cache is dropped now, outside the timed
                # generate() (as the vLLM peer's reset_prefix_cache): engine.clear_cache() would leave it to the
                # run's first step, and generate() finding that command pending adds every prompt before its first
                # step instead of as the steps need them (ADD_AS_NEEDED).
                llm.reset_prefix_cache()
                label = "minisgl" if repeats == 1 else f"minisgl run {i + 1}/{repeats}"
                with _progress(quiet) as bar:
                    task = bar.add_task(label, total=workload.output_tokens)
                    steps: list[tuple[float, int, int]] = []  # (time, requests, tokens) of every step, for --plot
                    before = llm.metrics()
                    with GpuBusy(llm.engine.device) as busy:  # NVML's set-up and last read outside the timed call
                        t0 = time.perf_counter()

                        # Counts per step, no outputs for running requests (the GPU waits on the host at small
                        # batches).
                        def on_progress(requests: int, tokens: int, steps=steps, t0=t0, bar=bar, task=task) -> None:
                            steps.append((time.perf_counter() - t0, requests, tokens))
                            if len(steps) % 32 == 0:  # a rich refresh per step costs more than a small model's step
                                bar.update(task, completed=sum(n for _, _, n in steps))

                        outs = llm.generate(workload.prompts, params, on_progress=on_progress, use_tqdm=False)
                        duration = time.perf_counter() - t0
                    after = llm.metrics()  # this run's own counters (the others' are not added in)
                    counters = {
                        "preemptions": after.preemptions - before.preemptions,
                        "cache_hit_tokens": after.cache_hit_tokens - before.cache_hit_tokens,
                    }
                    timed.append((duration, outs, steps, busy.share, counters))
                _run_done(label, timed[-1][0], sum(len(out.token_ids) for out in outs), repeats, quiet)
        except KeyboardInterrupt:
            if not timed:
                raise
        middle = sorted(timed, key=lambda t: t[0])[(len(timed) - 1) // 2]  # the lower middle run's outputs and steps
        outs, steps, gpu_busy, counters = middle[1], middle[2], middle[3], middle[4]
        duration = statistics.median(t[0] for t in timed)  # the median: with an even count, the middle two's mean
        ok = [out for out in outs if out.finish_reason in ("length", "stop")]
        result = _summary("minisgl", len(ok), workload.input_tokens, sum(len(out.token_ids) for out in ok), duration)
        result.update(
            failed=len(outs) - len(ok),
            **llm.describe(),
            startup_seconds=startup,
            warmup_seconds=warmup,
            **counters,  # the middle run's, as its duration and outputs
            gpu_busy=gpu_busy,
            runs=[
                {"duration": d, "output_throughput": sum(len(o.token_ids) for o in os) / d, "gpu_busy": busy, **c}
                for d, os, _, busy, c in timed
            ],
            completed_runs=len(timed),
            planned_runs=repeats,
            engine_steps=len(steps),
            _steps=steps,
            startup_breakdown=_startup_breakdown(llm.engine),
        )
        e = llm.engine
        _add_floor(result, workload, e.model_cfg, e.dtype, e.kv_dtype, e.device, config.tp)
    finally:
        # The engine holds no process or thread of its own on one GPU (under --tp, load_llm's atexit releases the
        # follower ranks): its memory goes back now, however the runs ended.
        del llm
        _free_memory()
    return result


def _run_done(label: str, duration: float, tokens: int, repeats: int, quiet: bool) -> None:
    """One line per finished timed run of several (on stderr, as the progress bars): what Ctrl-C would keep."""
    if repeats > 1 and not quiet:
        from rich.console import Console

        Console(stderr=True).print(f"{label} finished: {duration:.2f} s, {tokens / duration:,.1f} output tok/s")


def _startup_breakdown(engine) -> dict[str, float]:
    """Seconds: model build + weights (`load`), then the runner: attention backend, FlashInfer's JIT compile on a
    machine's first use, CUDA-graph capture (also given apart)."""
    return {**engine.startup_seconds, "graph_capture": engine.runner.graph_capture_seconds}


def _run_peer(
    name: str,
    config,
    workload,
    temperature: float,
    quiet: bool,
    repeats: int = 1,
    peer_api: str = "auto",
    peer_batch_size: int = 64,
    vllm_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A peer in this process, timed as `_run_minisgl` times minisgl: start-up apart, a warm-up on other prompts,
    then `repeats` timed passes over the workload (transformers: one, it is ~40x slower), the median reported."""
    from engine.weights import model_config_for
    from minisgl_cli.gpu_busy import GpuBusy
    from minisgl_cli.peers import PeerUnavailable, open_peer
    from minisgl_cli.workload import warmup_like

    repeats = 1 if name == "transformers" else repeats
    t0 = time.perf_counter()
    try:
        with _progress(quiet) as bar:
            bar.add_task(f"loading {name}", total=None)
            peer = open_peer(name, config, peer_api, peer_batch_size, vllm_args, quiet)
    except PeerUnavailable as e:
        raise typer.BadParameter(str(e), param_hint="--engine") from e
    try:
        startup = time.perf_counter() - t0
        device, mc = config.torch_device(), model_config_for(config.model)
        t0 = time.perf_counter()
        warm = warmup_like(workload, mc.vocab_size)
        n = 4 if name == "transformers" else warm.num_seqs  # ~40x slower: a few prompts warm it enough
        peer.generate(warm.prompts[:n], warm.output_lens[:n], temperature)
        warmup = time.perf_counter() - t0
        timed: list[tuple[Any, float | None]] = []  # (PeerRun, GPU busy share) of each finished run
        try:
            for i in range(repeats):
                label = name if repeats == 1 else f"{name} run {i + 1}/{repeats}"
                with _progress(quiet) as bar:
                    task = bar.add_task(label, total=workload.output_tokens)
                    # B023: the lambda reads this iteration's task, and only runs within this iteration.
                    on_done = lambda n: bar.advance(task, n)  # noqa: B023, E731
                    with GpuBusy(device) as busy:
                        done = peer.generate(workload.prompts, workload.output_lens, temperature, on_done)
                    timed.append((done, busy.share))
                _run_done(label, done.duration, sum(done.output_lens), repeats, quiet)
        except KeyboardInterrupt:  # as in _run_minisgl: the finished runs are the result, if there are any
            if not timed:
                raise
        run, gpu_busy = sorted(timed, key=lambda t: t[0].duration)[(len(timed) - 1) // 2]  # lower middle's counts
        duration = statistics.median(t[0].duration for t in timed)  # as minisgl's: the middle two's mean if even
        result = _summary(name, len(run.output_lens), workload.input_tokens, sum(run.output_lens), duration)
        result.update(
            failed=run.failed,
            **peer.describe(),
            startup_seconds=startup,
            warmup_seconds=warmup,
            gpu_busy=gpu_busy,
            runs=[
                {"duration": r.duration, "output_throughput": sum(r.output_lens) / r.duration, "gpu_busy": b}
                for r, b in timed
            ],
            completed_runs=len(timed),
            planned_runs=repeats,
        )
        dtype = config.torch_dtype(device)
        _add_floor(result, workload, mc, dtype, config.torch_kv_dtype(dtype), device, config.tp)
    finally:
        peer.close()  # vLLM's engine core is a process of its own: it ends here, however the runs ended
        _free_memory()
    return result


def workload_digest(workload) -> str:
    """A short hash of the prompts and output lengths: a peer child's run must be on the very same workload."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps([workload.prompts, workload.output_lens]).encode()).hexdigest()[:16]


def unread_flags(engine: str) -> dict[str, str]:
    """The parameters that a run of `engine` alone does not read, each with what its refusal says; a peer child is
    given none of them."""
    for_transformers = "is for the transformers peer: give --engine transformers or --compare transformers"
    for_vllm = "is for the vLLM peer: give --engine vllm or --compare vllm"
    if engine == "minisgl":
        return {"peer_api": for_transformers, "peer_batch_size": for_transformers, "vllm_arg": for_vllm}
    ours = f"for minisgl's engine, which --engine {engine} does not run" + (
        " (vLLM's own settings: --vllm-arg KEY=VALUE)" if engine == "vllm" else ""
    )
    out = {name: ours for name in o.ENGINE_FLAG_NAMES if name not in PEER_ENGINE_FLAGS[engine]}
    out["plot"] = f"draws minisgl's engine steps, and --engine {engine} runs no minisgl"
    if engine == "transformers":
        out.update(vllm_arg=for_vllm, runs="times minisgl's and vLLM's runs; transformers runs once (~40x slower)")
    else:
        out.update(peer_api=for_transformers, peer_batch_size=for_transformers)
    return out


def _given_flags(ctx: typer.Context, name: str) -> list[str]:
    """This command's flags that differ from their defaults, for the child of the peer `name` (which has the same
    defaults and environment), without those only the parent acts on and those the peer does not read."""
    from typer.core import TyperOption

    skip = {"compare", "engine", "json_path", "plot", "vllm_env", *unread_flags(name)}
    args: list[str] = []
    for p in ctx.command.params:
        if p.name in skip or not isinstance(p, TyperOption):
            continue
        value = ctx.params[p.name or ""]
        if value == p.default:
            continue
        if p.is_flag:
            args += [p.opts[0]] if value else p.secondary_opts[:1]
        elif isinstance(value, (list, tuple)):  # a repeatable option, once per value
            args += [a for v in value for a in (p.opts[0], str(v))]
        else:
            args += [p.opts[0], str(value)]
    return args


def _run_child(name: str, ctx: typer.Context, workload, env_script: Path | None) -> dict[str, Any]:
    """`bench-offline --engine NAME` with this command's flags in a process of its own (after `source env_script`
    when given); its JSON, checked to be of the same workload. Its own output (progress, its table, errors) shows
    as it runs."""
    import json
    import shlex
    import subprocess
    import tempfile

    from rich.console import Console

    from minisgl_cli.report import INTERRUPTED_EXIT

    with tempfile.TemporaryDirectory(prefix="minisgl-peer-") as tmp:
        out = Path(tmp) / f"{name}.json"
        cmd = [sys.executable, "-m", "minisgl_cli", "bench-offline", *_given_flags(ctx, name), "--engine", name]
        cmd += ["--json", str(out)]
        if env_script is not None:
            # $0 is "bash", not the script: vllm-env.sh tells "sourced" from "run" by BASH_SOURCE[0] == $0
            cmd = ["bash", "-c", 'source "$1" && shift && exec "$@"', "bash", str(env_script), *cmd]
        Console(stderr=True).print(f"[bold]{name}[/bold] in a process of its own: {shlex.join(cmd)}")
        # A process group of its own: a Ctrl-C at the terminal reaches this process alone, which stops the child
        # (and whatever it started, vLLM's engine core) once, and waits for it.
        env = {**os.environ, PEER_CHILD_ENV: "1"}
        child = subprocess.Popen(cmd, env=env, process_group=0)
        try:
            rc = child.wait()
        except KeyboardInterrupt:
            _stop_child(name, child)
            raise
        if rc == INTERRUPTED_EXIT:  # the child alone was sent a Ctrl-C: the run stops as if this one had been
            raise KeyboardInterrupt
        if rc != 0 or not out.is_file():
            Console(stderr=True).print(
                f"[red]bench-offline: the {name} peer failed (exit status {rc}); its messages are above[/red]"
            )
            raise typer.Exit(2 if rc == 2 else 1)
        data: dict[str, Any] = json.loads(out.read_text())
    if data.get("workload", {}).get("digest") != workload_digest(workload):
        raise RuntimeError(f"the {name} peer ran another workload than this process drew (a bug)")
    for key in ("workload", "flags", "benchmark"):
        data.pop(key, None)
    return data


def _stop_child(name: str, child, grace: float = 30.0) -> None:
    """Ctrl-C for a peer child and the processes it started (its process group): it closes its engine and exits;
    after `grace` seconds, or at a second Ctrl-C, they are killed. Nothing of the group is left running."""
    import signal
    import subprocess

    from rich.console import Console

    Console(stderr=True).print(f"stopping the {name} peer (Ctrl-C again to kill it)")
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    finally:  # also at a second Ctrl-C
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # what is left of the group: the child, or what it started
        child.wait()


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _table(runs: list[dict[str, Any]], workload):
    from minisgl_cli.report import kv_table

    rows = [
        ("requests", *(r["completed"] for r in runs)),
        ("input tokens", *(r["total_input_tokens"] for r in runs)),
        ("output tokens", *(r["total_output_tokens"] for r in runs)),
        ("wall time (s)", *(r["duration"] for r in runs)),
        ("requests/s", *(r["request_throughput"] for r in runs)),
        ("output tok/s", *(r["output_throughput"] for r in runs)),
        ("total tok/s", *(r["total_token_throughput"] for r in runs)),
        ("startup (s)", *(r["startup_seconds"] for r in runs)),
    ]
    if any(r["floor"] for r in runs):
        rows.append(("floor tok/s (bandwidth)", *((r["floor"] or {}).get("output_throughput") for r in runs)))
        rows.append(("fraction of floor", *(r["floor_fraction"] for r in runs)))
    if any(r.get("floor_fraction_uniform_routing") for r in runs):  # MoE (minisgl_cli/roofline.py)
        rows.append(("fraction, uniform routing", *(r.get("floor_fraction_uniform_routing") for r in runs)))
    if any(r.get("gpu_busy") is not None for r in runs):  # NVML's utilization samples (minisgl_cli/gpu_busy.py)
        rows.append(("GPU busy", *(f"{r['gpu_busy']:.1%}" if r.get("gpu_busy") is not None else None for r in runs)))
    if any(r["failed"] for r in runs):
        rows.append(("failed", *(r["failed"] for r in runs)))
    names = [f"{r['engine']} ({r.get('api', r.get('attention', ''))})" for r in runs]
    title = (
        f"bench-offline: {runs[0]['model']} on {runs[0]['device']}, {workload.num_seqs} requests ({workload.source})"
    )
    return kv_table(title, rows, ("", *names))
