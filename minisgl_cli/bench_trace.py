"""`minisgl bench-trace`: replay a Qwen/Bailian or Mooncake request trace with its arrival times and its
prefix sharing, in-process or against an OpenAI-compatible URL; report latency percentiles and cache hits."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.config import EngineConfig
from minisgl_cli import options as o
from minisgl_cli.peers import PEER_ENGINE_FLAGS

ENGINES = ("minisgl", "vllm")


@dataclass(slots=True)
class Plan:
    """The replay after scaling and clamping, with the trace's own cache-hit upper bound."""

    trace: Any  # trace_reader.Trace (the effective one: scaled/clamped lengths)
    items: TraceItems
    clamped: int
    upper_bound: float | None
    context: int  # the longest prompt + output the replay allowed (the model's context, or its KV pool)
    scaled_tokens: tuple[int, int]  # the window's input and output tokens after --length-scale, before clamping


@dataclass(slots=True)
class TraceItems:
    """The replay's requests as replay.ReplayItems, each prompt synthesized as the driver takes it (replay.drive's
    look-ahead), not all before the first is sent: a long trace's prompts do not fit in memory at once."""

    trace: Any  # trace_reader.Trace, the effective one
    synth: Any  # trace_reader.PromptSynth
    time_scale: float

    def __len__(self) -> int:
        return len(self.trace.requests)

    def __iter__(self) -> Iterator:
        from minisgl_cli.replay import ReplayItem

        for r in self.trace.requests:
            prompt = self.synth.prompt(r.hash_ids, r.input_length, r.index)
            yield ReplayItem(r.index, r.line, r.timestamp * self.time_scale, prompt, r.output_length)


