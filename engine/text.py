"""The text side of a request, shared by the in-process LLM and the server's front-end process: prompts to ids,
ids to streamed text deltas (stop strings decided here), and the output record every front end consumes.
Nothing here touches torch or the engine core, so a front end can run it in a process of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, TypeVar, overload

from engine.logprobs import Logprob, TokenLogprob, vllm_logprobs
from engine.sampling_params import SamplingParams
from engine.tokenizer import IncrementalDetokenizer, Message, Tokenizer, check_template_kwargs


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A conversation with the chat template's switches and variables (what a bare list of messages leaves at their
    defaults): vLLM's chat_template_kwargs, add_generation_prompt, continue_final_message and chat_template (a Jinja
    template in place of the model's)."""

    messages: list[Message]
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None

    def encode(self, tokenizer: Tokenizer) -> list[int]:
        check_template_kwargs(self.template_kwargs)  # before the call: "messages" would collide with its argument
        return tokenizer.encode_chat(
            self.messages,
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )


# vLLM's prompt dicts too: {"prompt": text} (TextPrompt) or {"prompt_token_ids": ids} (TokensPrompt)
Prompt = str | list[int] | list[Message] | dict[str, Any] | ChatPrompt
T = TypeVar("T")


def prompt_text(prompt: Prompt) -> str | None:
    """A prompt's text where it was given as text (vLLM's RequestOutput.prompt); None for token ids or messages."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt")  # type: ignore[assignment]  # encode_prompt refuses any other dict
    return prompt if isinstance(prompt, str) else None


def encode_prompt(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a text, a token list or a chat conversation; ValueError for an empty or malformed one."""
    if isinstance(prompt, ChatPrompt):
        return prompt.encode(tokenizer)
    if isinstance(prompt, dict):
        # vLLM's TextPrompt / TokensPrompt: {"prompt": text} or {"prompt_token_ids": ids}; any other dict is refused
        # (a dict iterated as a list of prompts ran its keys: {"prompt": "Hi"} generated for the text "prompt")
        if set(prompt) == {"prompt"} and isinstance(prompt["prompt"], str):
            return encode_prompt(tokenizer, prompt["prompt"])
        if set(prompt) == {"prompt_token_ids"} and isinstance(prompt["prompt_token_ids"], list):
            ids = prompt["prompt_token_ids"]
            if all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                return encode_prompt(tokenizer, ids)
        raise ValueError(
            'a prompt dict must be {"prompt": text} or {"prompt_token_ids": [ids]} (a chat message goes in a list: '
            f"a conversation); got {prompt!r:.80}"
        )
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and set(map(type, prompt)) <= {int}:
        return list(prompt)  # type: ignore[arg-type]  # checked in C: all ints (a generator took ~0.1 ms a prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        return tokenizer.encode_chat(prompt)  # type: ignore[arg-type]  # checked: a list of dicts
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)  # type: ignore[arg-type]  # checked: a list of ints
    raise ValueError("prompt must be a string, a list of token ids, or a list of chat messages")


