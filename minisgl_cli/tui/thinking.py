"""Splits a streamed answer into thinking and answer at <think>...</think> tags, whatever the pieces' boundaries."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    """feed(text) -> (thinking, answer) for each streamed delta. A tag split across deltas is held back until it is
    decided. Only a <think> at the very start of the answer (after whitespace) opens thinking, as reasoning models
    emit it; `opened` is for prompts that already end in <think> (templates that force thinking on)."""

    def __init__(self, opened: bool = False) -> None:
        self.inside = opened
        self.started = opened  # past the point where a <think> may still open
        self._held = ""
        self._newlines = opened  # drop the newlines that follow a tag, in whichever delta they come

    def _text(self, text: str) -> str:
        if self._newlines:
            text = text.lstrip("\n")
            self._newlines = not text
        return text

    def feed(self, text: str) -> tuple[str, str]:
        buf, self._held = self._held + text, ""
        thinking = answer = ""
        while buf:
            if not self.started:
                stripped = buf.lstrip()
                if not stripped:  # only whitespace so far: wait for more
                    self._held = buf
                    break
                if stripped.startswith(OPEN):
                    self.inside, self.started, self._newlines, buf = True, True, True, stripped[len(OPEN) :]
                    continue
                if OPEN.startswith(stripped):
                    self._held = buf
                    break
                self.started, self._newlines = True, True  # an answer's leading newlines are not shown or kept
                continue
            if not self.inside:
                answer += self._text(buf)
                break
            i = buf.find(CLOSE)
            if i >= 0:
                thinking += self._text(buf[:i])
                self.inside, self._newlines, buf = False, True, buf[i + len(CLOSE) :]
                continue
            keep = _partial_suffix(buf, CLOSE)
            thinking += self._text(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return thinking, answer

    def flush(self) -> tuple[str, str]:
        """At the end of the answer: whatever is still held back."""
        held, self._held = self._held, ""
        return (held, "") if self.inside else ("", self._text(held))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