def register(app: typer.Typer) -> None:
    @app.command(
        "bench-trace",
        short_help="Replay a request trace in real time: TTFT, TBT, TPOT, E2E, throughput, prefix-cache hits.",
    )
    @o.with_engine_flags()
    def bench_trace(
        ctx: typer.Context,
        trace: Annotated[Path, typer.Argument(help="JSONL trace (Qwen/Bailian or Mooncake format)")],
        format: Annotated[str, typer.Option("--format", help="auto | qwen | mooncake")] = "auto",
        block_size: Annotated[
            int | None, typer.Option(help="tokens per hash_ids block (default: 16 for qwen, 512 for mooncake)", min=1)
        ] = None,
        time_scale: Annotated[
            float, typer.Option(help="multiply arrival times by this (0.5: twice as fast, 0: all at once)", min=0.0)
        ] = 1.0,
        num_requests: Annotated[int | None, typer.Option(help="replay at most this many requests", min=1)] = None,
        start: Annotated[int, typer.Option(help="first request to replay (index among good lines)", min=0)] = 0,
        skip_bad_lines: Annotated[
            bool,
            typer.Option("--skip-bad-lines", help="skip (and count) bad lines instead of stopping at the first one"),
        ] = False,
        length_scale: Annotated[
            float,
            typer.Option(
                help="multiply input lengths, output lengths and the block "
                "size by this (e.g. 1/64 to fit a long trace into a small "
                "model; prefix sharing is kept)",
                min=1e-6,
                max=1e6,
            ),
        ] = 1.0,
        max_input_len: Annotated[int | None, typer.Option(help="clamp prompts to this many tokens", min=1)] = None,
        max_output_len: Annotated[int | None, typer.Option(help="clamp outputs to this many tokens", min=1)] = None,
        temperature: Annotated[float, typer.Option(help="sampling temperature (0: greedy)", min=0.0)] = 0.0,
        seed: Annotated[int, typer.Option(help="seed of the synthesized prompt tokens and of the engine")] = 0,
        url: Annotated[
            str | None,
            typer.Option(
                help="replay against this OpenAI-compatible server (e.g. http://127.0.0.1:8000) instead of in-process"
            ),
        ] = None,
        served_model: o.ServedModel = None,
        api_key: o.ApiKey = None,
        vocab_size: Annotated[
            int | None,
            # numpy draws int64 ids: 1e20 passed here and was a traceback once the model had loaded
            typer.Option(help="prompt token ids stay below this (default: the --model's vocabulary)", min=2, max=2**63),
        ] = None,
        request_timeout: o.RequestTimeout = 600.0,
        no_client_check: Annotated[
            bool,
            typer.Option(
                "--no-client-check",
                help="with --url, skip measuring the client's absorption rate (about a second) before the run",
            ),
        ] = False,
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results to this JSON file")] = None,
        save_detailed: Annotated[
            bool, typer.Option("--save-detailed", help="also store every request's inter-token gaps in the JSON")
        ] = False,
        plot: Annotated[
            Path | None, typer.Option("--plot", help="draw per-request TTFT and TBT over time to this PNG (matplotlib)")
        ] = None,
        step_log: Annotated[
            Path | None,
            typer.Option(
                help="in-process: write one JSON line per engine step (time, decode rows, prefill rows and tokens, "
                "KV tokens read, the engine's CPU times) to this file"
            ),
        ] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="no progress view")] = False,
        engine: Annotated[
            str,
            typer.Option(
                help="in-process engine: minisgl, or vllm (its AsyncLLM, what `vllm serve` runs; needs vLLM to "
                "import here, e.g. after `source /root/vllm-site/vllm-env.sh` on the GPU machine)"
            ),
        ] = "minisgl",
        vllm_arg: o.VllmArgs = None,
        token_stream: Annotated[
            bool,
            typer.Option(
                "--token-stream/--no-token-stream",
                help="in-process: the replay client receives each token as it is made (default: each request's "
                "finished output, as the engine's token times are taken in the engine either way; a client woken per "
                "token and request shares the engine's interpreter lock and slowed it by 10%, docs/scheduling.md)",
            ),
        ] = False,
        **engine_flags: Any,
    ) -> None:
        """Replay a request trace in real time (scaled by --time-scale) and report TTFT, TBT (inter-token gap),
        TPOT and end-to-end latency (mean, p50, p90, p99, max), throughput, and the prefix-cache hit rate beside
        the trace's own upper bound. Prompts are synthesized from hash_ids: the same id gives the same block of
        tokens, every prompt has exactly input_length tokens, every output is forced to output_length
        (ignore_eos); lengths that do not fit the model's context are clamped and counted."""
        flags = dict(locals())
        flags.update(flags.pop("engine_flags"))
        flags.pop("api_key")  # a secret: never in the JSON's flags
        del flags["ctx"]
        from rich.console import Console

        from minisgl_cli.report import (
            INTERRUPTED_EXIT,
            check_outputs,
            command_flags,
            environment,
            interrupted_note,
            write_json,
        )
        from minisgl_cli.trace_reader import FORMATS, TraceError, read_trace

        check_outputs(json=json_path, plot=plot, step_log=step_log)
        for flag, out in (("--json", json_path), ("--plot", plot), ("--step-log", step_log)):
            if out is not None and out.resolve() == trace.resolve():  # the results would replace the trace itself
                raise typer.BadParameter(f"{out} is the TRACE being replayed; give another file", param_hint=flag)
        if json_path is None:
            o.refuse_given(ctx, "is written to the --json file, and there is no --json", "save_detailed")
        console = Console()
        config = o.engine_config(**flags)
        engine = engine.lower()
        if engine not in ENGINES:
            raise typer.BadParameter(f"must be one of {', '.join(ENGINES)} (got {engine!r})", param_hint="--engine")
        if engine != "minisgl" and url is not None:
            raise typer.BadParameter("picks the in-process engine: it does not go with --url", param_hint="--engine")
        flags["vllm_args"] = o.vllm_args(vllm_arg)
        if flags["vllm_args"] and engine != "vllm":
            raise typer.BadParameter("is for --engine vllm", param_hint="--vllm-arg")
        reads_model = vocab_size is None or config.max_model_len is None  # _run_url's vocabulary and context
        o.refuse_by_url(ctx, url, reads_model, ("api_key", "served_model", "request_timeout", "no_client_check"))
        if engine == "vllm":
            why = "for minisgl's engine, which --engine vllm does not run (vLLM's own settings: --vllm-arg KEY=VALUE)"
            o.refuse_engine_flags(ctx, why, PEER_ENGINE_FLAGS["vllm"])
        if url is None and engine == "minisgl":
            o.refuse_unread_engine_flags(ctx, config)
        if url is not None or engine != "minisgl":
            not_here = "it does not go with --url or --engine vllm"
            o.refuse_each(
                ctx,
                {
                    "step_log": f"records the in-process minisgl engine's steps: {not_here}",
                    "token_stream": f"sets how the in-process minisgl engine hands out tokens: {not_here}",
                },
            )
        if format not in ("auto", *FORMATS):  # the flag's fault, not the trace's (read_trace would say TRACE)
            raise typer.BadParameter(f"choose auto, {', '.join(FORMATS)} (got {format!r})", param_hint="--format")
        try:
            full = read_trace(trace, format, block_size, skip_bad_lines)
        except TraceError as e:
            raise typer.BadParameter(str(e), param_hint="TRACE") from e
        window = full.window(start, num_requests)
        if not window.requests:
            raise typer.BadParameter(f"the trace has {len(full.requests)} requests; --start {start} is past them")
        if num_requests is not None and len(window.requests) < num_requests:  # the run came out short, unsaid
            console.print(
                f"[yellow]note:[/yellow] the trace has {len(full.requests):,} requests: --start {start} "
                f"--num-requests {num_requests:,} replays the last {len(window.requests):,}"
            )
        if plot is not None:
            from minisgl_cli.plots import require_matplotlib

            require_matplotlib()
        if engine == "vllm":
            result, results = _run_vllm(config, window, flags, quiet)
        elif url is None:
            result, results = _run_local(config, window, flags, quiet)
        else:
            result, results = _run_url(config, window, flags, quiet, api_key, bool(o.given(ctx, "model")))
        result.update(
            benchmark="bench-trace",
            trace=str(trace),
            format=full.format,
            trace_block_size=full.block_size,
            skipped_lines=len(full.skipped),
            skipped=[{"line": n, "error": e} for n, e in full.skipped[:20]],
            time_scale=time_scale,
            length_scale=length_scale,
            start=start,
            seed=seed,
            temperature=temperature,
            environment=environment(),
            flags=command_flags(flags),
        )
        console.print(_table(result))
        if result["clamped_requests"]:
            r = result
            console.print(
                f"[yellow]note:[/yellow] {r['clamped_requests']:,} of {r['planned_requests']:,} requests were clamped "
                f"(--max-input-len / --max-output-len, or a context of {r['context_tokens']:,} tokens, output first): "
                f"the window's {r['trace_input_tokens']:,} / {r['trace_output_tokens']:,} input / output tokens were "
                "cut to fit (--length-scale shrinks a trace whole instead)"
            )
        if result["partial"]:
            done = result["completed"] + result["failed"]
            note = " (those in flight are not counted)"
            console.print(interrupted_note(done, result["planned_requests"], "requests", note))
        if result["failed"]:
            first = result["errors"][0]
            console.print(
                f"[yellow]warning:[/yellow] {result['failed']:,} of {result['completed'] + result['failed']:,} "
                f"requests failed (the figures count the completed ones); the first, trace line {first['line']}: "
                f"{first['error']}"
            )
        if json_path is not None:
            write_json(json_path, result)
            console.print(f"results written to {json_path}")
        if plot is not None:
            from minisgl_cli.plots import plot_timeline

            cut = " (partial: interrupted)" if result["stopped"] == "interrupted" else ""  # as the table and the JSON
            plot_timeline(results, plot, f"bench-trace {trace.name} -> {result.get('url') or result['model']}{cut}")
            console.print(f"plot written to {plot}")
        if result["partial"]:
            raise typer.Exit(INTERRUPTED_EXIT)  # once the partial results are out
        if result["failed"] and not result["completed"]:
            console.print("error: every request failed")
            raise typer.Exit(1)


