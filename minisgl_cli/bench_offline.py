"""`minisgl bench-offline`: throughput of one batch workload (nano-vllm's by default), optionally side by side
with Hugging Face transformers on the same weights and the same prompts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from minisgl_cli import options as o

ENGINES = ("minisgl", "transformers")


def register(app: typer.Typer) -> None:
    @app.command("bench-offline")
    def bench_offline(
        num_seqs: Annotated[int, typer.Option(help="number of requests", min=1)] = 256,
        input_len: Annotated[str, typer.Option(help="prompt length range A:B (uniform, inclusive)")] = "100:1024",
        output_len: Annotated[str, typer.Option(help="output length range A:B (uniform, inclusive)")] = "100:1024",
        seed: Annotated[int, typer.Option(help="seed of the workload draw and of the engines")] = 0,
        temperature: Annotated[float, typer.Option(help="sampling temperature (0: greedy)", min=0.0)] = 0.6,
        dataset: Annotated[
            Path | None,
            typer.Option(
                help="real prompts from a local .json/.jsonl/.parquet file (ShareGPT `conversations` or a text column)"
            ),
        ] = None,
        engine: Annotated[str, typer.Option(help="minisgl | transformers")] = "minisgl",
        compare: Annotated[
            bool, typer.Option("--compare", help="run minisgl, then transformers, and print the ratio")
        ] = False,
        peer_api: Annotated[
            str,
            typer.Option(
                help="transformers API: auto (generate_batch when the installed "
                "version has it) | generate_batch | generate"
            ),
        ] = "auto",
        peer_batch_size: Annotated[int, typer.Option(help="batch size of the padded `generate` fallback", min=1)] = 64,
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results to this JSON file")] = None,
        runs: Annotated[
            int,
            typer.Option(
                help="timed minisgl runs of the workload; the median is reported "
                "(a fresh GPU machine runs slower for its first ~30 s)",
                min=1,
            ),
        ] = 1,
        plot: Annotated[
            Path | None,
            typer.Option("--plot", help="PNG of the (median) minisgl run: batch size per step and tok/s over time"),
        ] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
        model: o.Model = None,
        device: o.Device = "auto",
        dtype: o.Dtype = "auto",
        page_size: o.PageSize = 16,
        num_pages: o.NumPages = None,
        kv_cache_gb: o.KvCacheGb = None,
        memory_fraction: o.MemoryFraction = 0.85,
        max_running_requests: o.MaxRunning = 256,
        max_batch_tokens: o.MaxBatchTokens = 8192,
        max_model_len: o.MaxModelLen = None,
        no_radix_cache: o.NoRadix = False,
        attention_backend: o.Backend = "auto",
        cuda_graph_max_bs: o.GraphBs = 256,
        no_overlap: o.NoOverlap = False,
        mixed_batch: o.MixedBatch = False,
        tp: o.Tp = 1,
    ) -> None:
        """Offline throughput: output tokens / wall time of one generate() after a warm-up.

        The default workload is the one nano-vllm and mini-sglang publish: 256 requests, seed 0, prompt and output
        lengths uniform in [100, 1024], random prompt ids in [0, 10000] (folded as id % vocab for models with a
        smaller vocabulary), temperature 0.6, ignore_eos: 133,966 output tokens."""
        flags = dict(locals())
        from rich.console import Console

        from minisgl_cli.report import command_flags, environment, write_json

        console = Console()
        engine = engine.lower()
        if engine not in ENGINES:
            raise typer.BadParameter(f"must be one of {', '.join(ENGINES)} (got {engine!r})", param_hint="--engine")
        if peer_api not in ("auto", "generate_batch", "generate"):
            raise typer.BadParameter("must be auto, generate_batch or generate", param_hint="--peer-api")
        if plot is not None:
            from minisgl_cli.plots import require_matplotlib

            require_matplotlib()
        config = o.engine_config(**flags)
        workload = _build_workload(config, num_seqs, input_len, output_len, seed, dataset)
        engines = list(ENGINES) if compare else [engine]
        results = []
        for name in engines:
            run = _run_minisgl if name == "minisgl" else _run_transformers
            results.append(
                run(
                    config,
                    workload,
                    temperature,
                    quiet,
                    peer_api=peer_api,
                    peer_batch_size=peer_batch_size,
                    repeats=runs,
                )
            )
        result: dict[str, Any] = dict(results[0])
        if len(results) == 2:
            result["peer"] = results[1]
            result["speedup"] = results[0]["output_throughput"] / max(results[1]["output_throughput"], 1e-9)
        result["workload"] = {
            "source": workload.source,
            "num_seqs": workload.num_seqs,
            "input_len": input_len,
            "output_len": output_len,
            "seed": seed,
            "temperature": temperature,
            "ignore_eos": True,
            "folded_ids": workload.folded_ids,
            "truncated_prompts": workload.truncated,
        }
        result["environment"] = environment()
        result["benchmark"] = "bench-offline"
        result["flags"] = command_flags(flags)
        steps = result.pop("_steps", None)
        for r in results:
            r.pop("_steps", None)
        console.print(_table(results, workload))
        if "speedup" in result:
            console.print(f"[bold]minisgl / transformers output throughput: {result['speedup']:.2f}x[/bold]")
        if json_path is not None:
            write_json(json_path, result)
            console.print(f"results written to {json_path}")
        if plot is not None and steps is not None:
            from minisgl_cli.plots import plot_steps

            title = f"bench-offline: {result['model']} on {result['device']}, {workload.num_seqs} requests"
            plot_steps(steps, plot, title)
            console.print(f"plot written to {plot}")


def _build_workload(config, num_seqs: int, input_len: str, output_len: str, seed: int, dataset: Path | None):
    from minisgl_cli.hf_peer import model_config_for, tokenizer_for
    from minisgl_cli.workload import dataset_workload, parse_range, random_workload

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
    longest = (0 if dataset else in_range[1]) + out_range[1]
    if longest > context:
        raise typer.BadParameter(
            f"the longest request ({longest} tokens) exceeds the model's context length "
            f"{context}: lower --input-len / --output-len"
        )
    if dataset is None:
        return random_workload(num_seqs, in_range, out_range, seed, mc.vocab_size)
    try:
        return dataset_workload(dataset, tokenizer_for(config.model).encode, num_seqs, out_range, seed, context)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--dataset") from e


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


def _add_floor(result: dict[str, Any], workload, mc, dtype, device, tp: int) -> None:
    import torch

    from minisgl_cli.roofline import gpu_floor

    floor = gpu_floor(
        [len(p) for p in workload.prompts],
        workload.output_lens,
        mc,
        torch.tensor([], dtype=dtype).element_size(),
        device,
        tp,
    )
    result["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    result["floor"] = floor.as_dict() if floor else None
    result["floor_fraction"] = result["output_throughput"] / floor.output_throughput if floor else None
    if floor and floor.seconds_uniform_routing:  # MoE: the same run against experts spread as uniform routing would
        uniform_tps = sum(workload.output_lens) / floor.seconds_uniform_routing
        result["floor_fraction_uniform_routing"] = result["output_throughput"] / uniform_tps


def _run_minisgl(config, workload, temperature: float, quiet: bool, repeats: int = 1, **_: Any) -> dict[str, Any]:
    from engine.sampling_params import SamplingParams
    from minisgl_cli.workload import random_workload

    t0 = time.perf_counter()
    # Tensor parallelism: under torchrun the follower ranks branch off right after this load (rank 0 goes on).
    llm = o.load_llm(config, quiet=quiet)
    startup = time.perf_counter() - t0
    vocab = llm.engine.model_cfg.vocab_size
    params = [SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True) for n in workload.output_lens]

    # Warm-up on other random prompts (so the timed run gets no radix-cache hits from it).
    t0 = time.perf_counter()
    warm = random_workload(min(workload.num_seqs, 4), (16, 64), (8, 8), seed=12345, vocab_size=vocab)
    llm.generate(warm.prompts, SamplingParams(max_tokens=8, temperature=temperature, ignore_eos=True))
    warmup = time.perf_counter() - t0

    before = llm.metrics()
    timed = []
    for i in range(repeats):
        llm.engine.clear_cache()  # every run starts cold, as the first does
        with _progress(quiet) as bar:
            task = bar.add_task(
                "minisgl" if repeats == 1 else f"minisgl run {i + 1}/{repeats}", total=workload.output_tokens
            )
            # B023: the lambda reads this iteration's task, and only runs within this iteration.
            on_output = _token_counter(lambda n: bar.update(task, completed=n))  # noqa: B023
            steps: list[tuple[float, int, int]] = []  # (time, requests, tokens) of every step, for --plot
            t0 = time.perf_counter()

            def on_step(outs, steps=steps, t0=t0) -> None:
                steps.append((time.perf_counter() - t0, len(outs), sum(len(o.delta_token_ids) for o in outs)))

            outs = llm.generate(workload.prompts, params, on_output=on_output, on_step=on_step)
            timed.append((time.perf_counter() - t0, outs, steps))
    after = llm.metrics()
    duration, outs, steps = sorted(timed, key=lambda t: t[0])[(repeats - 1) // 2]  # the median run (lower middle)
    ok = [out for out in outs if out.finish_reason in ("length", "stop")]
    result = _summary("minisgl", len(ok), workload.input_tokens, sum(len(out.token_ids) for out in ok), duration)
    result.update(
        failed=len(outs) - len(ok),
        **llm.describe(),
        startup_seconds=startup,
        warmup_seconds=warmup,
        preemptions=after.preemptions - before.preemptions,
        cache_hit_tokens=after.cache_hit_tokens - before.cache_hit_tokens,
        runs=[{"duration": d, "output_throughput": sum(len(o.token_ids) for o in os) / d} for d, os, _ in timed],
        engine_steps=len(steps),
        _steps=steps,
        startup_breakdown=_startup_breakdown(llm.engine),
    )
    _add_floor(result, workload, llm.engine.model_cfg, llm.engine.dtype, llm.engine.device, config.tp)
    del llm, outs
    _free_memory()
    return result


def _startup_breakdown(engine) -> dict[str, float]:
    """Seconds: model build + weights (`load`), then the runner: attention backend, FlashInfer's JIT compile on a
    machine's first use, CUDA-graph capture (also given apart)."""
    graphs = engine.runner.graphs
    return {**engine.startup_seconds, "graph_capture": graphs.capture_seconds if graphs else 0.0}


