"""One answer as the front ends see it, whichever backend produced it: the pieces it streams in (`Piece`), and its
numbers (`TurnStats`), measured by `TurnMeter` from the pieces' token times."""

from __future__ import annotations

from dataclasses import dataclass, field

from minisgl_cli.report import percentile
from minisgl_cli.tui.thinking import ThinkSplitter


@dataclass(slots=True)
class Piece:
    """New output of an answer. Times are time.perf_counter() seconds: the engine's own token times from the
    local engine (engine/ipc.py); from a server, each streamed chunk's arrival, spread over the tokens it carries
    (server_backend.token_times)."""

    text: str = ""  # answer text as generated (may hold <think> tags)
    reasoning: str = ""  # thinking a server already split off (`reasoning_content`)
    token_times: list[float] = field(default_factory=list)  # one per new token
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    prompt_tokens: int | None = None
    cache_hit_tokens: int | None = None
    output_tokens: int | None = None  # the backend's own count, when it has one (a server's usage)


@dataclass(slots=True)
class TurnStats:
    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens, those inside <think>...</think>
    ttft: float | None = None  # seconds
    itls: list[float] = field(default_factory=list)  # inter-token gaps (TBT), seconds: one per token after the first
    decode_seconds: float = 0.0  # first token to last token
    finish_reason: str | None = None

    @property
    def decode_tps(self) -> float:
        """Tokens after the first over the time from the first to the last. A server's chunk may carry several tokens
        (minisgl's and vLLM's detokenizers hold a token back until its UTF-8 character is whole: an emoji or CJK text
        comes 2-3 tokens a chunk), so the tokens are the usage's count where it is larger than the gaps (a server
        without continuous usage, whose chunks count one token each): counting the chunks showed a third of the
        decode rate."""
        tokens = max(len(self.itls), self.output_tokens - 1)
        return tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tbt_p50(self) -> float:
        return tbt_percentile(self.itls, 50)

    @property
    def tbt_p90(self) -> float:
        return tbt_percentile(self.itls, 90)


def tbt_percentile(gaps: list[float], q: float) -> float:
    """As the benchmarks compute it (report.percentile, interpolated); 0 for no gaps."""
    return percentile(sorted(gaps), q) if gaps else 0.0


class TurnMeter:
    """Accumulates one answer's numbers from its pieces."""

    def __init__(self, started: float) -> None:
        self.started = started  # when the request was sent (perf_counter)
        self.times: list[float] = []
        self.stats = TurnStats()

    def add(self, piece: Piece, thinking: bool) -> TurnStats:
        """`thinking`: this piece's tokens belong to the thinking (the splitter was inside <think> for it)."""
        s, t = self.stats, self.times
        first = not t
        for now in piece.token_times:
            # a server's first chunk of several tokens: stamped alike, they came at TTFT, their gaps unknown
            if t and not (first and now == t[0]):
                s.itls.append(now - t[-1])
            t.append(now)
        if thinking:
            s.reasoning_tokens += len(piece.token_times)
        s.output_tokens = max(len(t), piece.output_tokens or 0)
        s.ttft = t[0] - self.started if t else None
        s.decode_seconds = t[-1] - t[0] if len(t) > 1 else 0.0
        if piece.prompt_tokens is not None:
            s.prompt_tokens = piece.prompt_tokens
        if piece.cache_hit_tokens is not None:
            s.cache_hit_tokens = piece.cache_hit_tokens
        if piece.finished:
            s.finish_reason = piece.finish_reason
        return s


class TurnReader:
    """Reads an answer's pieces for a front end: splits thinking from the answer and measures the turn."""

    def __init__(self, started: float, opens_in_thinking: bool = False) -> None:
        self.splitter = ThinkSplitter(opens_in_thinking)
        self.meter = TurnMeter(started)
        self.content = self.reasoning = ""
        self.finished = False
        self.error: str | None = None

    def add(self, piece: Piece) -> tuple[str, str]:
        """The piece's new (thinking, answer) text."""
        was_inside = self.splitter.inside
        thought, said = self.splitter.feed(piece.text)
        if piece.finished:
            more_thought, more_said = self.splitter.flush()
            thought, said = thought + more_thought, said + more_said
        thought = piece.reasoning + thought
        self.meter.add(piece, was_inside or self.splitter.inside or bool(thought))
        self.content += said
        self.reasoning += thought
        self.finished, self.error = piece.finished, piece.error
        return thought, said

    @property
    def thinking(self) -> bool:
        return self.splitter.inside

    @property
    def stats(self) -> TurnStats:
        if not self.finished:  # the stream ended without a last piece
            self.meter.stats.finish_reason = "error"
        return self.meter.stats