def plan(window, vocab: int, context: int, flags: dict[str, Any]) -> Plan:
    """Scale and clamp the lengths, and place the arrivals on the replay clock; the prompts are synthesized as the
    items are taken."""
    from minisgl_cli.trace_reader import PromptSynth, Trace

    f = flags["length_scale"]
    # No prompt outgrows the context, so neither need a block: a longer one would only be drawn, never used.
    bs = min(max(1, round(window.block_size * f)), context)
    reqs, clamped, scaled_in, scaled_out = [], 0, 0, 0
    for r in window.requests:
        inp, out = max(1, round(r.input_length * f)), max(1, round(r.output_length * f))
        scaled_in, scaled_out = scaled_in + inp, scaled_out + out
        new_in = min(inp, flags["max_input_len"] or inp)
        new_out = min(out, flags["max_output_len"] or out)
        if new_in + new_out > context:
            new_out = max(1, context - new_in)
            new_in = min(new_in, context - new_out)
        clamped += (new_in, new_out) != (inp, out)
        reqs.append(replace(r, input_length=new_in, output_length=new_out))
    eff = Trace(window.path, window.format, bs, reqs, window.skipped)
    items = TraceItems(eff, PromptSynth(vocab, bs, flags["seed"]), flags["time_scale"])
    return Plan(eff, items, clamped, eff.reuse_upper_bound(), context, (scaled_in, scaled_out))


