"""`minisgl bench-serve`: drive an OpenAI-compatible server (or the in-process engine) with a synthetic or dataset
workload at a request rate and/or a concurrency limit; sweep the load to find the knee; goodput against latency
targets; table, JSON (vLLM `bench serve` names), CSV and plots."""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.config import EngineConfig
from minisgl_cli import options as o
from minisgl_cli.arrivals import MAX_BURSTINESS

if TYPE_CHECKING:
    from minisgl_cli.arrivals import Ramp, Sweep
    from minisgl_cli.error_limit import ErrorLimit


@dataclass(slots=True)
class Target:
    """Where requests go: the in-process engine or a URL, with what the workload needs to know about the model."""

    vocab: int
    context: int
    tokenizer: Any
    model: str
    llm: Any = None  # the in-process engine
    url: str | None = None


def register(app: typer.Typer) -> None:
    @app.command(
        "bench-serve", short_help="Load-test a server or the engine at rates or concurrencies; a sweep finds the knee."
    )
    @o.with_engine_flags()
    def bench_serve(
        ctx: typer.Context,
        url: Annotated[
            str | None,
            typer.Option(help="an OpenAI-compatible server (e.g. http://127.0.0.1:8000); default in-process"),
        ] = None,
        endpoint: Annotated[str, typer.Option(help="completions | chat (chat sends text prompts)")] = "completions",
        served_model: o.ServedModel = None,
        api_key: o.ApiKey = None,
        num_requests: Annotated[
            int | None,
            typer.Option(help="requests per load point (default 200; with --duration: as many as fit)", min=1),
        ] = None,
        duration: Annotated[
            float | None, typer.Option(help="stop sending after this many seconds per load", min=0.01)
        ] = None,
        warmup: Annotated[int, typer.Option(help="untimed requests sent before the first load point", min=0)] = 0,
        max_errors: Annotated[
            str | None,
            typer.Option(
                help="stop a load once N of its requests have failed, or, 0 < F < 1, once that share of those ended"
                " has (judged from 30 ended on): guidellm's max_errors / max_global_error_rate; those in flight are"
                " cancelled, and the command exits 1"
            ),
        ] = None,
        input_len: Annotated[
            str, typer.Option(help="prompt length range A:B in tokens (uniform, inclusive), or N")
        ] = "128:128",
        output_len: Annotated[str, typer.Option(help="output length range A:B (ignore_eos), or N")] = "128:128",
        prompt_format: Annotated[
            str, typer.Option(help="ids (token ids) | text (decoded by --model's tokenizer; chat always sends text)")
        ] = "ids",
        dataset: o.Dataset = None,
        dataset_column: o.DatasetColumn = None,
        prefix_groups: Annotated[int, typer.Option(help="G groups of requests sharing a prefix (0: none)", min=0)] = 0,
        prefix_len: Annotated[int, typer.Option(help="tokens of each group's shared prefix", min=1)] = 256,
        rate: Annotated[
            str,
            typer.Option(
                help="requests/s, or a list to sweep: 1,2,4,8,inf (inf: no pacing); sweep[:N]: guidellm's sweep of N"
                " loads (default 10): synchronous, throughput, then N-2 rates between the two measured"
            ),
        ] = "inf",
        max_concurrency: Annotated[
            str | None, typer.Option(help="most requests in flight, or a list to sweep: 1,8,64")
        ] = None,
        burstiness: Annotated[
            float,
            typer.Option(
                help="gamma shape of the arrival gaps (1: Poisson, <1 burstier, >1 more regular)",
                min=1e-3,
                max=MAX_BURSTINESS,
            ),
        ] = 1.0,
        arrival: Annotated[str, typer.Option(help="poisson (gamma gaps, see --burstiness) | constant")] = "poisson",
        ramp_up_strategy: Annotated[
            str | None,
            typer.Option(
                help="linear | exponential: one load whose rate grows from --ramp-up-start-rps to --ramp-up-end-rps"
                " over its requests (vLLM's: request i of N at start + (end - start) * i/(N-1), or start *"
                " (end/start)^(i/(N-1))); over --num-requests, else as many as --duration S holds; instead of --rate"
            ),
        ] = None,
        ramp_up_start_rps: Annotated[
            float | None, typer.Option(help="the ramp's first request's rate, requests/s (> 0)")
        ] = None,
        ramp_up_end_rps: Annotated[
            float | None, typer.Option(help="the ramp's last request's rate, requests/s (above the start)")
        ] = None,
        slo: Annotated[
            str | None,
            typer.Option(
                help="goodput targets, e.g. ttft=200ms,tpot=40ms,e2e=5s (every one must be met); a number without a "
                "unit is milliseconds, as vLLM's --goodput ttft:200 reads it"
            ),
        ] = None,
        seed: Annotated[int, typer.Option(help="seed of the workload, the arrivals and the in-process engine")] = 0,
        temperature: Annotated[float, typer.Option(help="sampling temperature (0: greedy)", min=0.0)] = 0.0,
        vocab_size: Annotated[
            int | None,
            typer.Option(help="prompt ids stay below this (default: --model's vocabulary)", min=2),
        ] = None,
        request_timeout: o.RequestTimeout = 600.0,
        client_check: Annotated[
            bool, typer.Option("--client-check", help="only measure the client's absorption rate and print it")
        ] = False,
        no_client_check: Annotated[
            bool,
            typer.Option("--no-client-check", help="skip measuring the client's absorption rate before a --url run"),
        ] = False,
        label: Annotated[str | None, typer.Option(help="this run's name in bench-compare (e.g. 'vllm H100')")] = None,
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results to this JSON file")] = None,
        csv_path: Annotated[Path | None, typer.Option("--csv", help="write one row per load to this CSV file")] = None,
        plot: Annotated[
            Path | None,
            typer.Option(
                "--plot",
                help="PNG: throughput and TTFT/TPOT p50/p99 against load, one run over time, or a ramp against the"
                " rate each request was sent at",
            ),
        ] = None,
        save_detailed: Annotated[
            bool, typer.Option("--save-detailed", help="also store every request's inter-token gaps in the JSON")
        ] = False,
        quiet: Annotated[bool, typer.Option("--quiet", help="no live view")] = False,
        flush_cache: Annotated[
            bool,
            typer.Option(
                "--flush-cache",
                help="drop the prefix cache before each load point, so each starts cold (SGLang bench_serving's flag;"
                " --url: POST /reset_prefix_cache, vLLM's (with VLLM_SERVER_DEV_MODE=1), else /flush_cache, SGLang's)",
            ),
        ] = False,
        **engine_flags: Any,
    ) -> None:
        """Load-test a server or the engine: arrivals at --rate (Poisson, gamma with --burstiness, or constant) and/or
        at most --max-concurrency in flight; a list of rates or concurrencies runs a sweep, one row per load, the knee
        marked; --ramp-up-strategy runs one load at a rate that grows request by request (vLLM's ramp-up). Latencies
        count from each request's scheduled send time (the client's own queueing included). With --url, the client's
        absorption rate is measured first and each run says how much of it it used."""
        flags = dict(locals())
        flags.update(flags.pop("engine_flags"))
        flags.pop("api_key")
        del flags["ctx"]
        from rich.console import Console

        from minisgl_cli.report import check_outputs

        check_outputs(json=json_path, csv=csv_path, plot=plot)
        console = Console()
        if client_check:
            others = [p.name or "" for p in ctx.command.params if p.name not in ("client_check", "json_path")]
            o.refuse_given(ctx, "--client-check only measures the client's absorption rate (--json: its file)", *others)
            return _print_client_check(console, json_path)
        reads_model = vocab_size is None or engine_flags["max_model_len"] is None or _needs_text(flags)
        o.refuse_by_url(ctx, url, reads_model, ("api_key", "served_model", "request_timeout", "no_client_check"))
        config = o.engine_config(**flags)
        if url is None:
            o.refuse_unread_engine_flags(ctx, config)
        if json_path is None:
            why = "is written to the --json file, and there is no --json"
            o.refuse_given(ctx, why, "label", "save_detailed")
        if dataset is not None:
            o.refuse_given(ctx, "draws random prompts' lengths, and --dataset prompts have their own", "input_len")
        else:
            why = "names the --dataset file's prompt column, and there is no --dataset"
            o.refuse_given(ctx, why, "dataset_column")
        if endpoint == "chat" and prompt_format == "ids":
            o.refuse_given(ctx, "--endpoint chat sends text prompts", "prompt_format")
        if not prefix_groups:
            o.refuse_given(
                ctx, "is the length of each --prefix-groups group's shared prefix, and there are none", "prefix_len"
            )
        if ramp_up_strategy is not None:
            # vLLM refuses every --request-rate beside a ramp but its default, inf; here inf is a load of its own
            why = (
                "sets one rate, and --ramp-up-strategy sends at its ramp's rates (vLLM refuses any --request-rate"
                " but its default inf beside a ramp; here --rate inf is no pacing: leave --rate out)"
            )
            o.refuse_given(ctx, why, "rate")
        else:
            why = "is a --ramp-up-strategy's rate, and there is no --ramp-up-strategy"
            o.refuse_given(ctx, why, "ramp_up_start_rps", "ramp_up_end_rps")
        loads, slo_targets, sweep = _parse_load(flags)
        limit = _error_limit(flags, loads[0])
        if sweep is None and all(math.isinf(load.rate) for load in loads):
            why = "shapes the gaps between arrivals at a --rate, and --rate inf sends with no gaps"
            o.refuse_given(ctx, why, "arrival", "burstiness")
        if all(math.isinf(load.rate) and load.max_concurrency is None for load in loads):
            why = "stops sending after S seconds, and --rate inf without --max-concurrency sends everything at once"
            o.refuse_given(ctx, why, "duration")
        if sweep is not None and sweep.cap is None and num_requests is None:
            why = "without --num-requests or --max-concurrency leaves --rate sweep's throughput load unbounded: it"
            o.refuse_given(ctx, why + " would send all 10,000 requests drawn for the time at once", "duration")
        if plot is not None:
            from minisgl_cli.plots import require_matplotlib

            require_matplotlib()
        target = _target(config, flags, api_key, bool(o.given(ctx, "model")))
        served: dict[str, Any] = {}
        planner = _Planner(target, flags, served)
        plans = [planner.plan(load, i) for i, load in enumerate(loads)]
        warm = planner.warm_up()
        check = None
        if url is not None and not no_client_check:
            from minisgl_cli.client_check import client_check_or_none

            check = client_check_or_none(quiet)
        result = _run_sweep(
            console, target, plans, warm, slo_targets, flags, check, api_key, served, planner, sweep, limit
        )
        _report(console, result, flags)
        if result["stopped"] == "interrupted":
            from minisgl_cli.report import INTERRUPTED_EXIT

            raise typer.Exit(INTERRUPTED_EXIT)  # once the partial results are out
        dead = any(row["failed"] and not row["completed"] and not row["incomplete"] for row in result["sweep"])
        if dead:  # as bench-trace
            console.print("[red]error:[/red] every request of a load failed")
        if cut := [row["load"] for row in result["sweep"] if row["stop_reason"] == "max_errors"]:
            # a load cut short is no measurement of it: a script running sweeps must not take it for one
            console.print(f"[red]error:[/red] {', '.join(cut)} reached --max-errors {limit} and stopped early")
        if dead or cut:
            raise typer.Exit(1)


