"""Line-by-line chat on stdin/stdout (for pipes, logs and terminals without a TUI): same session, same slash
commands. Answers stream to stdout; per-turn numbers and command feedback go to stderr."""

from __future__ import annotations

import sys
from typing import TextIO

from engine.async_llm import AsyncLLM, EngineDeadError
from engine.llm import RequestOutput
from minisgl_cli.tui.commands import HELP, CommandError, is_command, run_command
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.stats import TurnStats, engine_rows, ms, turn_rows


def run_plain(
    engine: AsyncLLM,
    session: ChatSession,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> None:
    interactive = stdin.isatty()
    info = engine.llm.describe()
    print(
        f"minisgl chat · {info['model']} · {info['device']} · {info['dtype']} · attention {info['attention']} · "
        f"TP {info['tp']}   (/help for commands, Ctrl-D to quit)",
        file=stderr,
    )
    turn = TurnStats()
    while True:
        if interactive:
            stdout.write("\n> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        if is_command(line):
            _command(line, engine, session, turn, stderr)
            continue
        try:
            turn = _answer(engine, session, line, stdout)
        except (ValueError, EngineDeadError) as e:
            print(f"error: {e}", file=stderr)
            if isinstance(e, EngineDeadError):
                raise SystemExit(1) from e
            continue
        m = engine.call(lambda llm: llm.metrics())
        print(
            f"[{turn.finish_reason} · TTFT {ms(turn.ttft)} · {turn.decode_tps:.1f} tok/s · "
            f"{turn.output_tokens} tokens · cache hit {turn.cache_hit_tokens}/{turn.prompt_tokens} · "
            f"KV {m.kv_pages_in_use} in use, {m.kv_pages_cached} cached, {m.kv_pages_free} free]",
            file=stderr,
        )


def _answer(engine: AsyncLLM, session: ChatSession, text: str, stdout: TextIO) -> TurnStats:
    """Stream one answer to stdout; Ctrl-C stops it (the partial answer stays in the history)."""
    stream = engine.submit(session.messages(text), session.params())
    last: RequestOutput | None = None
    try:
        for out in stream:
            last = out
            stdout.write(out.delta_text)
            stdout.flush()
    except KeyboardInterrupt:
        engine.abort(stream.rid)
        for out in stream:  # drain to the final (aborted) output so the pages are back before the next turn
            last = out
    stdout.write("\n")
    stdout.flush()
    if last is None:
        raise EngineDeadError("engine stopped before answering")
    if last.token_ids and last.finish_reason != "error":
        session.commit(text, last.text)
    if last.finish_reason == "error":
        raise ValueError(f"generation failed: {last.error}")
    return TurnStats.from_output(last)


def _command(line: str, engine: AsyncLLM, session: ChatSession, turn: TurnStats, out: TextIO) -> None:
    try:
        result = run_command(line, session)
    except CommandError as e:
        print(f"error: {e}", file=out)
        return
    if result.action == "stats":
        rows = turn_rows(turn) + engine_rows(engine.call(lambda llm: llm.metrics()))
    elif result.action == "help":
        rows = HELP + [("Ctrl-C", "stop the answer"), ("Ctrl-D", "quit")]
    else:
        rows = [("", result.message)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}".rstrip() if key else value, file=out)