def _run_local(config: EngineConfig, window, flags: dict[str, Any], quiet: bool) -> tuple[dict[str, Any], list]:
    import asyncio

    from engine.async_llm import AsyncLLM
    from minisgl_cli.gpu_busy import GpuBusy
    from minisgl_cli.live_view import LiveView
    from minisgl_cli.replay import LiveCounters, completed_hit_rate, drive_or_interrupted, local_sender

    # Tensor parallelism: under torchrun the follower ranks branch off right after this load (rank 0 goes on).
    llm = o.load_llm(config, quiet=quiet)
    e = llm.engine
    context = min(e.max_model_len, e.cache.num_pages * e.cache.page_size)
    p = plan(window, flags["vocab_size"] or e.model_cfg.vocab_size, context, flags)
    if p.trace.block_size % e.cache.page_size:
        from rich.console import Console

        Console(stderr=True).print(
            f"[yellow]note:[/yellow] blocks of {p.trace.block_size} tokens are not whole KV "
            f"pages of {e.cache.page_size}: the cache reuses only whole pages, so the hit rate "
            f"stays below the trace's bound (pick --length-scale / --page-size to match)"
        )
    engine = AsyncLLM(llm)
    if flags["step_log"]:
        engine.call(lambda x: setattr(x.engine, "step_records", []))
    before = engine.call(lambda x: x.metrics())
    live = LiveCounters()

    async def main():
        # The engine shuts down in here, while the loop its streams deliver to still runs (after a Ctrl-C too).
        try:
            send = local_sender(engine, flags["temperature"], token_stream=flags["token_stream"])
            return await drive_or_interrupted(p.items, send, live)
        finally:
            # After a Ctrl-C the engine may still be inside one long step (a CPU prefill of 8,000 tokens took 63 s):
            # AsyncLLM.call's 30 s default raised queue.Empty there, a traceback that lost the partial results.
            try:
                after = engine.call(lambda x: x.metrics(), timeout=None)
                records = None
                if flags["step_log"]:
                    records = engine.call(lambda x: x.engine.step_records or [], timeout=None)
            finally:
                engine.shutdown()
            state.update(after=after, records=records)

    state: dict[str, Any] = {}
    with LiveView("replaying", len(p.items), live, quiet), GpuBusy(e.device) as busy:
        try:
            results, interrupted = asyncio.run(main())
        finally:
            if "after" not in state:  # main never ran its finally (an error before it started)
                engine.shutdown()
        duration = time.perf_counter() - live.started
    after = state["after"]
    if flags["step_log"]:
        from engine.step_log import write_step_log

        write_step_log(state["records"], flags["step_log"])
    # Not the engine's counters: they take a prompt at its first prefill chunk, so after a Ctrl-C they held the
    # requests cut off mid-decode too (60.6% against a bound of 48.4% over the completed ones, tests/test_bench_trace).
    hit_rate = completed_hit_rate(results)
    out = summarize(results, duration, p, hit_rate, live.started, interrupted, flags["save_detailed"], "requests")
    out.update(
        mode="in-process",
        **llm.describe(),
        radix_cache=config.radix_cache,
        page_size=e.cache.page_size,
        kv_pool_tokens=e.cache.num_pages * e.cache.page_size,
        preemptions=after.preemptions - before.preemptions,
        mixed_batch=config.mixed_batch,
        max_batch_tokens=config.max_batch_tokens,
        mixed_prefill_tokens=config.mixed_prefill_tokens,
        max_running_tokens=config.max_running_tokens,
        engine_steps=after.steps - before.steps,
        mixed_steps=after.mixed_steps - before.mixed_steps,
        engine="minisgl",
        gpu=_gpu_name(e.device),
        gpu_busy=busy.share,
    )
    out["mixed_step_share"] = out["mixed_steps"] / out["engine_steps"] if out["engine_steps"] else None
    return out, results


