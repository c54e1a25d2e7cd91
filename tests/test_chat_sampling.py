"""The chat's sampling settings beyond temperature and max tokens (top_p, top_k, min_p, repetition_penalty, the
penalties, seed, stop strings): `/set`, `minisgl chat --top-p ...`, what /stats and the exports show, the session store
(and its upgrade of older databases), and what the engine samples with: the in-process engine's tokens against
LLM.generate's for the same prompt and settings, a stop string ending SmolLM2's answer in the TUI, and a real `serve`
behind `chat --url`."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import subprocess

import pytest

from engine.sampling_params import SamplingParams
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.commands import CommandError, run_command
from minisgl_cli.tui.export import to_json, to_markdown
from minisgl_cli.tui.plain import run_plain
from minisgl_cli.tui.session import ChatMessage, ChatSession, sampling_given
from minisgl_cli.tui.stats import settings_rows
from minisgl_cli.tui.store import SCHEMA, ChatStore, StoreError
from minisgl_cli.tui.widgets import NoteMessage
from tests.at_line import at_line
from tests.chat_pilot import LocalEngine, errors, notices, rendered, run_app, send, wait_for
from tests.conftest import make_llm
from tests.test_bench_offline import flat
from tests.test_chat_plain import MINISGL, TINY


def test_set_command_changes_what_the_next_turn_samples_with():
    s = ChatSession()
    assert run_command("/set top-p 0.9", s).message == "top_p = 0.9"  # the flag's spelling too
    assert run_command("/set top_k 40", s).message == "top_k = 40"
    assert run_command("/set top_k\t30", s).message == "top_k = 30"  # a tab between (was refused: "top_k\t30")
    run_command("/set top_k 40", s)
    assert run_command("/set repetition_penalty 1.15", s).message == "repetition_penalty = 1.15"
    assert run_command("/set seed 7", s).message == "seed = 7"
    run_command("/set temperature 0.3", s)
    p = s.params()
    assert (p.top_p, p.top_k, p.repetition_penalty, p.seed, p.temperature) == (0.9, 40, 1.15, 7, 0.3)
    assert p.min_p == 0.0 and p.presence_penalty == 0.0  # untouched: the API's defaults
    # off, or the field's own "off" value, takes a setting out of the requests
    assert run_command("/set seed off", s).message == "seed = off" and s.params().seed is None
    run_command("/set top_k 0", s)
    assert "top_k" not in s.sampling and s.params().top_k == -1
    refused = {
        "/set": "needs one of top_p",
        "/set top_q 1": "got 'top_q'",
        "/set top_p": "needs a value or off (now 0.9)",
        "/set top_p 0": "top_p must be in (0, 1]",
        "/set top_p nan": "top_p must be a finite number",
        "/set top_k 1.5": "'1.5' is not an integer",
        "/set min_p 2": "min_p must be in [0, 1]",
        "/set presence_penalty 3": "presence_penalty must be in [-2, 2]",
        "/set seed x": "'x' is not an integer",
    }
    for line, says in refused.items():
        with pytest.raises(CommandError, match=re.escape(says)):
            run_command(line, s)
    assert s.sampling == {"top_p": 0.9, "repetition_penalty": 1.15}  # a refused /set changed nothing
    rows = dict(settings_rows(s))
    assert rows["top_p"] == "0.9" and rows["repetition_penalty"] == "1.15" and "top_k" not in rows  # /set's names
    s.add(ChatMessage("user", "hi"))
    assert "temperature 0.3 · max tokens 512 · top_p 0.9 · repetition_penalty 1.15" in to_markdown(s)
    doc = json.loads(to_json(s))
    assert doc["top_p"] == 0.9 and doc["repetition_penalty"] == 1.15 and "top_k" not in doc


def test_set_stop_takes_strings_apart_by_spaces_with_quotes_and_escapes():
    """`/set stop`: strings apart by whitespace (ollama's `/set parameter stop a b`), quotes for one with spaces, and
    llama.cpp's escapes (a newline cannot be typed in the input); shown quoted and escaped, as /set takes it back."""
    s = ChatSession()
    said = run_command(r"""/set stop User: "\n\n" 'a b' "say \"hi\"\\" """, s).message
    assert s.params().stop == ["User:", "\n\n", "a b", 'say "hi"\\']
    assert said == r'stop = "User:" "\n\n" "a b" "say \"hi\"\\"'
    assert run_command("/set stop " + said.removeprefix("stop = "), s).message == said  # the text shown sets it again
    assert sampling_given(s.params())["stop"] == ["User:", "\n\n", "a b", 'say "hi"\\']  # what --url sends
    refused = {
        '/set stop ""': "stop must be non-empty strings (got [''])",
        "/set stop a '' b": "stop must be non-empty strings",
        "/set stop a b c d e": "stop takes at most 4 strings, as OpenAI's API (got 5)",
        r"/set stop a\q": r"stop: \q is no escape",
        # a shell's escaped space: the message showed "\  is no escape", the space after the backslash unseen
        r"/set stop User:\ Bob": r"stop: \ before ' ' is no escape: drop the \ (/set stop takes a string with spaces",
        "/set stop a\\": r"stop: a \ at the end escapes nothing",
        '/set stop "a b': 'stop: a " is not closed',
        "/set stop": 'needs a value or off (now "User:" "\\n\\n" "a b"',
    }
    for line, says in refused.items():
        with pytest.raises(CommandError, match=re.escape(says)):
            run_command(line, s)
    assert len(s.sampling["stop"]) == 4  # a refused /set changed nothing
    run_command("/set seed 3", s)
    rows = dict(settings_rows(s))
    assert rows["stop"] == r'"User:" "\n\n" "a b" "say \"hi\"\\"' and rows["seed"] == "3"
    s.add(ChatMessage("user", "hi"))
    assert 'max tokens 512 · stop "User:" "\\n\\n" "a b"' in to_markdown(s)
    assert json.loads(to_json(s))["stop"] == ["User:", "\n\n", "a b", 'say "hi"\\']
    assert run_command('/set stop "off"', s).message == 'stop = "off"'  # quoted: the word itself
    assert run_command("/set stop off", s).message == "stop = off" and "stop" not in s.sampling
    assert s.params().stop == [] and "stop" not in sampling_given(s.params())
    assert run_command(r"/set stop \t", s).message == r'stop = "\t"' and s.params().stop == ["\t"]


def test_a_large_seed_or_top_k_is_written_whole_in_the_markdown_export():
    """/set, /stats and the Markdown export show an integer setting as it is: the export formatted every value by `g`,
    so seed 1234567890 read "seed 1.23457e+09" (not the seed to set again) and top_k 1000000 "top_k 1e+06"."""
    s = ChatSession()
    assert run_command("/set seed 1234567890", s).message == "seed = 1234567890"
    run_command("/set top_k 1000000", s)
    run_command("/set min_p 0.00001", s)
    s.add(ChatMessage("user", "hi"))
    assert "top_k 1000000 · min_p 1e-05" in to_markdown(s) and "seed 1234567890" in to_markdown(s)
    rows = dict(settings_rows(s))
    assert (rows["seed"], rows["top_k"], rows["min_p"]) == ("1234567890", "1000000", "1e-05")
    assert json.loads(to_json(s))["seed"] == 1234567890


def test_set_seed_minus_one_is_no_seed_and_says_so():
    """The engine reads seed -1 as no seed (vLLM's convention): `/set seed -1` answered "seed = -1" and /stats, the
    exports and the saved chat showed a seed that no answer was sampled with (where -2 is a seed like any other)."""
    s = ChatSession()
    run_command("/set seed 7", s)
    assert run_command("/set seed -1", s).message == "seed = off"
    assert "seed" not in s.sampling and s.params().seed is None and "seed" not in dict(settings_rows(s))
    assert ChatSession(sampling={"seed": -1}).sampling == {}  # a saved chat's, or a flag's
    assert run_command("/set seed -2", s).message == "seed = -2" and s.params().seed == -2


def test_the_store_keeps_the_settings_and_upgrades_an_older_database(tmp_path):
    db = tmp_path / "chat.db"
    old = sqlite3.connect(db, isolation_level=None)  # a database of the first schema, as earlier minisgl wrote it
    old.executescript(SCHEMA.replace(",\n    sampling TEXT NOT NULL DEFAULT '{}'", "") + "PRAGMA user_version = 1;")
    old.execute(
        "INSERT INTO sessions (title, model, system, temperature, max_tokens, thinking, created, updated)"
        " VALUES ('old chat', 'm', NULL, 0.5, 100, NULL, 1, 1)"
    )
    old.close()
    store = ChatStore(db)
    s, _ = store.load(1)
    assert (s.title, s.temperature, s.sampling) == ("old chat", 0.5, {})
    s.set_sampling("min_p", 0.05)
    s.set_sampling("seed", 3)
    s.set_sampling("stop", ["\n\n", "a b"])  # in the same JSON column as the numbers: no new schema
    store.save(s, [])
    store.close()
    again, _ = ChatStore(db).load(1)
    assert again.sampling == {"min_p": 0.05, "seed": 3, "stop": ["\n\n", "a b"]} and again.params().seed == 3
    assert again.params().stop == ["\n\n", "a b"]
    fresh = ChatStore(tmp_path / "new.db")  # a new chat's first save
    new = ChatSession(sampling={"top_k": 20})
    new.add(ChatMessage("user", "hi"))
    fresh.save(new, ["hi"])
    assert fresh.load(new.id or 0)[0].sampling == {"top_k": 20}
    broken = sqlite3.connect(db, isolation_level=None)
    broken.execute("""UPDATE sessions SET sampling='{"top_p": 5}'""")
    broken.close()
    with pytest.raises(StoreError, match=re.escape("chat 1 of") + ".*top_p must be in"):
        ChatStore(db).load(1)
    for stop, says in [('"x"', "stop must be a list of strings (got 'x')"), ('[""]', "stop must be non-empty")]:
        broken = sqlite3.connect(db, isolation_level=None)
        broken.execute(f"""UPDATE sessions SET sampling='{{"stop": {stop}}}'""")
        broken.close()
        with pytest.raises(StoreError, match=re.escape("chat 1 of") + ".*" + re.escape(says)):
            ChatStore(db).load(1)


def test_an_upgrade_that_waited_for_a_newer_minisgl_refuses_the_database(tmp_path):
    """Two chats open a database of schema 1 at once, one of them a newer minisgl's: this one, having waited for the
    lock while the other upgraded the file, must then see the newer schema and refuse the file as it would have at
    first. It went on with a database it does not know (its own upgrade skipped as "already done"). The newer
    minisgl's upgrade commits here, for real, at the line where this one takes the lock."""
    db = tmp_path / "chat.db"
    old = sqlite3.connect(db, isolation_level=None)
    old.executescript(SCHEMA.replace(",\n    sampling TEXT NOT NULL DEFAULT '{}'", "") + "PRAGMA user_version = 1;")
    old.close()

    def newer_upgrades() -> None:
        newer = sqlite3.connect(db, isolation_level=None)
        newer.execute("PRAGMA user_version = 3")
        newer.close()

    with at_line(ChatStore._setup, "with self._transaction():", newer_upgrades) as upgraded:
        with pytest.raises(StoreError, match=re.escape("was written by a newer minisgl (schema 3)")):
            ChatStore(db)
    assert upgraded


@pytest.fixture(scope="module")
def tiny():
    llm = make_llm("dummy:tiny-llama", num_pages=128)
    engine = LocalEngine(llm)
    yield llm, engine
    engine.shutdown()


def _answer(engine: LocalEngine, session: ChatSession, text: str) -> str:
    run_plain(engine.backend(), session, None, None, io.StringIO(text + "\n"), io.StringIO(), io.StringIO())
    return session.history[-1].content


def test_the_local_chat_samples_with_its_settings(tiny):
    """The chat's answer is the engine's for the same prompt and settings (LLM.generate), and each setting changes
    it (the tiny model's greedy answer repeats itself within 64 tokens: the penalty bites there)."""
    llm, engine = tiny
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "hello"}])

    def generate(**fields) -> str:  # on the engine loop's thread, between its steps
        return engine.call(lambda llm: llm.generate([prompt], SamplingParams(max_tokens=64, **fields))[0].text)

    def answer(temperature: float, **sampling) -> str:
        return _answer(engine, ChatSession(temperature=temperature, max_tokens=64, sampling=sampling), "hello")

    assert answer(0) == generate(temperature=0)
    assert answer(0, repetition_penalty=1.8) == generate(temperature=0, repetition_penalty=1.8) != answer(0)
    seeded = answer(1.0, seed=11)
    assert seeded == answer(1.0, seed=11) == generate(temperature=1.0, seed=11) != answer(1.0)
    assert answer(1.0, seed=11, top_k=2) == generate(temperature=1.0, seed=11, top_k=2) != seeded
    assert answer(1.0, seed=11, min_p=0.5) == generate(temperature=1.0, seed=11, min_p=0.5) != seeded


