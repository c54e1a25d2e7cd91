"""One chat conversation: its settings, its messages (with each answer's numbers), and what the next turn sends."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from minisgl_cli.tui.turn import TurnStats

MAX_TEMPERATURE = 2.0
Setting = float | int | list[str]  # a sampling field's value: a number, or stop's strings
# The engine's sampling fields a chat may set beyond temperature and max tokens, with the value that means "off" (the
# API's default, which the chat then leaves out of its requests): `/set <name> <value>`, and flags of `minisgl chat`.
SAMPLING_OFF: dict[str, Setting | None] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "seed": None,
    "stop": [],
}
# A second "off" of two of them: top_k 0 (all tokens, as -1) and seed -1 (SamplingParams reads it as no seed, as vLLM)
ALSO_OFF: dict[str, int] = {"top_k": 0, "seed": -1}
# The engine and `serve` take any number of stop strings, but OpenAI's API takes 4, and a chat may go there (--url).
MAX_STOP = 4


def sampling_given(params: SamplingParams) -> dict[str, Setting]:
    """The SAMPLING_OFF fields `params` sets to something other than the API's default: what a turn sends a server,
    and what the model's generation_config.json may not fill in."""
    return {k: getattr(params, k) for k, off in SAMPLING_OFF.items() if getattr(params, k) != off}