def _run_vllm(config: EngineConfig, window, flags: dict[str, Any], quiet: bool) -> tuple[dict[str, Any], list]:
    """The replay through vLLM's AsyncLLM in this process (minisgl_cli/vllm_peer.py), timed by the same driver."""
    import asyncio

    from minisgl_cli.gpu_busy import GpuBusy
    from minisgl_cli.live_view import LiveView
    from minisgl_cli.peers import PeerUnavailable
    from minisgl_cli.replay import LiveCounters, completed_hit_rate, drive_or_interrupted
    from minisgl_cli.vllm_peer import VllmAsyncPeer

    async def main():
        t0 = time.perf_counter()
        try:
            peer = VllmAsyncPeer(config, flags["vllm_args"], quiet)
        except PeerUnavailable as e:
            raise typer.BadParameter(str(e), param_hint="--engine") from e
        startup = time.perf_counter() - t0
        try:
            info = peer.describe()
            s = info["settings"]
            pool = s["num_gpu_blocks"] * s["block_size"] if "num_gpu_blocks" in s and "block_size" in s else None
            context = min(s.get("max_model_len") or 1 << 62, pool or 1 << 62)
            p = plan(window, flags["vocab_size"] or peer.model_config.vocab_size, context, flags)
            live = LiveCounters()
            with LiveView("replaying", len(p.items), live, quiet), GpuBusy(config.torch_device()) as busy:
                results, interrupted = await drive_or_interrupted(p.items, peer.sender(flags["temperature"]), live)
                duration = time.perf_counter() - live.started
        finally:
            peer.close()
        return info, pool, startup, p, results, duration, busy.share, interrupted, live.started

    info, pool, startup, p, results, duration, gpu_busy, interrupted, t0 = asyncio.run(main())
    hit_rate = completed_hit_rate(results)
    out = summarize(results, duration, p, hit_rate, t0, interrupted, flags["save_detailed"], "requests")
    out.update(mode="in-process", **info, engine="vllm", kv_pool_tokens=pool, startup_seconds=startup)
    out["gpu"] = _gpu_name(config.torch_device())
    out["gpu_busy"] = gpu_busy
    return out, results


