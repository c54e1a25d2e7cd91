"""OpenAI's two shapes of log-probabilities, made from the engine's TokenLogprob records: chat's
`{"content": [{token, logprob, bytes, top_logprobs}]}` and completions' `{tokens, token_logprobs, top_logprobs,
text_offset}`. Token strings are each token decoded on its own, special tokens included (a token holding part of a
UTF-8 character shows as U+FFFD, as in vLLM), or "token_id:ID" when the request asks (return_tokens_as_token_ids)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.logprobs import TokenLogprob
from engine.tokenizer import Tokenizer

FLOOR = -9999.0  # JSON has no -inf: a log-probability below this is reported as this (vLLM does the same)


def _lp(x: float) -> float:
    return max(x, FLOOR)


def _texts(tokenizer: Tokenizer | None, ids: Sequence[int], records: Sequence[TokenLogprob | None]) -> dict[int, str]:
    """Token strings; with no tokenizer, "token_id:ID" (vLLM's return_tokens_as_token_ids)."""
    every = sorted(set(ids) | {t for r in records if r is not None for t, _ in r.top})
    return dict(zip(every, tokenizer.token_texts(every) if tokenizer else (f"token_id:{t}" for t in every)))


def chat_logprobs(tokenizer: Tokenizer | None, records: Sequence[TokenLogprob]) -> dict[str, Any]:
    texts = _texts(tokenizer, [r.token for r in records], list(records))
    # each token's own bytes: a token holding part of a UTF-8 character shows as U+FFFD, but its bytes are its
    # own, so that the tokens' bytes joined are the content's UTF-8 (what OpenAI's `bytes` is for)
    ids, strings = list(texts), list(texts.values())
    raw = dict(zip(ids, tokenizer.token_bytes(ids, strings) if tokenizer else [s.encode() for s in strings]))

    def entry(token: int, lp: float) -> dict[str, Any]:
        return {"token": texts[token], "logprob": _lp(lp), "bytes": list(raw[token])}

    return {
        "content": [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for t, lp in r.top]} for r in records]
    }


def completion_logprobs(
    tokenizer: Tokenizer | None, ids: Sequence[int], records: Sequence[TokenLogprob | None], offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Completions' logprobs of `ids`; a None record (an echoed prompt's first token) has null log-probabilities.
    text_offset counts characters of the token strings from `offset` (0 at the start of the choice's text);
    returns the offset after the last token too, for the next chunk of a stream."""
    texts = _texts(tokenizer, ids, records)
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for t, r in zip(ids, records):
        s = texts[t]
        tokens.append(s)
        text_offset.append(offset)
        offset += len(s)
        if r is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_lp(r.logprob))
        # distinct tokens may share a text (every partial UTF-8 token decodes alone to U+FFFD): keep each text's most
        # likely entry, and the chosen token's text its own log-probability, as token_logprobs gives it (OpenAI lists
        # up to logprobs + 1, the chosen token always)
        top: dict[str, float] = {}
        for a, lp in r.top:
            top.setdefault(texts[a], _lp(lp))
        top[s] = _lp(r.logprob)
        top_logprobs.append(top)
    body = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
    return body, offset