def _print_client_check(console, json_path: Path | None) -> None:
    from minisgl_cli.client_check import check_client
    from minisgl_cli.report import environment, kv_table, write_json

    with console.status("streaming from the mock server"):
        c = check_client(streams=128, tokens=2000, repeats=3)
    console.print(
        kv_table(
            "client absorption (OpenAI client vs the trivial mock SSE server, best of 3)",
            [
                ("concurrent streams", c.streams),
                ("one-token events per stream", c.tokens_per_stream),
                ("events per server write", c.events_per_write),
                ("seconds", c.seconds),
                ("absorbed tok/s", c.tok_per_s),
            ],
        )
    )
    if json_path is not None:
        write_json(json_path, {"benchmark": "client-check", **c.as_dict(), "environment": environment()})


def _parse_load(flags: dict[str, Any]):
    from minisgl_cli.arrivals import (
        ARRIVALS,
        Load,
        Ramp,
        Sweep,
        check_gaps,
        parse_concurrency,
        parse_rates,
        parse_sweep,
    )
    from minisgl_cli.run_figures import load_sort_key, parse_slo

    ramp = None
    try:
        size = parse_sweep(flags["rate"])
        rates = parse_rates(flags["rate"]) if size is None else []
        concs: list[int | None] = (
            list(parse_concurrency(flags["max_concurrency"])) if flags["max_concurrency"] else [None]
        )
        if flags["ramp_up_strategy"] is not None:  # --rate was refused beside it: its default is no load
            requests = flags["num_requests"]
            if requests is None and flags["duration"] is None:
                requests = DEFAULT_REQUESTS
            ramp = Ramp.parse(
                flags["ramp_up_strategy"],
                flags["ramp_up_start_rps"],
                flags["ramp_up_end_rps"],
                requests,
                flags["duration"],
            )
            rates = [ramp.start, ramp.end]
        for r in rates:  # here, not once the model has loaded and the arrivals are drawn
            check_gaps(r, flags["burstiness"])
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if ramp is not None and len(concs) > 1:
        why = "a ramp is one load, run under one cap (a list would run the ramp again under each)"
        raise typer.BadParameter(f"{why} (got {flags['max_concurrency']!r})", param_hint="--max-concurrency")
    sweep = None
    if size is not None:
        if len(concs) > 1:
            why = "--rate sweep takes one cap for its throughput and rate loads (guidellm's max_concurrency), no list"
            raise typer.BadParameter(f"{why} (got {flags['max_concurrency']!r})", param_hint="--max-concurrency")
        if concs[0] == 1:
            why = "1 would make --rate sweep's throughput load its synchronous one (one request at a time) again"
            raise typer.BadParameter(why, param_hint="--max-concurrency")
        sweep = Sweep(size, flags["arrival"], concs[0])
    if flags["arrival"] not in ARRIVALS:
        raise typer.BadParameter(
            f"must be one of {', '.join(ARRIVALS)} (got {flags['arrival']!r})", param_hint="--arrival"
        )
    if flags["arrival"] == "constant" and flags["burstiness"] != 1.0:
        raise typer.BadParameter("shapes Poisson (gamma) gaps; --arrival constant has none", param_hint="--burstiness")
    if flags["endpoint"] not in ("completions", "chat"):
        raise typer.BadParameter(f"must be completions or chat (got {flags['endpoint']!r})", param_hint="--endpoint")
    if flags["prompt_format"] not in ("ids", "text"):
        raise typer.BadParameter(f"must be ids or text (got {flags['prompt_format']!r})", param_hint="--prompt-format")
    slo = None
    if flags["slo"]:
        try:
            slo = parse_slo(flags["slo"])
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--slo") from e
    if sweep is not None:
        return sweep.first_loads(), slo, sweep
    if ramp is not None:
        return [Load(ramp.end, concs[0], ramp=ramp)], slo, None
    loads = sorted({Load(r, c) for r in rates for c in concs}, key=lambda x: load_sort_key(x.rate, x.max_concurrency))
    return loads, slo, None