def _gpu_name(device) -> str | None:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _run_url(
    config: EngineConfig,
    window,
    flags: dict[str, Any],
    quiet: bool,
    api_key: str | None = None,
    model_given: bool = True,  # --model on the command line; else the served model's own config where readable
) -> tuple[dict[str, Any], list]:
    import asyncio

    from minisgl_cli.client_check import client_check_or_none
    from minisgl_cli.live_view import LiveView
    from minisgl_cli.openai_client import HTTPStatusError, OpenAIClient, api_base
    from minisgl_cli.replay import (
        LiveCounters,
        cache_hit_rate,
        completed_hit_rate,
        drive_or_interrupted,
        failure,
        scrape_metrics,
        served_model,
        url_sender,
    )
    from minisgl_cli.run_figures import client_usage

    o.served_shape(config, flags["vocab_size"])  # a --model it cannot read is refused before anything is sent
    check = None if flags["no_client_check"] else client_check_or_none(quiet)

    async def main():
        try:
            client = OpenAIClient(flags["url"], timeout=flags["request_timeout"], api_key=api_key)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--url") from e
        async with client:
            try:
                name, engine, listed_context = await served_model(client, flags["served_model"])
            except (OSError, ValueError, KeyError, HTTPStatusError) as e:  # OSError holds TimeoutError
                # a server that accepts the connection but never answers times out, and a TimeoutError's text is empty
                why = failure(e, client.timeout) if isinstance(e, TimeoutError) else e
                where = f"{api_base(flags['url'])}/models"
                raise typer.BadParameter(f"cannot reach {where}: {why}", param_hint="--url") from e
            vocab, context, _ = o.served_model_shape(
                config, flags["vocab_size"], model_given, name, listed_context, quiet=quiet
            )
            p = plan(window, vocab, context, flags)
            before = await scrape_metrics(client)
            live = LiveCounters()
            with LiveView("replaying", len(p.items), live, quiet):
                results, interrupted = await drive_or_interrupted(
                    p.items, url_sender(client, name, flags["temperature"]), live
                )
                duration = time.perf_counter() - live.started
            # after a Ctrl-C (often given because the server stopped answering) the scrape must not wait for
            # --request-timeout (600 s by default) before the partial results come out
            try:
                async with asyncio.timeout(5.0 if interrupted else None):
                    after = await scrape_metrics(client)
            except TimeoutError:
                after = None
            return name, engine, results, duration, (before, after), interrupted, live.started, p

    name, engine, results, duration, metrics, interrupted, t0, p = asyncio.run(main())
    # Each completed request's own cache hits where the server sends them (usage.prompt_tokens_details, as minisgl's
    # and SGLang's do), else its /metrics counters: those count every prompt the server admitted, a request a Ctrl-C
    # cut off after its first prefill chunk too, so not after one.
    hit_rate: float | None
    if all(r.cache_hit_tokens is not None for r in results if r.ok):
        hit_rate, source = completed_hit_rate(results), "requests"
    elif interrupted:
        hit_rate, source = None, None
    else:
        hit_rate = cache_hit_rate(*metrics)
        source = "metrics" if hit_rate is not None else None
    out = summarize(results, duration, p, hit_rate, t0, interrupted, flags["save_detailed"], source)
    out.update(mode="url", url=flags["url"], model=name, engine=engine)
    out.update(client_usage(out, results, check.tok_per_s if check else None), client_check=check and check.as_dict())
    return out, results