def test_a_stop_string_ends_smollm2s_answer_in_the_tui(smollm):
    """`/set stop` typed in the TUI reaches the local engine: SmolLM2's greedy answer to the question holds "Paris";
    asked again after `/set stop Paris`, the answer is the same text up to there, finished by the stop. A bad value
    is a notice and the chat goes on."""
    question = "What is the capital of France?"

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, question)
        await wait_for(pilot, lambda: not app.generating, what="the whole answer")
        whole = app.session.history[-1].content
        assert "Paris" in whole, whole
        await send(pilot, '/set stop ""')
        await wait_for(pilot, lambda: bool(errors(app)), what="the refusal")
        assert "stop must be non-empty strings" in errors(app)[-1] and "stop" not in app.session.sampling
        await send(pilot, "/set stop Paris")
        await send(pilot, "/reset")
        await send(pilot, question)
        await wait_for(pilot, lambda: not app.generating and len(app.session.history) == 2, what="the cut answer")
        assert 'stop = "Paris"' in notices(app)
        assert app.session.history[-1].content == whole[: whole.index("Paris")] and app.turn.finish_reason == "stop"
        await send(pilot, "/stats")
        await wait_for(pilot, lambda: bool(app.query(NoteMessage)), what="/stats")
        assert re.search(r'stop\s+"Paris"', rendered(app.query(NoteMessage)[-1].content))

    run_app(smollm, scenario, temperature=0.0, max_tokens=64)


