"""`minisgl serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn) over the in-process engine.
Under torchrun, rank 0 serves HTTP and the other ranks follow the engine steps it broadcasts."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from minisgl_cli.options import (
    Backend,
    Device,
    Dtype,
    GraphBs,
    KvCacheGb,
    MaxModelLen,
    MaxPrefill,
    MaxRunning,
    MemoryFraction,
    Model,
    NoOverlap,
    NoRadix,
    NumPages,
    PageSize,
    Seed,
    Tp,
    engine_config,
    load_llm,
)


class LogLevel(enum.StrEnum):
    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"


Host = Annotated[str, typer.Option(help="address to listen on (0.0.0.0: all interfaces)")]
Port = Annotated[int, typer.Option(help="TCP port (0: any free port)", min=0, max=65535)]
MaxQueued = Annotated[
    int | None,
    typer.Option(
        help="answer 429 once this many requests wait beyond --max-running-requests (default: no limit)", min=0
    ),
]
ServedName = Annotated[
    str | None,
    typer.Option(help="the model name clients send as `model` (default: --model, or the embedded model's name)"),
]
Level = Annotated[LogLevel, typer.Option(help="uvicorn log level")]


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: Model = None,
        device: Device = "auto",
        dtype: Dtype = "auto",
        page_size: PageSize = 16,
        num_pages: NumPages = None,
        kv_cache_gb: KvCacheGb = None,
        memory_fraction: MemoryFraction = 0.85,
        max_running_requests: MaxRunning = 256,
        max_prefill_tokens: MaxPrefill = 8192,
        max_model_len: MaxModelLen = None,
        no_radix_cache: NoRadix = False,
        attention_backend: Backend = "auto",
        cuda_graph_max_bs: GraphBs = 256,
        no_overlap: NoOverlap = False,
        tp: Tp = 1,
        seed: Seed = 0,
        host: Host = "127.0.0.1",
        port: Port = 8000,
        max_queued_requests: MaxQueued = None,
        served_model_name: ServedName = None,
        log_level: Level = LogLevel.info,
    ) -> None:
        """Serve the model over an OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions,
        /v1/models, /health, /metrics."""
        config = engine_config(**locals())
        llm = load_llm(config)
        from engine.distributed import TP

        if tp > 1 and TP.rank != 0:
            # ---- TP follower hook -------------------------------------------------------------------------
            # Ranks other than 0 serve no HTTP: they run the engine steps rank 0 broadcasts until it shuts down.
            from engine.tp_follower import run_tp_follower

            run_tp_follower(llm)
            return
        run_server(llm, host, port, served_model_name or model, max_queued_requests, log_level.value)


def run_server(
    llm,
    host: str,
    port: int,
    model_name: str | None = None,
    max_queued_requests: int | None = None,
    log_level: str = "info",
) -> None:
    """Serve `llm` until interrupted (Ctrl-C / SIGTERM), then stop the engine loop."""
    import uvicorn
    from rich.console import Console

    from engine.async_llm import AsyncLLM
    from minisgl_cli.server import create_app

    async_llm = AsyncLLM(llm)
    try:
        app = create_app(async_llm, model_name, max_queued_requests)
        name = app.state.client.model_name
        d = llm.describe()
        Console(stderr=True, soft_wrap=True).print(
            f"[bold]minisgl serve[/bold]: model [cyan]{name}[/cyan] on {d['device']} ({d['dtype']}, "
            f"{d['attention']} attention, tp={d['tp']}) at http://{host}:{port}/v1"
        )
        # No lifespan hooks here; with them on, a second Ctrl-C (torchrun forwards the terminal's to rank 0
        # again) cancels uvicorn's lifespan task and logs a traceback on an otherwise clean shutdown.
        uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="off")
    finally:
        async_llm.shutdown()