def summarize(
    results,
    duration: float,
    p: Plan,
    cache_hit_rate: float | None,
    t0: float,
    interrupted: bool = False,
    detailed: bool = False,
    hit_rate_source: str | None = None,
) -> dict[str, Any]:
    """The figures, and bench-serve's per-request arrays (`requests`: send times from the replay's start `t0`,
    TTFTs, TPOTs, lengths, which succeeded, cache hits; with `detailed`, every inter-token gap), so that every
    statistic can be recomputed from the JSON. `hit_rate_source`: "requests" (the completed requests' own cache
    hits), "metrics" (a server's /metrics counters over the replay) or None (no hit rate)."""
    from minisgl_cli.report import interrupted_fields
    from minisgl_cli.run_figures import per_request
    from minisgl_cli.run_figures import summarize as figures

    out = figures(results, duration, e2e_name="e2e_latency")
    out["requests"] = per_request(results, t0, detailed)
    out["requests"]["cached_tokens"] = [r.cache_hit_tokens for r in results]
    # The bound is over the requests the hit rate measures, the completed ones (a bound over all planned was below
    # the hit rate of a run some of whose requests failed or were cut off); every earlier request, sent before them,
    # may have filled the cache. The planned window's bound is kept apart.
    bound = p.upper_bound
    done = {r.index for r in results if r.ok}
    if len(done) < len(p.trace.requests):
        bound = p.trace.reuse_upper_bound(over=done)
    out.update(
        planned_requests=len(p.items),
        **interrupted_fields(interrupted),
        cache_hit_rate=cache_hit_rate,
        cache_hit_rate_source=hit_rate_source,
        trace_cache_hit_upper_bound=bound,
        trace_cache_hit_upper_bound_planned=p.upper_bound,
        block_size=p.trace.block_size,
        clamped_requests=p.clamped,
        context_tokens=p.context,
        trace_input_tokens=p.scaled_tokens[0],
        trace_output_tokens=p.scaled_tokens[1],
    )
    return out


def _share(x: float | None, digits: int = 1) -> str:
    """A rate as a percentage; n/a where there was nothing to measure (no request completed, no engine step)."""
    return "n/a" if x is None else f"{x:.{digits}%}"


def _table(res: dict[str, Any]):
    from rich.console import Group

    from minisgl_cli.report import kv_table

    rows = [
        (label, *(res[f"{s}_{key}_ms"] for s in ("mean", "median", "p90", "p99", "max")))
        for label, key in (("TTFT", "ttft"), ("TBT (inter-token)", "itl"), ("TPOT", "tpot"), ("E2E", "e2e_latency"))
    ]
    latency = kv_table("latency (ms)", rows, ("", "mean", "p50", "p90", "p99", "max"))
    where = res.get("url") or f"{res['model']} on {res.get('device')}"
    summary = kv_table(
        f"bench-trace: {Path(res['trace']).name} ({res['format']}) -> {where}",
        [
            ("requests completed / failed", f"{res['completed']:,} / {res['failed']:,}"),
            ("skipped lines / clamped requests", f"{res['skipped_lines']:,} / {res['clamped_requests']:,}"),
            ("input / output tokens", f"{res['total_input_tokens']:,} / {res['total_output_tokens']:,}"),
            ("duration (s)", res["duration"]),
            ("requests/s", res["request_throughput"]),
            ("output tok/s", res["output_throughput"]),
            ("total tok/s", res["total_token_throughput"]),
            ("cache hit rate", _share(res["cache_hit_rate"])),
            *([("GPU busy", _share(res["gpu_busy"]))] if res.get("gpu_busy") is not None else []),
            ("trace upper bound", _share(res["trace_cache_hit_upper_bound"])),
            *(
                [("engine steps (mixed)", f"{res['engine_steps']:,} ({_share(res['mixed_step_share'], 0)} mixed)")]
                if "engine_steps" in res
                else []
            ),
        ],
    )
    if res["cache_hit_rate_source"] == "metrics":
        summary.caption = "cache hit rate: the server's /metrics over the replay; bound: over the completed requests"
    else:
        summary.caption = "cache hit rate and its bound: over the completed requests"
    summary.caption_justify = "left"
    return Group(summary, latency)