def test_chat_flags_reach_a_server_and_bad_ones_are_refused(tmp_path):
    """`chat --url` sends the settings a chat sets (and only those) to a real `serve`: a seeded answer comes back the
    same twice, unlike an unseeded one, and a penalty changes a greedy answer as it does in-process."""
    from tests.conftest import serve_subprocess

    with serve_subprocess(tmp_path, "--num-pages", "256") as (url, _):
        base = [MINISGL, "chat", "--no-tui", "--url", url, "--max-tokens", "64"]

        def answers(*flags: str, stdin: str) -> list[str]:
            """The answers of one chat session, each ended by /reset, as saved."""
            db = tmp_path / f"chat-{len(list(tmp_path.glob('chat-*.db')))}.db"
            p = subprocess.run(
                [*base, "--db", str(db), *flags], input=stdin, capture_output=True, text=True, timeout=120
            )
            assert p.returncode == 0, p.stderr
            store = ChatStore(db)
            return [store.load(c.id)[0].history[1].content for c in reversed(store.sessions())]

        free, seeded, again = answers("--temperature", "1", stdin="hi\n/set seed 5\n/reset\nhi\n/reset\nhi\n")
        assert seeded == again != free
        greedy, penalized = answers("--temperature", "0", stdin="hi\n/set repetition_penalty 1.8\n/reset\nhi\n")
        assert penalized != greedy
        assert answers("--temperature", "0", "--repetition-penalty", "1.8", stdin="hi\n") == [penalized]
        assert answers("--temperature", "1", "--top-k", "2", "--min-p", "0.1", "--top-p", "0.9", stdin="hi\n")
    for flags, says in [
        (["--top-p", "0"], "Invalid value for --top-p: top_p must be in (0, 1]"),
        (["--top-k", "-5"], "Invalid value for --top-k: top_k must be -1 (off)"),
        (["--repetition-penalty", "0"], "Invalid value for --repetition-penalty: repetition_penalty must be"),
    ]:
        p = subprocess.run(
            [MINISGL, "chat", "--no-tui", *TINY, "--no-save", *flags],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and says in " ".join(p.stderr.split()), p.stderr


def test_the_local_chat_takes_the_models_generation_config_for_what_it_leaves_unset(tmp_path):
    """`chat --url` to `minisgl serve` gets a model's generation_config.json values for the fields the chat leaves out
    (serve's --generation-config auto); the local chat sent the API's defaults instead (a Qwen3 directory's top_k 20
    was off). Here the file's top_k of 1 makes every answer greedy, unless the chat sets top_k itself; the chat's
    temperature and max_tokens stay its own (it sends both to a server, whose max_new_tokens default it never
    meets). A bad value in the file is refused before the load, as serve refuses it."""
    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    d = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = d / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "top_k": 1, "temperature": 0.0, "max_new_tokens": 3}))
    llm = make_llm(str(d), num_pages=128)
    engine = LocalEngine(llm)
    try:
        greedy = _answer(engine, ChatSession(temperature=0, max_tokens=24), "hello")
        assert len(greedy) > len(_answer(engine, ChatSession(temperature=0, max_tokens=3), "hello"))
        assert _answer(engine, ChatSession(temperature=1.0, max_tokens=24), "hello") == greedy
        sampled = ChatSession(temperature=1.0, max_tokens=24, sampling={"top_k": 50, "seed": 1})
        assert _answer(engine, sampled, "hello") != greedy
    finally:
        engine.shutdown()
    gen.write_text(json.dumps({**saved, "top_p": 0}))
    p = subprocess.run(
        [MINISGL, "chat", "--no-tui", "--model", str(d), "--device", "cpu", "--no-save"],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = flat(p.stderr)
    assert p.returncode == 2 and "--model" in said and "top_p must be in (0, 1]" in said, p.stderr