def _error_limit(flags: dict[str, Any], load) -> ErrorLimit | None:
    """--max-errors, refused where no load could ever reach it (a load's most requests: --num-requests, else 200;
    with --duration alone, as many as its time allows, unknown here but for a ramp's)."""
    from minisgl_cli.error_limit import ErrorLimit

    if flags["max_errors"] is None:
        return None
    try:
        limit = ErrorLimit.parse(flags["max_errors"])
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--max-errors") from e
    if flags["duration"] is None or flags["num_requests"] is not None or load.ramp is not None:
        if why := limit.never_reached(_sizes(load, flags)):
            raise typer.BadParameter(why, param_hint="--max-errors")
    return limit


def _needs_text(flags: dict[str, Any]) -> bool:
    """Whether the workload needs the model's tokenizer: prompts sent as text, or a dataset's text prompts."""
    return flags["prompt_format"] == "text" or flags["endpoint"] == "chat" or flags["dataset"] is not None


def _target(
    config: EngineConfig, flags: dict[str, Any], api_key: str | None = None, model_given: bool = True
) -> Target:
    needs_text = _needs_text(flags)
    if flags["url"] is None:
        llm = o.load_llm(config, quiet=flags["quiet"])
        e = llm.engine
        context = min(e.max_model_len, e.cache.num_pages * e.cache.page_size)
        vocab = flags["vocab_size"] or e.model_cfg.vocab_size
        return Target(vocab, context, llm.tokenizer, llm.describe()["model"], llm=llm)
    # a --model it cannot read is refused before asking; its tokenizer loaded once (without --model, the served
    # model's is loaded where this machine can read it, so none is loaded now)
    _, _, tokenizer = o.served_shape(config, flags["vocab_size"], needs_text and model_given)
    name = listed = None
    if (not model_given and flags["vocab_size"] is None) or config.max_model_len is None:
        name, listed = _served_listing(flags, api_key)
    vocab, context, tokenizer = o.served_model_shape(
        config, flags["vocab_size"], model_given, name, listed, needs_text, flags["quiet"], tokenizer
    )
    return Target(vocab, context, tokenizer, str(config.model), url=flags["url"])


def _served_listing(flags: dict[str, Any], api_key: str | None) -> tuple[str | None, int | None]:
    """The served model's name and the context its /v1/models lists, asked before the workload is drawn for it;
    (None, None) when the server cannot be asked now (the run's own connection then says why)."""
    import asyncio

    from minisgl_cli.openai_client import HTTPStatusError, OpenAIClient
    from minisgl_cli.replay import served_model

    async def ask() -> tuple[str | None, int | None]:
        async with OpenAIClient(flags["url"], timeout=min(flags["request_timeout"], 30.0), api_key=api_key) as client:
            name, _, listed = await served_model(client, flags["served_model"])
            return name, listed

    try:
        return asyncio.run(ask())
    except (OSError, ValueError, KeyError, HTTPStatusError):
        return None, None