def _token_counter(show: Callable[[int], None]):
    """An on_output callback that counts tokens and refreshes the bar only now and then (a rich update per token
    would cost more than a decode step of a small model)."""
    state = {"tokens": 0, "calls": 0}

    def on_output(out) -> None:
        state["tokens"] += len(out.delta_token_ids)
        state["calls"] += 1
        if out.finished or state["calls"] % 512 == 0:
            show(state["tokens"])

    return on_output


def _run_transformers(
    config, workload, temperature: float, quiet: bool, peer_api: str = "auto", peer_batch_size: int = 64, **_: Any
) -> dict[str, Any]:
    import torch

    from minisgl_cli.hf_peer import load_hf_model, model_config_for, run_peer

    device, mc = config.torch_device(), model_config_for(config.model)
    dtype = config.torch_dtype(device)
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    with _progress(quiet) as bar:
        bar.add_task("loading transformers", total=None)
        model = load_hf_model(config.model, device, dtype)
    startup = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = [list(p[:32]) for p in workload.prompts[:2]]
    run_peer(model, warm, [8] * len(warm), temperature, peer_api, peer_batch_size)
    warmup = time.perf_counter() - t0
    with _progress(quiet) as bar:
        task = bar.add_task("transformers", total=workload.output_tokens)
        run = run_peer(
            model,
            workload.prompts,
            workload.output_lens,
            temperature,
            peer_api,
            peer_batch_size,
            on_done=lambda n: bar.advance(task, n),
        )
    result = _summary("transformers", len(run.output_lens), workload.input_tokens, sum(run.output_lens), run.duration)
    result.update(
        failed=0,
        api=run.api,
        model=mc.name or str(config.model),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        startup_seconds=startup,
        warmup_seconds=warmup,
    )
    _add_floor(result, workload, mc, dtype, device, 1)
    del model
    _free_memory()
    return result


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
    if any(r["failed"] for r in runs):
        rows.append(("failed", *(r["failed"] for r in runs)))
    names = [f"{r['engine']} ({r.get('api', r.get('attention', ''))})" for r in runs]
    title = (
        f"bench-offline: {runs[0]['model']} on {runs[0]['device']}, {workload.num_seqs} requests ({workload.source})"
    )
    return kv_table(title, rows, ("", *names))
