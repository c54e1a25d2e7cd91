"""Tokenizer glue: text <-> ids, chat templates, and incremental detokenization that never splits UTF-8."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# a chat message: role, content (a string, or OpenAI's list of content parts: message_text), and what the template reads
Message = dict[str, Any]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_unicode(text: str, what: str) -> None:
    """ValueError naming `what` if `text` holds a lone UTF-16 surrogate (JSON's "\\ud800" decodes to one): it is not
    Unicode a tokenizer can take (Hugging Face's raised a TypeError, a 500 in the server)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} holds a lone UTF-16 surrogate {text[e.start]!r} at character {e.start}, which is not valid Unicode"
        ) from None


# The content parts read as text, by the key holding it: vLLM's parser (MM_PARSER_MAP) reads these five so, the
# Responses API's input_text/output_text, a refusal and a thinking part included (into the content: not `reasoning`)
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def message_text(content: object, where: str) -> str:
    """A chat message's content as the chat template reads it, for the in-process API and the server alike: a string
    as it is, None as "", OpenAI's list of content parts ([{"type": "text", "text": ...}]) as their texts a line each:
    vLLM's join for templates that take a string (most text models'), so parts make the same prompt there and here
    ("".join ran "What is 2+2?" and "Answer in French." together). As vLLM's parser: a bare string in the list is a
    text, and a part whose text is missing, null or "" adds no line. ValueError naming a part that is not text
    (image_url, input_audio, ...): the models here read text only, and a part dropped would change the question."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of content parts (got {type(content).__name__})")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, str):
            text = part
        elif isinstance(kind, str) and kind in TEXT_PARTS:
            key = TEXT_PARTS[kind]
            text = part.get(key) or ""
            if not isinstance(text, str):
                raise ValueError(f"{where}[{j}].{key} must be a string (got {text!r:.40})")
        else:
            what = f"a part of type {kind!r}" if isinstance(kind, str) else f"{part!r:.60}"
            raise ValueError(
                f'{where}[{j}] is {what}: only text parts ({{"type": "text", "text": ...}}) are supported, the'
                " models here read text only"
            )
        if text:
            texts.append(text)
    return "\n".join(texts)


# apply_chat_template's own parameters and what the request sets itself: never a template variable from a request
TEMPLATE_CALL_ARGS = frozenset(
    {
        "self",  # the bound methods' own first argument: "got multiple values for argument 'self'", a TypeError
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "add_special_tokens",
    }
)


def check_template_kwargs(kwargs: dict[str, Any]) -> None:
    """ValueError if a request's chat template variables name a parameter of the template's call."""
    taken = sorted(set(kwargs) & TEMPLATE_CALL_ARGS)
    if taken:
        raise ValueError(f"chat_template_kwargs: {taken[0]!r} is a parameter of the template's call, not a variable")


class Tokenizer:
    """A Hugging Face tokenizer with the few calls the engine needs."""

    # Messages without a chat template: refused for a real tokenizer (there is no right layout to guess, as in vLLM
    # since transformers dropped default templates); the byte tokenizer of dummy models lays them out as
    # "role: content" lines, so chats and servers of dummy models run.
    PLAIN_CHAT = False

    def __init__(self, hf: Any, extra_eos: tuple[int, ...] = ()):
        self.hf = hf
        if (
            _bpe(hf)
            and getattr(hf, "clean_up_tokenization_spaces", False)
            and not getattr(hf, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        ):
            # transformers 5 skips this clean-up for BPE tokenizers (it would strip the spaces before punctuation)
            # and warns on the first decode; some versions turn it on for GGUF files. Off: the same text, no warning.
            hf.clean_up_tokenization_spaces = False
        eos = {hf.eos_token_id} if getattr(hf, "eos_token_id", None) is not None else set()
        self.eos_ids = frozenset(eos | set(extra_eos))
        self.has_chat_template = bool(getattr(hf, "chat_template", None))

    @staticmethod
    def from_hf_dir(path: Path, extra_eos: tuple[int, ...] = ()) -> Tokenizer | None:
        if not any((path / f).exists() for f in TOKENIZER_FILES):
            return None
        try:
            if _generic_fast(path):
                # AutoTokenizer would pick this same class, after reading the model's config and importing that
                # model's modules: ~2 s of every start of the embedded model's chat (its cached directory names
                # the generic class), against ~0.7 s this way.
                from transformers import PreTrainedTokenizerFast as cls
            else:
                from transformers import AutoTokenizer as cls  # type: ignore[assignment]  # picks the class itself
            hf = cls.from_pretrained(str(path))
        except Exception as e:  # a broken tokenizer.json raised a bare JSONDecodeError (a traceback from the CLI)
            raise ValueError(f"cannot load the tokenizer in {path}: {type(e).__name__}: {e}") from e
        return Tokenizer(hf, extra_eos)

    @staticmethod
    def from_gguf(path: Path, extra_eos: tuple[int, ...] = ()) -> Tokenizer:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:
            raise ValueError(f"cannot build a tokenizer from {path}: {e}") from e
        return Tokenizer(hf, extra_eos)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        check_unicode(text, "prompt")
        return list(self.hf.encode(text))

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        """transformers' decode; spaces_between_special_tokens is passed only where false (a fast tokenizer's decode
        takes it unread; a Python one's default is true)."""
        spaces = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        text: str = self.hf.decode(ids, skip_special_tokens=skip_special_tokens, **spaces)
        return text

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's vocabulary entry as stored ("Ġhello", "<0x0A>"): what vLLM's /tokenize calls token_strs."""
        return list(self.hf.convert_ids_to_tokens(ids))

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text, special tokens included (what log-probability listings show)."""
        return list(self.hf.batch_decode([[i] for i in ids], skip_special_tokens=False))

    def token_bytes(self, ids: list[int], texts: list[str] | None = None) -> list[bytes]:
        """Each token's own bytes (OpenAI's logprobs `bytes`: the tokens' bytes joined are the text's UTF-8). A token
        holding part of a UTF-8 character decodes alone to U+FFFD, whose bytes are not its own: its bytes come
        from its vocabulary piece (byte-level BPE's byte alphabet, or SentencePiece's <0xNN> byte fallback)."""
        texts = self.token_texts(ids) if texts is None else texts
        out = []
        for i, text in zip(ids, texts):
            raw = None
            if "\ufffd" in text:
                raw = _piece_bytes(self.hf.convert_ids_to_tokens(i))
            out.append(raw if raw is not None else text.encode())
        return out

    @property
    def thinking_switch(self) -> bool:
        """The chat template reads `enable_thinking` (Qwen3 and others): chat_prompt(..., enable_thinking=...)."""
        return self.has_chat_template and "enable_thinking" in str(self.hf.chat_template)

    def chat_prompt(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """template_kwargs: extra variables for the chat template (e.g. enable_thinking). add_generation_prompt:
        open the assistant's turn after the messages; continue_final_message: leave the last message open instead,
        so that the answer continues it (vLLM's and transformers' switches of the same names); chat_template: a Jinja
        template used in place of the tokenizer's own."""
        if not messages:
            raise ValueError("messages must not be empty")
        if add_generation_prompt and continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be true")
        check_template_kwargs(template_kwargs)
        plain = []  # the messages with their content as text
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("role") in ("tool", "function"):  # vLLM's tool results
                raise ValueError(
                    f"messages[{i}] has role {m['role']!r} (a tool's result): tool calling is not supported"
                    " (send system/user/assistant messages)"
                )
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or "content" not in m:
                raise ValueError(f"each message needs a role (system/user/assistant) and content; got {m!r:.200}")
            plain.append({**m, "content": message_text(m["content"], f"messages[{i}].content")})
            for key, value in plain[-1].items():
                if isinstance(value, str):
                    check_unicode(value, f"messages[{i}].{key}")
        messages = plain
        if chat_template is not None and self.hf is None:
            raise ValueError("chat_template: this model's byte tokenizer lays messages out as lines, not by a template")
        if chat_template is None and not self.has_chat_template:
            if not self.PLAIN_CHAT:
                raise ValueError(
                    "this model's tokenizer has no chat template, so its messages have no known layout: send a plain"
                    " prompt (a completion) instead, or use a model whose tokenizer has one"
                )
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text[:-1] if continue_final_message else text + "assistant:" * add_generation_prompt
        prompt: str = self.hf.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template=chat_template,
            **template_kwargs,
        )
        return prompt

    def encode_chat(self, messages: list[Message], **template_kwargs: Any) -> list[int]:
        """template_kwargs: chat_prompt's keywords (its switches and the template's variables)."""
        return list(self.hf.encode(self.chat_prompt(messages, **template_kwargs), add_special_tokens=False))


def load_tokenizer(spec: str | None, extra_eos: tuple[int, ...] = ()) -> Tokenizer:
    """The tokenizer of a model spec (as --model): from the GGUF file (or its cached conversion), the HF directory,
    or bytes for dummy models. Imports no torch: the chat's and the server's front ends load only this (~1.8 s of
    a 2-core machine's start otherwise)."""
    from engine import weight_cache
    from engine.model_source import resolve

    kind, where = resolve(spec)
    if kind == "gguf" and (cached := weight_cache.lookup(Path(where))) is not None:
        kind, where = "hf", cached
    return tokenizer_at(kind, Path(where), extra_eos)


def tokenizer_at(kind: str, path: Path, extra_eos: tuple[int, ...]) -> Tokenizer:
    """The tokenizer of a resolved model (engine/model_source.py's kind and path)."""
    if kind == "gguf":
        return Tokenizer.from_gguf(path, extra_eos)
    if kind == "hf":
        # generation_config.json's eos_token_id stops generation too, as transformers' generate() and vLLM read it
        # (Qwen2.5/Qwen3 instruct models: config.json names <|im_end|> alone, generation_config.json adds <|endoftext|>)
        extra_eos = tuple(dict.fromkeys((*extra_eos, *_generation_eos(path))))
        tok = Tokenizer.from_hf_dir(path, extra_eos)
        if tok is None:  # a checkpoint saved without its tokenizer: say so, text through bytes is not the model's
            print(
                f"minisgl: {path} has no tokenizer ({', '.join(TOKENIZER_FILES)}): text is read and written as "
                "UTF-8 bytes (token ids 0-255), not the model's vocabulary; token-id prompts are unaffected",
                file=sys.stderr,
            )
        return tok or ByteTokenizer(frozenset(extra_eos))  # the model's EOS ids still end its answers
    return ByteTokenizer()


def _generation_config(path: Path) -> dict[str, Any]:
    """An HF directory's generation_config.json; {} if it has none (or none that reads as an object)."""
    import json

    try:
        config = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _generation_eos(path: Path) -> tuple[int, ...]:
    """The eos_token_id of an HF directory's generation_config.json (an id or a list of them); () if none."""
    eos = _generation_config(path).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    return tuple(t for t in ids if isinstance(t, int) and not isinstance(t, bool) and t >= 0)


# The fields of a model's generation_config.json that vLLM takes as its defaults (its server's --generation-config
# auto, and its LLM without SamplingParams), under the SamplingParams field each sets: a request that leaves one out
# gets the model author's value. max_new_tokens is transformers' name for max_tokens.
GENERATION_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def sampling_defaults(spec: str | None) -> dict[str, Any]:
    """The sampling defaults in the generation_config.json of a model spec (as --model; a GGUF or dummy model has
    none): {SamplingParams field: value}. ValueError naming the file and its field for a value a request could not
    give either."""
    from engine.model_source import resolve
    from engine.sampling_params import SamplingParams

    kind, where = resolve(spec)
    if kind != "hf":
        return {}
    path = Path(where) / "generation_config.json"
    config = _generation_config(Path(where))
    out = {}
    for name, field in GENERATION_SAMPLING.items():
        if (v := config.get(name)) is None:
            continue
        try:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{field} must be a number (got {v!r})")
            params = SamplingParams()
            setattr(params, field, v)
            params.validate()
        except ValueError as e:  # SamplingParams names its field first: say the file's name for it
            raise ValueError(f"{path}: {name} {str(e).removeprefix(field + ' ')}") from e
        out[field] = v
    return out


def _generic_fast(path: Path) -> bool:
    """Whether the directory's tokenizer is transformers' generic fast one over tokenizer.json (transformers 5 names it
    TokenizersBackend, 4 PreTrainedTokenizerFast), not a model's own class."""
    import json

    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    generic = config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast")
    return generic and (path / "tokenizer.json").exists()


class ByteTokenizer(Tokenizer):
    """For dummy-weight models, which ship no tokenizer: ids 0-255 are UTF-8 bytes, others decode to `<id>`, so
    every sampled token streams as its own text delta (a server's inter-token latency stays measurable)."""

    PLAIN_CHAT = True

    def __init__(self, eos_ids: frozenset[int] = frozenset()) -> None:
        self.hf = None
        self.eos_ids = eos_ids
        self.has_chat_template = False

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        check_unicode(text, "prompt")
        return list(text.encode())

    def token_texts(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def token_bytes(self, ids: list[int], texts: list[str] | None = None) -> list[bytes]:
        return [bytes([i]) if 0 <= i < 256 else f"<{i}>".encode() for i in ids]

    def pieces(self, ids: list[int]) -> list[str]:
        return self.token_texts(ids)

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        """No special tokens here: both switches change nothing."""
        parts, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            parts.append(run.decode(errors="replace") + f"<{i}>")
            run = bytearray()
        return "".join(parts) + run.decode(errors="replace")

    def encode_chat(self, messages: list[Message], **template_kwargs: Any) -> list[int]:
        return self.encode(self.chat_prompt(messages, **template_kwargs))


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas. A delta is emitted only once the decoded text no longer
    ends in U+FFFD, so a multi-byte character split over tokens is never emitted broken. skip_special_tokens and
    spaces_between_special_tokens: the request's (SamplingParams), as transformers' decode takes them."""

    CONTEXT = 4  # prompt tokens decoded alongside, so a leading space or merge decodes as in the full text

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-self.CONTEXT :])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.switches = skip_special_tokens, spaces_between_special_tokens

    def add(self, token: int) -> str:
        self.ids.append(token)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], *self.switches)
        full = self.tok.decode(self.ids[self.prefix_offset :], *self.switches)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, inverted: the printable character standing for each byte -> the byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_ALPHABET = _byte_alphabet()


def _piece_bytes(piece: object) -> bytes | None:
    """A vocabulary piece's bytes: SentencePiece's byte fallback "<0xE6>", or a byte-level BPE piece ("ĠðŁĺ");
    None when it is neither."""
    if not isinstance(piece, str) or not piece:
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    if all(ch in _BYTE_ALPHABET for ch in piece):
        return bytes(_BYTE_ALPHABET[ch] for ch in piece)
    return None


def _bpe(hf: Any) -> bool:
    """Whether a transformers tokenizer's backend is a BPE model (byte-level or not)."""
    backend = getattr(hf, "backend_tokenizer", None)
    return backend is not None and type(backend.model).__name__ == "BPE"