def _workload(target: Target, flags: dict[str, Any], n: int, seed: int, skip: int):
    """`n` requests; a dataset's prompts from its `skip`-th on."""
    from minisgl_cli.replay import ReplayItem
    from minisgl_cli.workload import ColumnError, parse_range, serve_workload

    try:
        in_range = parse_range(flags["input_len"], "--input-len")
        out_range = parse_range(flags["output_len"], "--output-len")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    text = flags["prompt_format"] == "text" or flags["endpoint"] == "chat"
    groups = flags["prefix_groups"]
    try:
        w = serve_workload(
            n,
            in_range,
            out_range,
            seed,
            target.vocab,
            target.tokenizer,
            text,
            flags["dataset"],
            groups,
            flags["prefix_len"] if groups else 0,
            target.context,
            skip,
            flags["dataset_column"],
        )
    except ValueError as e:
        raise typer.BadParameter(
            str(e), param_hint="--dataset-column" if isinstance(e, ColumnError) else "--dataset"
        ) from e
    longest = max(len(p) + out for p, out in zip(w.prompts, w.output_lens))
    if longest > target.context:
        raise typer.BadParameter(
            f"the longest request ({longest} tokens) exceeds the context length {target.context}: lower --input-len / "
            "--output-len / --prefix-len (or raise --max-model-len)"
        )
    prompts: list[str | list[int]] = list(w.texts if w.texts is not None else w.prompts)
    items = [
        ReplayItem(i, 0, 0.0, p, out, len(ids))
        for i, (p, out, ids) in enumerate(zip(prompts, w.output_lens, w.prompts))
    ]
    return items, w


# The requests drawn for a closed loop bounded by --duration alone (drawn up front: 10,000 random 128-token prompts
# take a second and ~50 MB); a fast server takes them all before its time is up, and the run then says so.
CLOSED_LOOP_SUPPLY = 10_000


# requests a load sends when neither --num-requests nor --duration bounds it
DEFAULT_REQUESTS = 200


def _sizes(load, flags: dict[str, Any]) -> int:
    if load.ramp is not None:  # its own count: --num-requests, or what --duration holds
        return load.ramp.requests
    n = flags["num_requests"]
    if n is not None:
        return n
    if flags["duration"] is None:
        return DEFAULT_REQUESTS
    if math.isinf(load.rate):  # closed loop, or everything at once: a generous supply for the duration
        return CLOSED_LOOP_SUPPLY
    return int(load.rate * flags["duration"] * 1.5) + 50


@dataclass(slots=True)
class _Planner:
    """Draws each load's requests with their arrival times, and the warm-up's. Every load known up front is drawn
    before anything is sent, so bad input fails first (a sweep's rate loads, once their rates are measured). Each
    load gets prompts of its own (random ones of seed + its index; a dataset's next prompts), so no load reuses
    another's in a prefix cache (unless a dataset runs out: its prompts are then given again)."""

    target: Target
    flags: dict[str, Any]
    served: dict[str, Any]
    drawn: int = 0  # the dataset's prompts taken so far

    def plan(self, load, index: int):
        from minisgl_cli.arrivals import arrival_times

        flags, n = self.flags, _sizes(load, self.flags)
        items, w = _workload(self.target, flags, n, flags["seed"] + index, self.drawn)
        self.drawn += n
        self.served["source"], self.served["column"] = w.source, w.column
        self._note_skipped(w)
        times = arrival_times(
            len(items),
            load.rate,
            flags["burstiness"],
            flags["arrival"],
            flags["seed"] + index,
            flags["duration"],
            load.ramp,
        )
        for item, t in zip(items, times):
            item.arrival = t
        # the requests from index n - repeated on were given a prompt again, those in w.cut a prompt cut to fit
        # (both counted among those sent: a time-bounded run draws far more than it sends)
        return load, items[: len(times)], n - w.repeated, w.cut

    def warm_up(self) -> list:
        """The dataset's prompts after the loads' drawn so far (again the first ones when it runs out)."""
        self.served["warm_repeated"] = 0
        if not self.flags["warmup"]:
            return []
        warm, w = _workload(self.target, self.flags, self.flags["warmup"], self.flags["seed"] + 10_000, self.drawn)
        # a sweep's rate loads, planned after it, take the prompts after its own (they took the warm-up's again,
        # which the server's prefix cache still held)
        self.drawn += self.flags["warmup"]
        self.served["warm_repeated"] = w.repeated
        self._note_skipped(w)
        return warm

    def _note_skipped(self, w) -> None:
        """The dataset's rows skipped for an empty prompt (the file's: each load's read says the same)."""
        self.served["skipped_rows"], self.served["skipped"] = w.skipped_rows, w.skipped