def setting_text(value: Setting) -> str:
    """A SAMPLING_OFF field's value as /set, /stats and the exports write it: a float by `g` (0.9, 1e-05), an integer
    (top_k, seed) whole (`g` made seed 1234567890 "1.23457e+09", and top_k 1000000 "1e+06"), stop strings each
    quoted with its escapes, as `/set stop` takes them back."""
    if isinstance(value, list):
        return " ".join(f'"{s.translate(_ESCAPED)}"' for s in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# The escapes of a stop string, as llama.cpp's CLI reads them (its -e): a newline cannot be typed in the chat's input.
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
_ESCAPED = str.maketrans({"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", '"': '\\"'})


def _escape(c: str) -> str:
    """The character that a backslash and `c` stand for."""
    if c.isspace():  # a shell's escaped space (`User:\ Bob`): "\  is no escape" hid the character
        why = 'drop the \\ (/set stop takes a string with spaces in quotes: "a b")'
        raise ValueError(f"stop: \\ before {c!r} is no escape: {why}")
    if c not in _ESCAPES:
        what = f"\\{c} is no escape" if c else "a \\ at the end escapes nothing"
        raise ValueError(f"stop: {what} (there are \\n \\t \\r \\\" \\' and \\\\ for a backslash)")
    return _ESCAPES[c]


def unescape(text: str) -> str:
    """One stop string as `--stop` gives it: the text with its escapes (\\n a newline, \\\\ a backslash...)."""
    return re.sub(r"\\(.?)", lambda m: _escape(m.group(1)), text, flags=re.DOTALL)


def parse_stop(text: str) -> list[str]:
    """`/set stop`'s strings: apart by whitespace, as ollama's `/set parameter stop a b`; one in quotes ("..." or
    '...') may hold spaces; the escapes of `unescape` count in and out of quotes. ValueError names a bad escape or an
    unclosed quote."""
    strings: list[str] = []
    word: str | None = None  # the string being read; None between strings
    quote = ""  # the quote the string is inside, if any
    chars = iter(text)
    for c in chars:
        if c == "\\":
            word = (word or "") + _escape(next(chars, ""))
        elif c == quote:  # the closing one
            quote = ""
        elif quote:
            word = (word or "") + c
        elif c in "\"'":  # "" is a string too: an empty one, which the engine refuses by name
            quote, word = c, word or ""
        elif c.isspace():
            if word is not None:
                strings.append(word)
            word = None
        else:
            word = (word or "") + c
    if quote:
        raise ValueError(f"stop: a {quote} is not closed")
    return strings if word is None else [*strings, word]


def title_of(text: str) -> str:
    """A chat's title until /rename: its first message, on one line, cut at 60 characters."""
    return " ".join(text.split())[:60]


@dataclass(slots=True)
class ChatMessage:
    role: str  # system | user | assistant
    content: str
    reasoning: str = ""  # an answer's thinking (<think>...</think>), shown apart and never sent back
    stats: TurnStats | None = None  # an answer's numbers
    created: float = 0.0  # wall-clock time (time.time())


@dataclass(slots=True)
class ChatSession:
    system: str | None = None
    temperature: float = 0.7
    max_tokens: int = 512
    max_tokens_limit: int | None = None  # the tokens one request may span (the context, or a smaller KV pool's)
    thinking: bool | None = None  # the chat template's enable_thinking; None: the template's default
    sampling: dict[str, Setting] = field(default_factory=dict)  # the SAMPLING_OFF fields set to something else
    history: list[ChatMessage] = field(default_factory=list)
    id: int | None = None  # row in the session store, once saved
    saved_at: float | None = None  # the row's `updated` as this chat last read or wrote it (store.ChatStore.save)
    saved_title: str | None = None  # the row's title as this chat last read or wrote it (a rename elsewhere stands)
    title: str = ""
    model: str = ""

    def __post_init__(self) -> None:
        self.set_temperature(self.temperature)
        self.set_max_tokens(self.max_tokens)
        for name, value in list(self.sampling.items()):
            self.set_sampling(name, value)

    def set_temperature(self, value: float) -> None:
        if not (math.isfinite(value) and 0 <= value <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (got {value!r})")
        self.temperature = abs(value)  # -0.0 is in the range, and was shown (/temp, /stats, the exports) as -0

    def set_max_tokens(self, value: int) -> None:
        limit = self.max_tokens_limit
        if value < 1 or (limit is not None and value >= limit):
            top = f" and below the context of {limit} tokens (the model's, or a smaller KV cache's)" if limit else ""
            raise ValueError(f"max_tokens must be >= 1{top} (got {value})")
        self.max_tokens = value

    def set_sampling(self, name: str, value: Setting | None) -> None:
        """One of SAMPLING_OFF's fields; its "off" value (None included, and ALSO_OFF's) takes it out. ValueError names
        a bad name or value (the engine's own check of the field)."""
        if name not in SAMPLING_OFF:
            raise ValueError(f"no sampling setting {name!r} (there are: {', '.join(SAMPLING_OFF)})")
        if value is None or value == SAMPLING_OFF[name] or value == ALSO_OFF.get(name):
            self.sampling.pop(name, None)
            return
        if name == "stop":
            if not isinstance(value, list):  # SamplingParams would take one string as a list of it
                raise ValueError(f"stop must be a list of strings (got {value!r})")
            if len(value) > MAX_STOP:
                raise ValueError(f"stop takes at most {MAX_STOP} strings, as OpenAI's API (got {len(value)})")
            value = list(value)  # the session's own
        elif name in ("top_k", "seed") and not (isinstance(value, int) and not isinstance(value, bool)):
            raise ValueError(f"{name} must be an integer (got {value!r})")
        SamplingParams(**{name: value})  # type: ignore[arg-type]  # the engine's range check, its message
        self.sampling[name] = value

    def messages(self, keep: int | None = None) -> list[dict[str, str]]:
        """What the next turn sends: the system prompt and the conversation so far (ending with the user's turn), or
        its first `keep` messages (a turn in place of the later ones: /regen, /edit)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": m.role, "content": m.content} for m in self.history[:keep]]

    def answer_again_from(self) -> int | None:
        """Where /regen's turn starts (the messages from there are replaced): the whole conversation when it ends with
        the user's message (a failed turn left it unanswered), else before the last answer; None when there is none
        to answer again."""
        if self.awaiting_answer:
            return len(self.history)
        last = self.last("assistant")
        return last if last is not None and last == len(self.history) - 1 else None

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, **self.sampling)  # type: ignore[arg-type]

    def add(self, message: ChatMessage) -> None:
        self.history.append(message)
        if not self.title and message.role == "user":
            self.title = title_of(message.content)

    @property
    def awaiting_answer(self) -> bool:
        """The last message is the user's: the next turn answers it (after a failed turn, or to regenerate)."""
        return bool(self.history) and self.history[-1].role == "user"

    def last(self, role: str) -> int | None:
        """Index of the last message of `role`."""
        return next((i for i in range(len(self.history) - 1, -1, -1) if self.history[i].role == role), None)

    def cut(self, index: int) -> None:
        """Drop history[index:] (an answer asked again, a message edited). A title named after the first message (not
        renamed) goes with it, so that the message sent in its place names the chat."""
        if index == 0 and self.history and self.title == title_of(self.history[0].content):
            self.title = ""
        del self.history[index:]

    def reset(self) -> None:
        """A new, unsaved conversation with the same settings."""
        self.history.clear()
        self.id, self.title, self.saved_at, self.saved_title = None, "", None, None

    @property
    def turns(self) -> int:
        return sum(m.role == "assistant" for m in self.history)


def go_on_with(session: ChatSession, model: str) -> str | None:
    """`model` answers the chat from now on. A saved chat reopened with another model (`--resume` after `-m other`,
    ctrl+o, `--url`) went on without a word, and its row and exports kept naming the model it began with: it now takes
    the model answering, and the returned notice says so (None: the same model, or a new chat)."""
    before, session.model = session.model, model
    return f"this chat was with {before}; {model} answers from here on" if before and before != model else None


def fit_session(
    resumed: ChatSession | None,
    limit: int | None,
    system: str | None,
    temperature: float,
    max_tokens: int,
    sampling: dict[str, Setting] | None = None,
) -> ChatSession:
    """The chat's session against a model of `limit` tokens of context: `resumed` with its answer length cut to fit,
    or a new one with these settings (ValueError: one of them is out of range)."""
    if resumed is not None:
        resumed.max_tokens_limit = limit
        if limit is not None and resumed.max_tokens >= limit:
            resumed.max_tokens = limit - 1
        return resumed
    return ChatSession(
        system=system,
        temperature=temperature,
        max_tokens=max_tokens,
        max_tokens_limit=limit,
        sampling=dict(sampling or {}),
    )
