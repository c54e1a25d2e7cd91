"""Slash commands shared by the TUI and the plain mode: parse a line, apply it to the ChatSession, and say
what the front end should do next. Bad input raises CommandError with a message meant for the user."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from minisgl_cli.tui.backend import BackendError, ChatBackend
from minisgl_cli.tui.export import FORMATS
from minisgl_cli.tui.session import SAMPLING_OFF, ChatSession, Setting, go_on_with, parse_stop, setting_text

DELETE_KEY = "ctrl+shift+delete"  # the chat's key for /delete, as its help and its notices name it

HELP: list[tuple[str, str]] = [
    ("/reset", "start a new conversation (keeps the settings)"),
    ("/system <text>", "set the system prompt (ctrl+j for more lines); /system alone clears it"),
    ("/temp <x>", "sampling temperature, 0 = greedy"),
    ("/max-tokens <n>", "longest answer in tokens"),
    (
        "/set <name> <value>",
        'top_p, top_k, min_p, repetition_penalty, presence_/frequency_penalty, seed, stop <strings> ("a b", \\n);'
        " off resets",
    ),
    ("/think on|off", "thinking of reasoning models (chat templates with enable_thinking)"),
    ("/model [name|n]", "the models the server serves, or answer with this one (--url)"),
    ("/regen", "answer the last message again"),
    ("/edit [text]", "edit the last message and send it again; /edit <text> sends the text in its place"),
    (
        "/copy [code [n]]",
        "copy the last answer, or its n-th code block (default: the last); a click copies any message",
    ),
    ("/export md|json [path]", "write the conversation to a file (/export! writes over one that exists)"),
    ("/sessions", "saved conversations: open, rename, delete"),
    ("/rename <title>", "rename this conversation"),
    ("/delete", f"delete this conversation (run twice, as {DELETE_KEY})"),
    ("/stats", "the chat's settings, the last turn's numbers and the engine's"),
    ("/help", "this help"),
]

Action = Literal["reset", "info", "stats", "help", "regen", "edit", "copy", "export", "sessions", "delete", "model"]


class CommandError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CommandResult:
    action: Action
    message: str = ""
    args: tuple[str, ...] = ()


def is_command(line: str) -> bool:
    return line.lstrip().startswith("/")


def takes_lines(line: str) -> bool:
    """A command whose argument may span lines (a system prompt or an edited message typed with ctrl+j or pasted);
    any other text of several lines that starts with "/" (a pasted path, code) is a message."""
    return line.split(maxsplit=1)[0] in ("/system", "/edit")


def run_command(line: str, session: ChatSession, thinking_switch: bool | None = None) -> CommandResult:
    """thinking_switch: whether the model's chat template has enable_thinking (None: unknown, a server's)."""
    name, *rest = line.strip().split(maxsplit=1)  # any whitespace: "/system" then a new line holds the prompt
    arg = rest[0].strip() if rest else ""
    if name == "/reset":
        session.reset()
        return CommandResult("reset", "new conversation")
    if name == "/system":
        session.system = arg or None
        return CommandResult("info", f"system prompt set: {arg}" if arg else "system prompt cleared")
    if name == "/temp":
        value = _number(name, arg, float, session.temperature)
        _apply(session.set_temperature, value)
        return CommandResult("info", f"temperature = {session.temperature:g}")
    if name == "/max-tokens":
        value = _number(name, arg, int, session.max_tokens)
        _apply(session.set_max_tokens, value)
        return CommandResult("info", f"max tokens = {session.max_tokens}")
    if name == "/set":
        return _set(arg, session)
    if name == "/think":
        if arg not in ("on", "off"):
            raise CommandError(f"/think takes on or off (got {arg!r})" if arg else "/think needs on or off")
        if thinking_switch is False:
            raise CommandError("this model's chat template has no enable_thinking switch")
        session.thinking = arg == "on"
        return CommandResult("info", f"thinking {arg}")
    if name == "/rename":
        if not arg:
            raise CommandError("/rename needs a title")
        session.title = arg
        return CommandResult("info", f"renamed to {arg}")
    if name in ("/export", "/export!"):  # as vim's :w!, the "!" writes over a file that exists
        fmt, _, path = arg.partition(" ")
        if fmt not in FORMATS:
            raise CommandError(f"{name} takes md or json, then an optional path (got {fmt!r})")
        return CommandResult("export", args=(fmt, path.strip(), "overwrite" if name == "/export!" else ""))
    if name == "/copy":
        what, _, n = arg.partition(" ")
        n = n.strip()
        # ASCII digits only: "²" and "①" are digits to str.isdigit, and int() refused them (a traceback)
        if what not in ("", "code") or (n and not (n.isascii() and n.isdigit() and int(n) >= 1)):
            raise CommandError(f"/copy takes nothing, code, or code <n> with n >= 1 (got {arg!r})")
        return CommandResult("copy", args=(what, n))
    if name == "/edit":
        return CommandResult("edit", args=(arg,) if arg else ())
    if name in ("/regen", "/sessions", "/delete"):
        if arg:  # "/regen please" ran /regen and dropped the rest without a word
            raise CommandError(f"{name} takes nothing (got {arg!r})")
        return CommandResult(name[1:])  # type: ignore[arg-type]  # one of these action names, checked above
    if name == "/model":
        return CommandResult("model", args=(arg,))  # the front end awaits model_command: it asks the backend
    if name == "/stats":
        return CommandResult("stats")
    if name == "/help":
        return CommandResult("help")
    raise CommandError(f"unknown command {name!r}; /help lists the commands")


async def model_command(arg: str, session: ChatSession, backend: ChatBackend) -> str | list[tuple[str, str]]:
    """`/model`: the rows of the models the backend serves, numbered, the one answering marked; `/model <name>` (or
    its number in that list): the chat goes on with it (saved and exported under it, as a chat reopened with another
    model), and the message says so. CommandError: the list cannot be had, no such model, or the backend runs one
    model (the local engine)."""
    try:
        served = await backend.models()
    except BackendError as e:
        raise CommandError(f"cannot list the models: {e}") from None
    if not arg:
        rows = [(str(i), m + (" (answering)" if m == backend.model else "")) for i, m in enumerate(served, 1)]
        if not backend.switches_models:
            more = "the model this chat's engine loaded: another one needs a restart (minisgl chat --model ...)"
        else:
            more = "/model <name or number> switches" if len(served) > 1 else "the only model the server serves"
        return [*rows, ("", more)]
    number = arg.isascii() and arg.isdigit() and 1 <= int(arg) <= len(served) and arg not in served
    model = served[int(arg) - 1] if number else arg
    if model == backend.model:
        return f"{model} answers already"
    try:
        backend.use_model(model)
    except ValueError as e:
        raise CommandError(str(e)) from None
    go_on_with(session, model)
    said = f"model: {model} answers from here on"
    session.max_tokens_limit = limit = backend.context_limit
    if limit is not None and session.max_tokens >= limit:  # as a chat resumed with a smaller model (fit_session)
        session.max_tokens = limit - 1
        said += f" (max tokens cut to {session.max_tokens}, below its context of {limit})"
    return said


def _set(arg: str, session: ChatSession) -> CommandResult:
    """`/set <name> <value>`: one of the engine's sampling fields, by its API name (top_p, or top-p); `off` (or the
    field's off value) takes it out of the requests."""
    field, value = (arg.split(maxsplit=1) + ["", ""])[:2]  # any whitespace between: a tab typed or pasted too
    field, value = field.replace("-", "_"), value.strip()
    if field in ("temperature", "max_tokens"):  # their own commands, reachable by their API names too
        return run_command(f"{'/temp' if field == 'temperature' else '/max-tokens'} {value}", session)
    if field not in SAMPLING_OFF:
        names = ", ".join(SAMPLING_OFF)
        raise CommandError(
            f"/set takes one of {names} and a value (got {field!r})"
            if field
            else f"/set needs one of {names} and a value"
        )
    if not value:
        raise CommandError(f"/set {field} needs a value or off (now {_shown(session, field)})")
    if value == "off":  # bare: '"off"' is a stop string
        session.set_sampling(field, None)
    else:
        _apply(lambda v: session.set_sampling(field, v), _setting(field, value))
    return CommandResult("info", f"{field} = {_shown(session, field)}")


def _setting(field: str, value: str) -> Setting:
    """/set's text as the field's value: stop's strings (session.parse_stop), or a number."""
    if field == "stop":
        try:
            return parse_stop(value)
        except ValueError as e:
            raise CommandError(str(e)) from None
    return _number(f"/set {field}", value, int if field in ("top_k", "seed") else float, 0)


def _shown(session: ChatSession, field: str) -> str:
    return setting_text(session.sampling[field]) if field in session.sampling else "off"


def _number(name: str, arg: str, kind: type, current: float) -> float:
    if not arg:
        raise CommandError(f"{name} needs a value, e.g. {name} {current:g} (now {current:g})")
    try:
        if "_" in arg:  # Python's digit grouping: "1_0" read as 10 was refused as "got 10.0"
            raise ValueError(arg)
        return kind(arg)
    except ValueError:
        raise CommandError(f"{name}: {arg!r} is not {'an integer' if kind is int else 'a number'}") from None


def messages_count(n: int) -> str:
    return f"{n} message{'' if n == 1 else 's'}"


def _apply(setter, value) -> None:
    try:
        setter(value)
    except ValueError as e:
        raise CommandError(str(e)) from None