def _run_sweep(
    console,
    target: Target,
    plans,
    warm,
    slo,
    flags: dict[str, Any],
    check,
    api_key: str | None,
    served,
    planner: _Planner,
    sweep: Sweep | None,
    limit: ErrorLimit | None,
) -> dict[str, Any]:
    """Run the loads of `plans` in turn, then a sweep's rate loads, planned from its first two rows. A load that
    reaches `limit` stops there, and the next one runs (each load has its own, as guidellm's benchmarks each have
    theirs), but a sweep's rate loads, which its first two loads' measured rates would place."""
    from minisgl_cli.error_limit import ErrorTally
    from minisgl_cli.live_view import LiveView
    from minisgl_cli.replay import LiveCounters, drive, local_sender, url_sender
    from minisgl_cli.run_figures import by_load, mark_knee

    planned = sweep.loads if sweep is not None else len(plans)
    chat = flags["endpoint"] == "chat"
    rows: list[dict[str, Any]] = []
    singles: list = []  # the per-request results of the last load (a single run's timeline plot)
    stopped: str | None = None

    async def run_all() -> None:
        nonlocal stopped
        client = None
        if target.url is not None:
            client = await _connect(target, flags, api_key, served)
            send = url_sender(client, served["name"], flags["temperature"], chat)
        else:
            from engine.async_llm import AsyncLLM

            engine = AsyncLLM(target.llm)
            send = local_sender(engine, flags["temperature"], chat)
        try:
            if flags["flush_cache"]:  # before anything is sent: a server that cannot is found out at once
                await _flush(client, engine if client is None else None)
            if warm:  # through the first load's concurrency cap, as vLLM's warm-up goes through its own
                live, cap = LiveCounters(), plans[0][0].max_concurrency
                with LiveView("warm-up", len(warm), live, flags["quiet"]):
                    await drive(warm, send, cap, live=live)
            i = 0
            while i < len(plans):
                load, items, first_repeat, cut = plans[i]
                live = LiveCounters()
                if flags["flush_cache"]:
                    await _flush(client, engine if client is None else None)
                before = await _hits(client, target)
                tally = ErrorTally(limit) if limit is not None else None
                try:
                    title = f"{load.label} ({i + 1}/{planned})"
                    with LiveView(title, len(items), live, flags["quiet"], _ramp_now(load, items)):
                        results = await drive(
                            items,
                            send,
                            load.max_concurrency,
                            load.closed_loop,
                            flags["duration"],
                            live=live,
                            until=tally,
                        )
                except asyncio.CancelledError:
                    results, stopped = sorted(live.done, key=lambda r: r.index), "interrupted"
                t0 = live.started
                duration = time.perf_counter() - t0
                reason = stopped or ("max_errors" if tally is not None and tally.reached else None)
                row = _row(load, results, len(items), duration, t0, slo, flags, check, cut=reason is not None)
                row["stop_reason"] = reason  # Ctrl-C ("interrupted") or --max-errors ("max_errors") cut it short
                row["sent_requests"] = live.sent  # of planned_requests; those ended, and those cancelled in flight
                # a closed loop that sent its whole drawn supply stopped before its --duration was up (it ended
                # early without a word): its figures cover a shorter run than asked (--num-requests draws more)
                row["ran_out"] = (
                    load.closed_loop
                    and flags["duration"] is not None
                    and flags["num_requests"] is None
                    and reason is None
                    and len(results) == len(items)
                )
                # sent but unfinished when Ctrl-C or --max-errors cut the load (guidellm's "incomplete"; cancelled,
                # so neither completed nor failed): in no figure or array
                row["incomplete"] = live.sent - len(live.done)
                if load.ramp is not None:
                    _ramp_fields(row, load.ramp, items, live.sent, t0)
                row["cache_hit_rate"] = _hit_rate(before, await _hits(client, target), target, results, reason)
                row["repeated_prompts"] = sum(r.index >= first_repeat for r in results)
                row["truncated_prompts"] = sum(r.index in cut for r in results)
                rows.append(row)
                singles[:] = results
                if stopped:
                    return
                # every request sent failed: a dead server, no load after it would fare better. Not a load that
                # --max-errors cut with requests in flight: its failures came back first (a refusal is quicker
                # than a stream), and the requests it cancelled had not failed
                if results and not any(r.ok for r in results) and not row["incomplete"]:
                    stopped = f"every request of {load.label} failed ({results[0].error})"
                    if flags["url"] and "outside the vocabulary" in (results[0].error or ""):
                        hint = "give the served model as --model, or --vocab-size"
                        stopped += f"; prompts drew ids below {target.vocab}: {hint}"
                    return
                i += 1
                if sweep is not None and reason == "max_errors" and len(plans) < planned:
                    sweep.measured(rows)
                    # a measured load (synchronous, throughput) cut short measured no rate of its own: rates placed
                    # from it would be made up, so the sweep stops here, before the other one runs for nothing
                    stopped = f"{load.label} reached --max-errors: its measured rate cannot place the sweep's rate"
                    stopped += " loads"
                    return
                if sweep is not None and i == len(plans) < planned:
                    try:
                        plans.extend(planner.plan(load, i + j) for j, load in enumerate(sweep.next_loads(rows)))
                    except (typer.BadParameter, ValueError) as e:  # drawn mid-run: the loads run so far are kept
                        stopped = f"cannot plan the sweep's rate loads: {e}"
                        return
        finally:
            if client is not None:
                await client.close()
            else:
                engine.shutdown()

    try:
        asyncio.run(run_all())
    except KeyboardInterrupt:
        stopped = stopped or "interrupted"
    if not rows and stopped == "interrupted":  # during the warm-up: as bench-offline and bench-trace, status 130
        from minisgl_cli.report import INTERRUPTED_EXIT

        written = f"; nothing written to {flags['json_path']}" if flags["json_path"] is not None else ""
        console.print(f"[yellow]interrupted[/yellow] before a load point finished: no results{written}")
        raise typer.Exit(INTERRUPTED_EXIT)
    if not rows:
        console.print(f"[red]error:[/red] no load point finished ({stopped or 'nothing ran'})")
        raise typer.Exit(1)
    if sweep is not None:  # along its loads in increasing load, not in the order they ran
        mark_knee(by_load(rows))
    elif len({r["request_rate"] for r in rows}) == 1 or len({r["max_concurrency"] for r in rows}) == 1:
        mark_knee(rows)
    else:  # a grid of rates x concurrencies: its loads are no one line along which a knee means anything
        for row in rows:
            row["knee"], row["knee_reason"] = False, None
    out = _result(target, rows, singles, slo, flags, check, served, stopped)
    out["planned_loads"] = planned
    out["max_errors"] = limit.value if limit is not None else None
    if sweep is not None:
        out["profile"] = sweep.as_dict()
    return out


def _ramp_now(load, items) -> Callable[[float], float] | None:
    """A ramp's rate at t seconds into its load, for the live view: that of the last request due by then."""
    ramp = load.ramp
    if ramp is None or not items:
        return None
    due = [item.arrival for item in items]
    return lambda t: ramp.rate(items[max(bisect.bisect_right(due, t) - 1, 0)].index)


def _ramp_fields(row: dict[str, Any], ramp: Ramp, items, sent: int, t0: float) -> None:
    """A ramped load's row: the rate it reached, vLLM's rps_change_events, and each request's rate (vLLM's
    get_request yields it with the request) beside the other per-request arrays."""
    # requests go out in the order they are due (a cap queues them in that order): the sent ones are the first
    row["ramp_up_reached_rps"] = ramp.rate(items[sent - 1].index) if sent else None
    # when the rate first reached each whole number of requests/s (vLLM's timestamps: when the request went out;
    # here when it was due, on the wall clock)
    wall = time.time() - time.perf_counter() + t0
    last = int(ramp.start)
    events = [{"rps": last, "timestamp": datetime.fromtimestamp(wall).isoformat()}]
    for item in items[:sent]:
        now = int(ramp.rate(item.index))
        if now > last:
            at = datetime.fromtimestamp(wall + item.arrival).isoformat()
            events += [{"rps": v, "timestamp": at} for v in range(last + 1, now + 1)]
            last = now
    row["rps_change_events"] = events
    row["requests"]["request_rates"] = [ramp.rate(i) for i in row["requests"]["indices"]]


