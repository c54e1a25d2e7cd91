"""A conversation as Markdown or JSON (`/export md|json [path]`, `/export!` to write over a file)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict
from pathlib import Path

from minisgl_cli.tui.session import ChatSession, setting_text
from minisgl_cli.tui.stats import ms

FORMATS = ("md", "json")


def to_markdown(s: ChatSession) -> str:
    lines = [
        f"# {s.title or 'Chat'}",
        "",
        " · ".join(
            [f"Model: {s.model or '-'}", f"temperature {s.temperature:g}", f"max tokens {s.max_tokens}"]
            + [f"{name} {setting_text(value)}" for name, value in s.sampling.items()]
        ),
    ]
    if s.system:
        lines += ["", f"**System:** {s.system}"]
    for m in s.history:
        lines += ["", f"## {'You' if m.role == 'user' else 'Assistant'}", ""]
        if m.reasoning:
            lines += ["<details><summary>Thinking</summary>", "", m.reasoning.strip(), "", "</details>", ""]
        lines.append(m.content)
        if m.stats is not None:
            t = m.stats
            lines += [
                "",
                f"*{t.finish_reason or '?'} · TTFT {ms(t.ttft)} · TBT p50 {ms(t.tbt_p50)} · "
                f"{t.decode_tps:.1f} tok/s · {t.prompt_tokens} prompt / {t.output_tokens} output tokens*",
            ]
    return "\n".join(lines) + "\n"


def to_json(s: ChatSession) -> str:
    def message(m) -> dict:
        d: dict = {"role": m.role, "content": m.content}
        if m.reasoning:
            d["reasoning"] = m.reasoning
        if m.stats is not None:
            stats = asdict(m.stats)
            del stats["itls"]
            d["stats"] = stats | {
                "tbt_p50": m.stats.tbt_p50,
                "tbt_p90": m.stats.tbt_p90,
                "decode_tps": m.stats.decode_tps,
            }
        return d

    doc = {
        "id": s.id,
        "title": s.title,
        "model": s.model,
        "system": s.system,
        "temperature": s.temperature,
        "max_tokens": s.max_tokens,
        **s.sampling,
        "thinking": s.thinking,
        "messages": [message(m) for m in s.history],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def export(s: ChatSession, fmt: str, path: str = "", overwrite: bool = False) -> Path:
    """Write the conversation; the default file is minisgl-chat-<id or time>.<fmt> in the current directory. A file
    that exists is written over only with `overwrite` (`/export!`): FileExistsError says so. OSError when it cannot
    be written."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be md or json (got {fmt!r})")
    target = Path(path).expanduser() if path else Path(f"minisgl-chat-{s.id or time.strftime('%Y%m%d-%H%M%S')}.{fmt}")
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a directory")
    text = to_markdown(s) if fmt == "md" else to_json(s)
    try:
        with target.open("w" if overwrite else "x", encoding="utf-8") as f:  # "x": the check and the write at once
            f.write(text)
    except FileExistsError:
        again = " ".join(["/export!", fmt] + ([path] if path else []))
        raise FileExistsError(f"{target} exists: {again} writes over it") from None
    return target


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n(.*?)(?:^ {0,3}\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, without their fences; an unclosed last one runs to the end (as
    Markdown renders it: a stopped answer)."""
    return [m.group(2) for m in _FENCE.finditer(markdown)]
