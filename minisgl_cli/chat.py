"""`minisgl chat`: a Textual chat TUI with live TTFT/TBT and KV-cache numbers, or a plain line-by-line chat
(--no-tui, or automatically when stdin/stdout is not a terminal)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from minisgl_cli.options import (
    Backend,
    Device,
    Dtype,
    GraphBs,
    KvCacheGb,
    MaxBatchTokens,
    MaxModelLen,
    MaxRunning,
    MemoryFraction,
    MixedBatch,
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

System = Annotated[str | None, typer.Option("--system", "-s", help="system prompt")]
Temperature = Annotated[
    float, typer.Option("--temperature", "-t", help="sampling temperature (0 = greedy)", min=0.0, max=2.0)
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="longest answer in tokens", min=1)]
NoTui = Annotated[bool, typer.Option("--no-tui", help="plain line-by-line chat on stdin/stdout")]


def chat(
    model: Model = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    page_size: PageSize = 16,
    num_pages: NumPages = None,
    kv_cache_gb: KvCacheGb = None,
    memory_fraction: MemoryFraction = 0.85,
    max_running_requests: MaxRunning = 256,
    max_batch_tokens: MaxBatchTokens = 8192,
    max_model_len: MaxModelLen = None,
    no_radix_cache: NoRadix = False,
    attention_backend: Backend = "auto",
    cuda_graph_max_bs: GraphBs = 256,
    no_overlap: NoOverlap = False,
    mixed_batch: MixedBatch = False,
    tp: Tp = 1,
    seed: Seed = 0,
    system: System = None,
    temperature: Temperature = 0.7,
    max_tokens: MaxTokens = 512,
    no_tui: NoTui = False,
) -> None:
    """Chat with a model in the terminal, watching TTFT, TBT and KV-cache usage live."""
    config = engine_config(**locals())  # takes the engine flags, ignores the chat ones
    from engine.async_llm import AsyncLLM
    from minisgl_cli.tui.session import ChatSession

    llm = load_llm(config)
    try:
        session = ChatSession(
            system=system, temperature=temperature, max_tokens=max_tokens, max_tokens_limit=llm.engine.max_model_len
        )
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--max-tokens") from e
    # Tensor parallel: ranks other than 0 run the engine's follower loop here and return; only rank 0 chats.
    engine = AsyncLLM(llm)
    try:
        if no_tui or not (sys.stdin.isatty() and sys.stdout.isatty()):
            from minisgl_cli.tui.plain import run_plain

            run_plain(engine, session)
        else:
            from minisgl_cli.tui.app import ChatApp

            ChatApp(engine, session).run()
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()


def register(app: typer.Typer) -> None:
    app.command()(chat)