async def _connect(target: Target, flags: dict[str, Any], api_key: str | None, served: dict[str, Any]):
    from minisgl_cli.openai_client import HTTPStatusError, OpenAIClient, api_base
    from minisgl_cli.replay import failure, served_model

    try:
        client = OpenAIClient(target.url, timeout=flags["request_timeout"], api_key=api_key)  # type: ignore[arg-type]  # --url given
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--url") from e
    try:
        served["name"], served["engine"], _ = await served_model(client, flags["served_model"])
    except (OSError, ValueError, KeyError, HTTPStatusError, TimeoutError) as e:
        await client.close()
        # a server that accepts the connection but never answers times out, and a TimeoutError's text is empty
        why = failure(e, client.timeout) if isinstance(e, TimeoutError) else e
        raise typer.BadParameter(f"cannot reach {api_base(target.url)}/models: {why}", param_hint="--url") from e  # type: ignore[arg-type]  # --url given
    return client


async def _flush(client, engine) -> None:
    """--flush-cache: the server's prefix cache (vLLM's endpoint, else SGLang's), or the in-process engine's, emptied
    of every page no request holds; between loads nothing runs, so that is all of it."""
    if client is None:
        engine.call(lambda llm: llm.engine.clear_cache())  # on the engine's thread; done at its next step
        return
    answers = []
    for path in ("/reset_prefix_cache", "/flush_cache"):
        status, body = await client.post(path, {})
        if status == 200:
            return
        answers.append(f"{path}: {status} {body[:120].decode(errors='replace')}")
    why = "the server empties no prefix cache (" + "; ".join(answers) + ")"
    raise typer.BadParameter(why + "; vLLM's needs VLLM_SERVER_DEV_MODE=1", param_hint="--flush-cache")


async def _hits(client, target: Target):
    """Prefix-cache counters: the server's /metrics, or the in-process engine's."""
    from minisgl_cli.replay import scrape_metrics

    if client is not None:
        return await scrape_metrics(client)
    m = target.llm.metrics()  # between loads nothing runs: reading from this thread is safe
    return {"hits": m.cache_hit_tokens, "prompts": m.prompt_tokens}


def _hit_rate(before, after, target: Target, results, cut: str | None) -> float | None:
    """The prefix-cache hit rate over a load: the counters' difference, which count every prompt admitted. A load
    that Ctrl-C or --max-errors cut short had requests admitted and cancelled, which its figures leave out: its hit
    rate is then the completed requests' own hits (in-process, or as a server's answers carry them in
    usage.prompt_tokens_details, as minisgl's do), and n/a where a server's answers do not."""
    from minisgl_cli.replay import cache_hit_rate, completed_hit_rate

    if cut is not None:
        return completed_hit_rate(results)
    if target.url is not None:
        return cache_hit_rate(before, after)
    d = after["prompts"] - before["prompts"]
    return (after["hits"] - before["hits"]) / d if d else None


def _row(
    load, results, planned: int, duration: float, t0: float, slo, flags: dict[str, Any], check, cut: bool
) -> dict[str, Any]:
    """One load's figures; `cut`: Ctrl-C or --max-errors stopped it, so its figures cover only the requests finished
    by then."""
    from minisgl_cli.run_figures import client_usage, per_request, summarize

    row: dict[str, Any] = {
        "load": load.label,
        # a ramp has no one rate (vLLM writes its --request-rate, inf: it must be left unset beside a ramp)
        "request_rate": None if load.ramp is not None else "inf" if math.isinf(load.rate) else load.rate,
        "max_concurrency": load.max_concurrency,
        # constant gaps are gamma gaps of infinite shape (vLLM has no constant arrivals: its burstiness stands for both)
        "burstiness": "inf" if flags["arrival"] == "constant" else flags["burstiness"],
        "num_prompts": len(results),
        "planned_requests": planned,
    }
    if load.strategy is not None:  # a sweep's load: guidellm's strategy type
        row["strategy"] = load.strategy
    if load.ramp is not None:
        row.update(load.ramp.as_dict())
    row.update(summarize(results, duration, "e2el", slo))
    if flags["url"] is not None:
        row.update(client_usage(row, results, check.tok_per_s if check else None))
    row["partial"] = cut or row["failed"] > 0
    row["requests"] = per_request(results, t0, flags["save_detailed"])
    row["requests"]["cached_tokens"] = [r.cache_hit_tokens for r in results]  # None: the answer did not say
    return row


def _result(target: Target, rows, results, slo, flags, check, served, stopped) -> dict[str, Any]:
    from minisgl_cli.report import command_flags, environment

    llm = target.llm
    out: dict[str, Any] = {
        "benchmark": "bench-serve",
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "label": flags["label"],
        "backend": "openai-chat" if flags["endpoint"] == "chat" else "openai",
        "mode": "url" if target.url else "in-process",
        "url": target.url,
        "engine": "minisgl" if llm is not None else served.get("engine"),
        "model_id": served.get("name") or target.model,
        "tokenizer_id": target.model,
        **(llm.describe() if llm is not None else {"model": served.get("name")}),
        "gpu": _gpu(llm),
        "workload": {
            "source": served.get("source"),
            "input_len": None if flags["dataset"] else flags["input_len"],  # a dataset's prompts have their own
            "output_len": flags["output_len"],
            "prompt_format": "text" if flags["endpoint"] == "chat" else flags["prompt_format"],
            "prefix_groups": flags["prefix_groups"],
            "prefix_len": flags["prefix_len"] if flags["prefix_groups"] else 0,
            "arrival": flags["arrival"],
            "seed": flags["seed"],
            "warmup": flags["warmup"],
            "flush_cache": flags["flush_cache"],  # each load point started with an empty prefix cache
            "duration_limit": flags["duration"],
            # requests sent with a dataset's prompt cut to fit the context
            "truncated_prompts": sum(r["truncated_prompts"] for r in rows),
            # requests sent with a dataset's prompt given again (the warm-up's too)
            "repeated_prompts": served.get("warm_repeated", 0) + sum(r["repeated_prompts"] for r in rows),
            # a dataset's rows with an empty prompt, passed over
            "skipped_rows": served.get("skipped_rows", 0),
            # the dataset's prompt column: --dataset-column or the file's
            "dataset_column": served.get("column"),
        },
        "slo": {k: v * 1000 for k, v in slo.items()} if slo else None,
        "client_check": check.as_dict() if check else None,
        "partial": bool(stopped) or any(r["partial"] for r in rows),
        "stopped": stopped,
        "sweep": rows,
        "environment": environment(),
        "flags": command_flags(flags),
    }
    if len(rows) == 1:  # a single run: vLLM's top-level fields and per-request arrays (`partial`: the run's, above)
        out.update({k: v for k, v in rows[0].items() if k not in ("requests", "load", "partial")})
        out.update(rows[0]["requests"])
    out["_results"] = results  # for the timeline plot; not written
    out["_skipped"] = served.get("skipped")  # the note on a dataset's rows skipped; not written
    return out