class Prefix(Sequence[T]):
    """The first n items of a list that only ever grows at its end (a request's output ids, token times, logprobs):
    a snapshot in O(1) where a copy costs O(items so far). Each step's output of every running request used to copy
    them, O(length^2) over a generation: 2 ms of CPU per step at 256 requests of 1,000 tokens."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[T]):
        self._items, self._n = items, len(items)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            return self._items[start:stop:step] if step > 0 else [self._items[j] for j in range(start, stop, step)]
        if not -self._n <= i < self._n:
            raise IndexError("Prefix index out of range")
        return self._items[i % self._n]

    def __iter__(self) -> Iterator[T]:
        return islice(self._items, self._n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return repr(self[:])


@dataclass(slots=True)
class CompletionOutput:
    """vLLM's CompletionOutput: one completion of a request (RequestOutput.outputs[0])."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # the chosen tokens' log-probabilities summed; None without logprobs
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    lora_request = property(lambda self: None)  # vLLM's: no LoRA here

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    rid: str
    prompt_token_ids: list[int]
    token_ids: Sequence[int]  # a Prefix of the request's ids while it runs, a list once finished
    text: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    cache_hit_tokens: int = 0
    arrival: float = 0.0
    first_token_time: float | None = None
    token_times: Sequence[float] = field(default_factory=list)
    logprobs: Sequence[TokenLogprob] | None = None  # one per token of token_ids (SamplingParams.logprobs)
    # minisgl's own records of the prompt tokens after the first (SamplingParams.prompt_logprobs); vLLM's shape is
    # `prompt_logprobs`
    prompt_token_logprobs: Sequence[TokenLogprob] | None = None
    # finished by "stop": the stop string or stop token id that matched; None for EOS (as vLLM's stop_reason)
    stop_reason: str | int | None = None
    prompt: str | None = None  # the prompt's text where it was given as text (vLLM's RequestOutput.prompt)
    # each token's own text, for `outputs`' decoded tokens; None where the request asked for no text
    token_texts: Callable[[list[int]], list[str]] | None = field(default=None, repr=False, compare=False)
    # the prompt's other choices where LLM.generate ran n > 1 of them (this output is the first): `outputs`. Not
    # this one itself: a cycle would make dataclasses.asdict and copy.deepcopy of an output recurse without end
    other_choices: list[RequestOutput] = field(default_factory=list, repr=False, compare=False)
    # vLLM's RequestOutputKind.DELTA (AsyncLLM.generate sets it): `outputs` hold what is new in this output only, and
    # `prompt_logprobs` come with the request's first output alone; the fields above are the whole request's either way
    delta: bool = False
    # `outputs` and `prompt_logprobs` as built at their first read: code written for vLLM reads them as the plain
    # attributes they are there, often once per token in a loop, and rebuilding every record at each read made such
    # a loop quadratic (200 output tokens: 0.4 s; a 1,000-token prompt's log-probabilities, 5 ms a read)
    _outputs: tuple[int, list[CompletionOutput]] | None = field(default=None, init=False, repr=False, compare=False)
    _prompt_lps: list[dict[int, Logprob] | None] | None = field(default=None, init=False, repr=False, compare=False)

    # ---- vLLM's names for the same record (code written for vllm.LLM reads these) ------------------------
    @property
    def request_id(self) -> str:
        return self.rid

    @property
    def num_cached_tokens(self) -> int:
        return self.cache_hit_tokens

    # vLLM's fields for what this engine never has: None, as vLLM's own outputs give them without stats logging, LoRA,
    # an encoder-decoder model or KV transfer (logging code reads `if output.metrics:`)
    metrics = property(lambda self: None)
    lora_request = property(lambda self: None)
    encoder_prompt = property(lambda self: None)
    encoder_prompt_token_ids = property(lambda self: None)
    kv_transfer_params = property(lambda self: None)

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's `outputs`: the prompt's completions (n of them where SamplingParams.n asked for n; this record's
        own fields are the first's), logprobs in vLLM's shape."""
        n = 1 + len(self.other_choices)  # LLM.generate joins the other choices once all have finished
        if self._outputs is None or self._outputs[0] != n:
            self._outputs = n, [c.completion(j) for j, c in enumerate([self, *self.other_choices])]
        return self._outputs[1]

    @property
    def prompt_logprobs(self) -> list[dict[int, Logprob] | None] | None:
        """vLLM's: None for the prompt's first token (nothing before it scores it), then per prompt token a dict
        {token id: Logprob} as in `outputs[i].logprobs`: the token itself with its rank, then the top ones asked for."""
        records = self.prompt_token_logprobs
        if records is None or (self.delta and len(self.token_ids) > len(self.delta_token_ids)):  # not the first
            return None
        if self._prompt_lps is None:
            self._prompt_lps = [None, *vllm_logprobs(records, self.token_texts)]
        return self._prompt_lps

    def completion(self, index: int) -> CompletionOutput:
        text, ids, records = self.text, self.token_ids, self.logprobs
        if self.delta:
            text, ids = self.delta_text, self.delta_token_ids
            records = None if records is None else records[len(self.token_ids) - len(ids) :]
        lps = None if records is None else vllm_logprobs(records, self.token_texts)
        cumulative = None if self.logprobs is None else sum(r.logprob for r in self.logprobs)  # vLLM's: all of them
        # vLLM's token_ids is a list: a running request's Prefix (kept for the engine's own readers, which never
        # copy it) is copied here, where code written for vLLM reads it (json.dumps, `ids + [x]`)
        ids = ids if isinstance(ids, list) else list(ids)
        return CompletionOutput(index, text, ids, cumulative, lps, self.finish_reason, self.stop_reason)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies (TBT) in seconds."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(slots=True)
class TextState:
    """One request's text so far. `advance` takes the ids the engine produced since the last call and returns
    what may be shown now: text that could still turn out to start a stop string is held back until decided."""

    detok: IncrementalDetokenizer | None  # None: the request asked for token ids only (detokenize=False)
    stop: list[str]
    min_tokens: int = 0  # stop strings count only once this many tokens are out
    stop_ids: frozenset[int] = frozenset()  # stop_token_ids: the one that ends it is its stop_reason
    prompt: str | None = None  # the prompt's text, for the outputs (where it was given as text)
    include_stop: bool = False  # include_stop_str_in_output
    text: str = ""
    emitted: int = 0  # characters already handed out
    n_ids: int = 0  # output ids already fed
    finish_reason: str | None = None  # "stop" once a stop string matched
    # the stop string or stop_token_ids id that ended it (vLLM's stop_reason); None unless it finished with "stop"
    stop_reason: str | int | None = None
    hold: int = field(init=False)  # characters held back while they could still be the start of a stop string

    def __post_init__(self) -> None:
        # an included stop string is shown as it comes (vLLM holds nothing back then)
        self.hold = 0 if self.include_stop else max((len(s) for s in self.stop), default=1) - 1

    @classmethod
    def create(cls, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams) -> TextState:
        switches = params.skip_special_tokens, params.spaces_between_special_tokens
        detok = IncrementalDetokenizer(tokenizer, prompt_ids, *switches) if params.detokenize else None
        stop_ids = frozenset(params.stop_token_ids)
        return cls(
            detok, list(params.stop), params.min_tokens, stop_ids, include_stop=params.include_stop_str_in_output
        )

    def _feed(self, new_ids: list[int], first: int) -> None:
        """first: the 1-based count of new_ids[0] among the output tokens."""
        if self.detok is None:
            return
        for i, t in enumerate(new_ids, start=first):
            old = len(self.text)
            self.text += self.detok.add(t)
            if i <= self.min_tokens:  # as vLLM: a stop string counts from token min_tokens + 1 (EOS's first chance)
                continue
            # a match must end in this token's text (one that ended earlier, inside min_tokens, does not count); of
            # several, the one completed first in the text, then the first listed: what adding the text a character
            # at a time gives, so the text never holds a stop string (vLLM's check_stop_strings since its #49391)
            hits = [
                (j + len(s), k, j)
                for k, s in enumerate(self.stop)
                if (j := self.text.find(s, max(old - len(s) + 1, 0))) >= 0
            ]
            if hits:
                done, k, at = min(hits)
                self.stop_reason, end = self.stop[k], done if self.include_stop else at
                self.text, self.finish_reason = self.text[:end], "stop"
                return

    def advance(self, new_ids: list[int], reason: str | None, error: str | None) -> tuple[str, str | None, str | None]:
        """Feed the new ids; returns (delta text, finish reason, error). `reason` is the engine's (None while the
        request runs); a stop string found here finishes it with "stop" (whatever the engine said); a detokenizer
        fault ends it with "error"."""
        first = self.n_ids + 1
        self.n_ids += len(new_ids)
        if reason == "stop" and new_ids:
            # the engine's "stop" is an EOS or stop_token_ids token (vLLM's stop_terminated): as there, its text is
            # left out unless include_stop (an EOS shows as "<|im_end|>" where skip_special_tokens is false)
            self.stop_reason = new_ids[-1] if new_ids[-1] in self.stop_ids else None
            new_ids = new_ids if self.include_stop else new_ids[:-1]
        try:
            self._feed(new_ids, first)
        except Exception as e:  # a fault in one request's text handling ends that request only
            reason, error = "error", f"detokenization failed: {e}"
        if self.finish_reason and reason != "error":
            # a stop string matched: "stop", even on the engine's last allowed token, where the engine says "length"
            # (vLLM: the detokenizer's stop string wins); the text was cut at it either way
            reason = self.finish_reason
        if reason != "stop":  # a fault after the match: no stop ended it
            self.stop_reason = None
        upto = len(self.text) if reason else max(len(self.text) - self.hold, self.emitted)
        delta, self.emitted = self.text[self.emitted : upto], upto
        return delta, reason, error