def _gpu(llm) -> str | None:
    if llm is None:
        return None
    import torch

    d = llm.engine.device
    return torch.cuda.get_device_name(d) if d.type == "cuda" else None


def _report(console, result: dict[str, Any], flags: dict[str, Any]) -> None:
    from minisgl_cli.report import write_json

    results, skipped = result.pop("_results"), result.pop("_skipped")
    console.print(_table(result, console.width))
    ramped = result["sweep"][0] if result["sweep"][0].get("ramp_up_strategy") else None
    if ramped is not None:
        _print_ramp(console, ramped, results, flags["duration"])
    if (profile := result.get("profile")) and profile["rates"]:
        rates = ", ".join(f"{r:.3g}" for r in profile["rates"])
        console.print(
            f"sweep (guidellm's): synchronous {profile['synchronous_rate']:.3g} req/s and throughput "
            f"{profile['throughput_rate']:.3g} req/s measured; {profile['rate_type']} loads at {rates} req/s, "
            "evenly spaced from one step above the first up to the second"
        )
    check = result["client_check"]
    if check:
        peak = max((r.get("client_peak_used_fraction") or 0.0) for r in result["sweep"])
        note = "  [yellow]the client may be the limit[/yellow]" if peak > 0.5 else ""
        console.print(
            f"client absorbed {check['tok_per_s']:,.0f} tok/s max (mock SSE server, {check['streams']} streams); "
            f"this run used {peak:.1%} of it in its busiest second{note}"
        )
    if skipped:
        console.print(f"[yellow]note:[/yellow] {skipped} (workload.skipped_rows)")
    if repeated := result["workload"]["repeated_prompts"]:
        console.print(
            f"[yellow]note:[/yellow] {result['workload']['source']} holds fewer prompts than the run sent: "
            f"{repeated:,} requests were given one of its prompts again (as vLLM's benchmarks oversample), which a "
            "prefix cache may still hold"
        )
    for row in result["sweep"]:
        if row["ran_out"]:
            sent = max(row["requests"]["send_times"])
            console.print(
                f"[yellow]note:[/yellow] {row['load']} sent all {row['num_prompts']:,} requests drawn for it "
                f"{sent:.1f} s into its --duration {flags['duration']:g} s, and stopped there: pass --num-requests "
                "to draw more"
            )
    for row in result["sweep"]:
        if row["stop_reason"] == "max_errors":
            ended = row["completed"] + row["failed"]
            at = f" (the ramp at {row['ramp_up_reached_rps']:.3g} req/s)" if row.get("ramp_up_strategy") else ""
            console.print(
                f"[yellow]note:[/yellow] {row['load']} reached --max-errors {result['max_errors']:g} "
                f"({row['failed']:,} of {ended:,} ended requests failed): stopped sending after "
                f"{_sent(row, flags['duration'] is not None)} requests{at}; "
                f"{row['incomplete']:,} then in flight cancelled, in no figure (guidellm's incomplete)"
            )
    if result["stopped"] == "interrupted":
        from minisgl_cli.report import interrupted_note

        cut, rows = result["sweep"][-1], len(result["sweep"])
        flight = f"{cut['incomplete']:,} in flight not counted"
        where = f" in load {cut['load']} ({rows} of {result['planned_loads']} loads; {flight})"
        done = cut["completed"] + cut["failed"]
        if flags["duration"] is not None:  # a time-bounded load sends what its time allows, not its drawn supply
            console.print(f"[yellow]partial results:[/yellow] interrupted after {done:,} requests finished{where}")
        else:
            console.print(interrupted_note(done, cut["planned_requests"], "requests", where))
    elif result["partial"]:
        first = next((e for r in result["sweep"] for e in r["errors"]), None)
        why = result["stopped"] or (f"first error: {first['error']}" if first else "")
        console.print(f"[yellow]partial results:[/yellow] {why}")
    if flags["json_path"] is not None:
        write_json(flags["json_path"], result)
        console.print(f"results written to {flags['json_path']}")
    if flags["csv_path"] is not None:
        _write_csv(flags["csv_path"], result["sweep"])
        console.print(f"rows written to {flags['csv_path']}")
    if flags["plot"] is not None:
        from minisgl_cli.plots import plot_sweep, plot_timeline

        where = result["url"] or f"{result['model_id']} in-process"
        limited = any(row["stop_reason"] == "max_errors" for row in result["sweep"])
        why = result["stopped"] or ("a load reached --max-errors" if limited else None)
        cut = f" (partial: {why})" if why else ""  # as the table and the JSON say
        if len(result["sweep"]) > 1:
            plot_sweep(result["sweep"], flags["plot"], f"bench-serve -> {where}{cut}")
        elif ramped is not None:
            from minisgl_cli.plots import plot_ramp

            title = f"bench-serve {ramped['load']} -> {where}{cut}"  # "linear ramp 2->20, conc 4": no unit to add
            log_rate = ramped["ramp_up_strategy"] == "exponential"
            plot_ramp(results, _rates_of(ramped, results), flags["plot"], title, log_rate)
        else:
            plot_timeline(results, flags["plot"], f"bench-serve {result['sweep'][0]['load']} -> {where}{cut}")
        console.print(f"plot written to {flags['plot']}")


RAMP_TABLE_BANDS = 5  # the console's groups of a ramp's requests


def _rates_of(row: dict[str, Any], results) -> list[float]:
    """Each result's rate: the row's per-request arrays are the results', in their order."""
    assert len(row["requests"]["request_rates"]) == len(results)
    return row["requests"]["request_rates"]


def _print_ramp(console, row: dict[str, Any], results, duration: float | None) -> None:
    """What the ramp was and how far it got, and the latencies along it (the row's p50/p99 mix every rate it sent
    at)."""
    from minisgl_cli.report import fmt, kv_table
    from minisgl_cli.run_figures import rate_bands

    linear = row["ramp_up_strategy"] == "linear"
    formula = "start + (end - start) * i/(N-1)" if linear else "start * (end/start)^(i/(N-1))"
    reached = row["ramp_up_reached_rps"]
    console.print(
        f"ramp (vLLM's --ramp-up-strategy {row['ramp_up_strategy']}): {row['ramp_up_start_rps']:g} to "
        f"{row['ramp_up_end_rps']:g} req/s over N = {row['ramp_up_requests']:,} requests, request i sent at "
        f"{formula} req/s, over {row['ramp_up_span_s']:.3g} s as planned; reached {fmt(reached, 3)} req/s"
    )
    if duration is not None and row["stop_reason"] is None and row["sent_requests"] < row["ramp_up_requests"]:
        console.print(
            f"[yellow]note:[/yellow] --duration {duration:g} s ended the ramp at request {row['sent_requests']:,} "
            f"of {row['ramp_up_requests']:,}, before its end rate (without --num-requests a ramp is spread over as "
            "many requests as --duration holds)"
        )
    bands = rate_bands(results, _rates_of(row, results), RAMP_TABLE_BANDS)
    lines = [
        (
            f"{b['from_rps']:.3g}" + (f"-{b['to_rps']:.3g}" if b["to_rps"] != b["from_rps"] else ""),
            f"{b['completed']:,} / {b['failed']:,}",
            f"{fmt(b['median_ttft_ms'])} / {fmt(b['p99_ttft_ms'])}",
            f"{fmt(b['median_tpot_ms'])} / {fmt(b['p99_tpot_ms'])}",
        )
        for b in bands
    ]
    cols = ("sent at req/s", "done / failed", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)")
    console.print(kv_table("along the ramp (groups of as many requests)", lines, cols))


CSV_SKIP = ("requests", "errors", "rps_change_events")


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    from minisgl_cli.report import writing

    fields = [k for k in rows[0] if k not in CSV_SKIP]
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


def _sent(row: dict[str, Any], timed: bool) -> str:
    """How many of a load's requests went out: of those planned, unless `timed` (a load bounded by --duration draws
    more than its time sends, so its planned count means nothing; but a ramp's, drawn to fit its time)."""
    timed = timed and not row.get("ramp_up_strategy")
    return f"{row['sent_requests']:,}" + ("" if timed else f" of {row['planned_requests']:,}")


def _stop_cell(row: dict[str, Any], timed: bool) -> str:
    """Why a load stopped early, and how many of its requests went out."""
    if row["stop_reason"] is None:
        return ""
    why = "max errors" if row["stop_reason"] == "max_errors" else row["stop_reason"]
    return f"{why}: {_sent(row, timed)} sent"


def _table(res: dict[str, Any], width: int = 200):
    """One column per load (as bench-offline's one per engine), one row per figure; the knee's column is marked, its
    reason under the table. Loads that do not fit `width` columns go on into a second table (and a third...): ten
    loads in one table of 80 columns cut every figure to "13.…"."""
    from rich.console import Group

    from minisgl_cli.report import fmt, kv_table

    rows = res["sweep"]

    def pct(v: float | None, digits: int = 1) -> str:
        return "n/a" if v is None else f"{v:.{digits}%}"

    lines: list[tuple] = [
        ("requests done / failed", *(f"{r['completed']:,} / {r['failed']:,}" for r in rows)),
        ("requests/s", *(r["request_throughput"] for r in rows)),
        ("output tok/s", *(r["output_throughput"] for r in rows)),
    ]
    for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2el"), ("client queue", "queue")):
        lines.append(
            (f"{label} p50 / p99 (ms)", *(f"{fmt(r[f'median_{key}_ms'])} / {fmt(r[f'p99_{key}_ms'])}" for r in rows))
        )
    lines.append(("cache hit rate", *(pct(r["cache_hit_rate"]) for r in rows)))
    if res["slo"] is not None:
        lines.append(("goodput (req/s)", *(r["request_goodput"] for r in rows)))
        lines.append(("met every SLO", *(pct(r["goodput_fraction"], 0) for r in rows)))
    if any(r.get("client_used_fraction") is not None for r in rows):
        lines.append(
            (
                "client load mean / peak",
                *(f"{pct(r['client_used_fraction'])} / {pct(r['client_peak_used_fraction'])}" for r in rows),
            )
        )
    if any(r["stop_reason"] for r in rows):
        timed = res["workload"]["duration_limit"] is not None
        lines.append(("stopped early", *(_stop_cell(r, timed) for r in rows)))
    where = res["url"] or f"{res['model_id']} on {res.get('device')}"
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in (res["slo"] or {}).items())  # as given: 0.2 ms showed as 0
    title = f"bench-serve -> {where} ({res['workload']['source']}{'; SLO ' + slo if slo else ''})"
    knee = next((i for i, r in enumerate(rows) if r["knee"]), None) if len(rows) > 1 else None
    heads = [f"{r['load']} ◀ knee" if i == knee else str(r["load"]) for i, r in enumerate(rows)]
    cells = [[fmt(v) for v in line[1:]] for line in lines]
    need = [max(len(h), *(len(c[i]) for c in cells)) + 3 for i, h in enumerate(heads)]  # with padding and border
    label_w = max(len(line[0]) for line in lines) + 4
    chunks: list[list[int]] = [[]]
    for i, n in enumerate(need):
        if chunks[-1] and label_w + sum(need[j] for j in chunks[-1]) + n > width:
            chunks.append([])
        chunks[-1].append(i)
    tables = []
    for k, cols in enumerate(chunks):
        part = [(line[0], *(cells[li][i] for i in cols)) for li, line in enumerate(lines)]
        table = kv_table(title if k == 0 else f"{title}, continued", part, ("", *(heads[i] for i in cols)))
        tables.append(table)
    if knee is not None:
        tables[-1].caption = f"knee at {rows[knee]['load']}: {rows[knee]['knee_reason']}"
        tables[-1].caption_justify = "left"
    return Group(*tables)
