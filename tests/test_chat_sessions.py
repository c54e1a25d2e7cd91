"""Saved chat sessions through the real TUI (Textual pilot) over the tiny model: save and resume in a second app,
export, regenerate, edit, copy, the sessions list, and a locked or corrupted database."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess

import pytest
from rich.cells import cell_len
from textual.containers import Vertical
from textual.widgets import Input, OptionList

from minisgl_cli.chat import resume_flag
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.session import ChatMessage, ChatSession
from minisgl_cli.tui.sessions_screen import SessionsScreen
from minisgl_cli.tui.store import META, SCHEMA, ChatStore, default_db_path
from minisgl_cli.tui.turn import TurnStats
from minisgl_cli.tui.widgets import AssistantMessage, MetricsPanel, NoteMessage, PromptBox, UserMessage
from tests.chat_pilot import errors, idle, known, notices, panel_text, run_app, run_pilot, send, wait_for
from tests.conftest import make_llm
from tests.test_chat_plain import MINISGL, TINY
from tests.test_chat_thinking import ScriptedAnswer, ScriptedBackend


@pytest.fixture(scope="module")
def tiny():
    return make_llm("dummy:tiny-llama", num_pages=512)


@pytest.fixture
def db(tmp_path):
    return tmp_path / "chat.db"


async def open_sessions(app: ChatApp, pilot) -> SessionsScreen:
    """ctrl+o, then the saved-chats list once it is up."""
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen), what="sessions list")
    screen = app.screen
    assert isinstance(screen, SessionsScreen)
    return screen


def test_default_db_is_under_xdg_data_home(private_data_dir, tmp_path, monkeypatch):
    assert default_db_path() == private_data_dir / "minisgl" / "chat.db"
    # a relative $XDG_DATA_HOME is ignored, as the XDG spec says (it moved the chats with the working directory)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", "rel/data")
    assert default_db_path() == tmp_path / "home" / ".local" / "share" / "minisgl" / "chat.db"


def test_saved_session_resumes_in_a_second_app(tiny, db):
    async def first(app: ChatApp, pilot) -> None:
        await send(pilot, "/system be brief")
        await send(pilot, "/temp 0.3")
        await send(pilot, "first question")
        await idle(app, pilot)
        await send(pilot, "second question")
        await idle(app, pilot)

    store = ChatStore(db)
    one = run_app(tiny, first, store, max_tokens=6)
    store.close()
    saved = [(m.role, m.content) for m in one.session.history]
    assert [r for r, _ in saved] == ["user", "assistant"] * 2 and one.session.id is not None

    # A second app instance, as `minisgl chat --resume` builds it: the last session from the database.
    store = ChatStore(db)
    assert store.last_id() == one.session.id
    session, inputs = store.load(store.last_id(), tiny.engine.max_model_len)
    assert inputs == ["/system be brief", "/temp 0.3", "first question", "second question"]
    assert (session.system, session.temperature, session.max_tokens, session.model) == (
        "be brief",
        0.3,
        6,
        "tiny-llama",
    )
    first_stats = one.session.history[1].stats
    assert session.history[1].stats.ttft == pytest.approx(first_stats.ttft)
    assert session.history[1].stats.output_tokens == 6 and len(session.history[1].stats.itls) == 5

    async def second(app: ChatApp, pilot) -> None:
        await pilot.pause()
        assert [w.index for w in app.query(UserMessage)] == [0, 2]
        assert [w.answer.source for w in app.query(AssistantMessage)] == [saved[1][1], saved[3][1]]
        assert app.title == "first question"
        await pilot.click("#prompt")
        await pilot.press("up")
        assert app.query_one(PromptBox).value == "second question"  # input history came back too
        app.query_one(PromptBox).value = ""
        await send(pilot, "third question")
        await idle(app, pilot)
        assert app.turn.cache_hit_tokens >= 32  # the resumed history is the prompt's prefix, cached by the engine

    two = run_app(tiny, second, store, session=session, inputs=inputs)
    store.close()
    rows = (
        sqlite3.connect(db)
        .execute(
            "SELECT role, content, ttft, prompt_tokens, output_tokens, tbt_p50 FROM messages"
            " WHERE session_id=? ORDER BY seq",
            (two.session.id,),
        )
        .fetchall()
    )
    assert [(r[0], r[1]) for r in rows[:4]] == saved and rows[4][:2] == ("user", "third question")
    assert all(r[2] > 0 and r[3] > 0 and r[4] == 6 and r[5] > 0 for r in rows if r[0] == "assistant")
    assert len(rows) == 6


def test_export_markdown_and_json(tiny, tmp_path):
    md, js = tmp_path / "chat.md", tmp_path / "chat.json"

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "/system you are a test")
        await send(pilot, "what is up")
        await idle(app, pilot)
        await send(pilot, f"/export md {md}")
        await send(pilot, f"/export json {js}")
        await send(pilot, "/export pdf")
        await send(pilot, f"/export md {tmp_path}")
        await pilot.pause()
        assert f"exported to {md}" in notices(app) and f"exported to {js}" in notices(app)
        assert "takes md or json" in errors(app)[-2] and "is a directory" in errors(app)[-1]

    app = run_app(tiny, scenario, max_tokens=5)
    answer = app.session.history[1]
    text = md.read_text()
    assert text.startswith("# what is up\n") and "**System:** you are a test" in text
    assert "## You\n\nwhat is up\n" in text and f"## Assistant\n\n{answer.content}\n" in text
    assert re.search(r"\*length · TTFT \d+\.\d ms · TBT p50 \d+\.\d ms · \d+\.\d tok/s · \d+ prompt / 5 output", text)
    doc = json.loads(js.read_text())
    assert doc["system"] == "you are a test" and doc["model"] == "tiny-llama" and doc["max_tokens"] == 5
    assert [(m["role"], m["content"]) for m in doc["messages"]] == [
        ("user", "what is up"),
        ("assistant", answer.content),
    ]
    stats = doc["messages"][1]["stats"]
    assert stats["output_tokens"] == 5 and stats["ttft"] == pytest.approx(answer.stats.ttft)
    assert stats["finish_reason"] == "length" and stats["tbt_p50"] > 0


def test_export_refuses_to_write_over_a_file_or_mid_answer(tmp_path, monkeypatch):
    """`/export md notes.md` wrote over the notes without a word, and an export while the answer streamed wrote the
    question alone, as if it had no answer. A file that exists is refused, saying how to write over it (`/export!`,
    as vim's `:w!`); mid-answer the export is refused until the answer is done."""
    monkeypatch.chdir(tmp_path)
    backend = ScriptedBackend(thinking_switch=None)
    notes, md = tmp_path / "notes.md", tmp_path / "chat.md"
    notes.write_text("my notes\n")

    async def scenario(app: ChatApp, pilot) -> None:
        backend.hold = asyncio.Event()  # the answer streams until the test lets it end
        await send(pilot, "what is 6*7?")
        assert app.generating
        await send(pilot, f"/export md {md}")
        assert notices(app)[-1] == "still answering: /export once the answer is done (esc stops it)"
        assert not md.exists()
        backend.hold.set()
        await idle(app, pilot)
        await send(pilot, f"/export md {notes}")
        assert errors(app)[-1] == f"cannot export: {notes} exists: /export! md {notes} writes over it"
        assert notes.read_text() == "my notes\n"
        await send(pilot, f"/export! md {notes}")
        assert notices(app)[-1] == f"exported to {notes}"
        await send(pilot, "/export json")
        await send(pilot, "/export json")  # the default file, there from the first
        assert errors(app)[-1] == "cannot export: minisgl-chat-1.json exists: /export! json writes over it"

    store = ChatStore(tmp_path / "chat.db")
    run_pilot(ChatApp(backend, ChatSession(max_tokens=64, max_tokens_limit=4096), store), scenario)
    assert "</details>\n\nIt is **42**.\n" in notes.read_text()
    assert json.loads((tmp_path / "minisgl-chat-1.json").read_text())["messages"][1]["content"] == "It is **42**."


def test_regenerate_and_edit_replace_the_last_turn(tiny, db):
    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "tell me")
        await idle(app, pilot)
        first = app.session.history[1]
        await send(pilot, "/stats")  # a note below the answer
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.session.history[-1] is not first and not app.generating, what="regenerated")
        assert [m.role for m in app.session.history] == ["user", "assistant"]
        shown = [type(w) for w in app.query_one("#conversation").children]  # the new answer under its question
        assert shown[-3:] == [UserMessage, AssistantMessage, NoteMessage], shown
        assert len(app.query(AssistantMessage)) == 1 and app.query_one(AssistantMessage).answer.source == (
            app.session.history[1].content
        )
        assert known(app.session.history[1].stats).output_tokens == 4 and app.session.history[1].created > first.created

        await send(pilot, "/edit")
        await pilot.pause()
        box = app.query_one(PromptBox)
        assert box.value == "tell me" and app.query_one(UserMessage).has_class("-editing")
        await pilot.press("escape")  # cancels the edit
        assert app.editing is None and box.value == ""
        await pilot.press("ctrl+g")
        await pilot.press(*" more")
        await pilot.press("enter")
        await idle(app, pilot)
        assert [(m.role, m.content) for m in app.session.history][0] == ("user", "tell me more")
        assert len(app.session.history) == 2 and [w.index for w in app.query(UserMessage)] == [0]
        assert len(app.query(AssistantMessage)) == 1
        await send(pilot, "/edit tell me less")  # the text given: sent at once in place of the last, as plain mode
        await idle(app, pilot)
        assert [(m.role, m.content) for m in app.session.history][0] == ("user", "tell me less")
        assert len(app.session.history) == 2 and len(app.query(AssistantMessage)) == 1 and box.value == ""
        assert [w.index for w in app.query(UserMessage)] == [0] and app.editing is None
        # typed while an answer streams, it is refused as a message is, and kept in the box (it was wiped)
        await send(pilot, "/max-tokens 1500")
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: app.generating, what="an answer streaming")
        box.value = "/edit tell me about cats"  # set, not typed: typing it can outlast the answer on a busy machine
        await pilot.press("enter")
        assert box.value == "/edit tell me about cats" and app.editing is None
        assert "still answering: press Esc to stop it first" in notices(app)
        await pilot.press("escape")
        await idle(app, pilot)

    store = ChatStore(db)
    app = run_app(tiny, scenario, store, max_tokens=4)
    rows = sqlite3.connect(db).execute("SELECT role, content FROM messages ORDER BY seq").fetchall()
    assert rows[:2] == [("user", "tell me less"), ("assistant", app.session.history[1].content)]


def test_copy_answer_and_code_blocks(tiny):
    code_answer = "Two ways:\n\n```python\nprint(1)\n```\n\nor\n\n```sh\necho 2\n```\n"
    session = ChatSession(max_tokens=4, max_tokens_limit=tiny.engine.max_model_len)
    session.add(ChatMessage("user", "show code"))
    session.add(ChatMessage("assistant", code_answer, stats=TurnStats(10, 0, 30, finish_reason="stop")))

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.press("f3")
        assert app.clipboard == code_answer
        await send(pilot, "/copy code")
        assert app.clipboard == "echo 2\n"
        await send(pilot, "/copy code 1")
        assert app.clipboard == "print(1)\n"
        await send(pilot, "/copy code 3")
        await send(pilot, "/copy nope")
        await pilot.pause()
        assert "has 2 code block(s), not 3" in notices(app)[-2] and "/copy takes" in errors(app)[-1]
        await send(pilot, "/copy code ²")  # a digit to str.isdigit that int() refuses: it ended the chat
        await pilot.pause()
        assert "/copy takes nothing, code, or code <n> with n >= 1 (got 'code ²')" in errors(app)[-1]
        assert "copied code block 1 of 2 (9 characters)" in notices(app)
        # A stopped answer's unclosed block counts, as Markdown shows it.
        app.session.history[1].content = "Here:\n```python\ndef f():\n    return"
        await send(pilot, "/copy code")
        assert app.clipboard == "def f():\n    return"

    run_app(tiny, scenario, session=session)


def test_a_click_copies_any_message():
    """Only the last answer could be copied (f3, /copy): a click on any question or answer copies it (oterm's way),
    through the Markdown inside an answer too; a click on a thinking block folds it and copies nothing, and the answer
    still streaming is not copied half-done."""
    session = ChatSession(max_tokens=64, max_tokens_limit=4096)
    session.add(ChatMessage("user", "first question"))
    session.add(ChatMessage("assistant", "the **first** answer", reasoning="I thought", stats=TurnStats(4, 0, 9)))
    session.add(ChatMessage("user", "second question"))
    session.add(ChatMessage("assistant", "the second answer", stats=TurnStats(3, 0, 9)))

    class Slow(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer(["word "] * 400, 0.02, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.pause()
        users, answers = list(app.query(UserMessage)), list(app.query(AssistantMessage))
        for widget, text, what in [
            (users[0], "first question", "question"),
            (answers[0].answer, "the **first** answer", "answer"),  # the Markdown inside: the click bubbles up
            (users[1], "second question", "question"),
            (answers[1], "the second answer", "answer"),
        ]:
            await pilot.click(widget)
            await pilot.pause()
            assert app.clipboard == text and f"copied the {what} ({len(text)} characters)" in notices(app)[-1]
        thinking = answers[0].thinking
        assert thinking is not None and thinking.collapsed
        await pilot.click(thinking)
        await pilot.pause()
        assert not thinking.collapsed and app.clipboard == "the second answer"  # folded open, nothing copied
        await send(pilot, "a long one")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 2, what="tokens")
        await pilot.click(list(app.query(AssistantMessage))[-1])
        await pilot.pause()
        assert app.clipboard == "the second answer" and "still coming" in notices(app)[-1]
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, what="the stop")

    run_pilot(ChatApp(Slow(thinking_switch=None), session), scenario)


def test_reset_mid_answer_keeps_the_partial_answer_in_its_chat(db):
    """/reset is ctrl+n: the answer in flight is stopped and kept in its own chat. /reset once emptied the session
    first, so the partial answer was saved alone, as a new "untitled" chat that could not be sent again."""
    store = ChatStore(db)

    class Slow(ScriptedBackend):  # an answer still running when /reset comes, however busy the machine
        def start(self, messages, params, thinking):
            return ScriptedAnswer(["word "] * 400, 0.02, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "a long one")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 2, what="tokens")
        await send(pilot, "/reset")
        await wait_for(pilot, lambda: not app.generating, what="the stop")
        await pilot.pause()
        assert app.session.history == [] and not app.query(AssistantMessage)

    run_pilot(ChatApp(Slow(thinking_switch=None), ChatSession(max_tokens=512, max_tokens_limit=4096), store), scenario)
    infos = store.sessions()
    assert [i.title for i in infos] == ["a long one"]
    saved, _ = store.load(infos[0].id)
    assert [m.role for m in saved.history] == ["user", "assistant"]
    assert known(saved.history[1].stats).finish_reason == "abort"


def test_the_sessions_list_fits_a_small_terminal(tiny, db):
    """At 80 x 20 the list's box (90 x 24) once ran off the screen, and `r`'s rename field with it: typed blind."""
    store = ChatStore(db)
    s = ChatSession(max_tokens=4, model="tiny-llama")
    s.add(ChatMessage("user", "a saved chat"))
    store.save(s, [])

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.resize_terminal(80, 20)
        screen = await open_sessions(app, pilot)
        await pilot.press("r")
        await pilot.pause()
        field = screen.query_one("#rename", Input)
        assert field.display and app.screen.region.contains_region(field.region), field.region
        assert app.screen.region.contains_region(screen.query_one(Vertical).region)

    run_app(tiny, scenario, store, max_tokens=4)


def test_sessions_list_opens_renames_and_deletes(tiny, db):
    store = ChatStore(db)
    for title in ("alpha chat", "beta chat"):
        s = ChatSession(max_tokens=4, model="tiny-llama")
        s.add(ChatMessage("user", title))
        s.add(ChatMessage("assistant", f"answer to {title}"))
        store.save(s, [title])

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "hello")
        await idle(app, pilot)
        screen = await open_sessions(app, pilot)
        assert [i.title for i in screen.infos] == ["hello", "beta chat", "alpha chat"]  # newest first
        await pilot.press("d")  # the open chat cannot be deleted
        assert "this is the open chat" in notices(app)[-1]
        await pilot.press("down", "r")
        screen.query_one("#rename", Input).value = "beta renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert [i.title for i in screen.infos][1] == "beta renamed"
        await pilot.press("down", "d")
        await pilot.press("d")
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["hello", "beta renamed"]
        assert known(screen.selected()).title == "beta renamed"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session.title == "beta renamed", what="opened chat")
        assert [w.answer.source for w in app.query(AssistantMessage)] == ["answer to beta chat"]
        assert app.query_one(PromptBox).entries == ["beta chat"]

    run_app(tiny, scenario, store, max_tokens=4)
    assert [i.title for i in store.sessions()] == ["beta renamed", "hello"]  # the one opened last comes first


def test_locked_database_notifies_and_catches_up(tiny, db, monkeypatch):
    monkeypatch.setattr(ChatStore, "LOCK_TIMEOUT", 0.1)
    store = ChatStore(db)
    other = sqlite3.connect(db, isolation_level=None)

    async def scenario(app: ChatApp, pilot) -> None:
        other.execute("BEGIN EXCLUSIVE")  # another process holds the database
        await send(pilot, "while locked")
        await idle(app, pilot)
        assert any("not saved" in n or "database is locked" in n for n in errors(app)), notices(app)
        assert app.save_error and app.session.id is None
        other.execute("ROLLBACK")
        await send(pilot, "after unlock")
        await idle(app, pilot)
        assert "saved again" in notices(app) and app.save_error is None

    app = run_app(tiny, scenario, store, max_tokens=3)
    session, _ = ChatStore(db).load(app.session.id)
    assert [m.content for m in session.history if m.role == "user"] == ["while locked", "after unlock"]
    assert len(session.history) == 4


def test_a_resumed_chat_is_the_last_one(tiny, db):
    """--resume ID, left without a message, did not make that chat the last: the next bare --resume opened the newest
    written one instead (docs: "the one last written or opened"; ctrl+o's opening did). TUI and plain mode."""
    import io

    from minisgl_cli.tui.plain import run_plain
    from tests.chat_pilot import LocalEngine

    store = ChatStore(db)
    for text in ("older", "newer"):
        s = ChatSession(max_tokens=3)
        s.add(ChatMessage("user", text))
        store.save(s, [text])
    assert store.last_id() == 2
    resumed, inputs = store.load(1)

    async def leave(app: ChatApp, pilot) -> None:
        await pilot.pause()

    run_app(tiny, leave, store, session=resumed, inputs=inputs)
    assert ChatStore(db).last_id() == 1
    resumed, inputs = store.load(2)
    engine = LocalEngine(tiny)
    try:
        run_plain(engine.backend(), resumed, store, inputs, io.StringIO(""), io.StringIO(), io.StringIO())
    finally:
        engine.shutdown()
    assert ChatStore(db).last_id() == 2
    assert [m.content for m in store.load(2)[0].history] == ["newer"]  # opened, not changed


def test_a_chat_changed_or_deleted_by_another_chat_is_saved_as_a_new_one(tiny, db):
    # The same chat open in two terminals (--resume twice): each save wrote the whole chat over the other's, so the
    # first terminal's new messages vanished without a word. A chat deleted by the other one (ctrl+o, d d) failed
    # every later save with "FOREIGN KEY constraint failed", the notice promising a save that never came.
    store = ChatStore(db)
    first = ChatSession(max_tokens=3)
    first.add(ChatMessage("user", "shared"))
    first.add(ChatMessage("assistant", "answer"))
    store.save(first, ["shared"])
    resumed, inputs = store.load(first.id)
    other = ChatStore(db)  # the second terminal, with the same chat open

    async def scenario(app: ChatApp, pilot) -> None:
        theirs, _ = other.load(first.id)
        theirs.add(ChatMessage("user", "theirs"))
        assert other.save(theirs, ["shared", "theirs"]) is None
        await send(pilot, "mine")
        await idle(app, pilot)
        moved = [n for n in notices(app) if "changed by another minisgl chat" in n]
        assert moved and f"chat {first.id} was changed" in moved[0] and str(db) in moved[0], notices(app)
        assert app.session.id not in (None, first.id) and not errors(app)
        other.delete(app.session.id)
        await send(pilot, "after delete")
        await idle(app, pilot)
        assert any("was deleted by another minisgl chat" in n for n in notices(app)), notices(app)
        assert not errors(app) and app.save_error is None

    app = run_app(tiny, scenario, store, session=resumed, inputs=inputs)
    assert len(notices(app)) >= 2
    kept, _ = ChatStore(db).load(first.id)
    assert [m.content for m in kept.history] == ["shared", "answer", "theirs"]
    mine, typed = ChatStore(db).load(app.session.id)
    assert [m.content for m in mine.history if m.role == "user"] == ["shared", "mine", "after delete"]
    assert len(mine.history) == 6 and typed == ["shared", "mine", "after delete"]
    assert [s.id for s in ChatStore(db).sessions()] == [app.session.id, first.id]


def test_a_rename_by_another_chat_stands(db):
    """A rename in another terminal's saved-chats list (ctrl+o, r) leaves the row's `updated` as it was, so the open
    chat's next save wrote its own title over it without a word. It now takes the new name; its own /rename since
    then wins (the last one)."""
    store, other = ChatStore(db), ChatStore(db)
    s = ChatSession(max_tokens=3)
    s.add(ChatMessage("user", "first msg"))
    store.save(s, ["first msg"])
    other.rename(s.id, "Renamed elsewhere")
    s.add(ChatMessage("assistant", "answer"))
    assert store.save(s, ["first msg"]) is None  # the same chat, not saved anew
    assert [i.title for i in store.sessions()] == ["Renamed elsewhere"] and s.title == "Renamed elsewhere"
    assert len(store.load(s.id)[0].history) == 2
    other.rename(s.id, "theirs again")
    s.title = "mine"  # /rename here, after theirs
    store.save(s, ["first msg"])
    assert [i.title for i in store.sessions()] == ["mine"] and s.title == "mine"
    resumed, _ = store.load(s.id)
    other.rename(s.id, "from the list")
    resumed.add(ChatMessage("user", "more"))
    store.save(resumed, [])
    assert resumed.title == "from the list" == store.sessions()[0].title


def test_a_database_path_that_is_a_directory_is_named_as_one(tmp_path):
    """--db refuses a directory (typer), but the default path ($XDG_DATA_HOME/minisgl/chat.db) may be one: SQLite
    said only "unable to open database file"."""
    from minisgl_cli.tui.store import StoreError

    (tmp_path / "chat.db").mkdir()
    with pytest.raises(StoreError, match=re.escape(f"cannot open {tmp_path / 'chat.db'}: it is a directory")):
        ChatStore(tmp_path / "chat.db")


def test_corrupted_database_leaves_the_file_and_chats_unsaved(tmp_path):
    db = tmp_path / "chat.db"
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    p = subprocess.run(
        [MINISGL, "chat", "--no-tui", *TINY, "--max-tokens", "4", "--db", str(db)],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "warning: cannot open" in p.stderr and "file is not a database" in p.stderr and "not saved" in p.stderr
    assert "[length · TTFT" in p.stderr and db.read_bytes() == before
    bad = subprocess.run(
        [MINISGL, "chat", *TINY, "--db", str(db), "--resume"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "cannot resume" in bad.stderr and "Traceback" not in bad.stderr


def test_plain_mode_saves_and_resumes(tmp_path):
    db = tmp_path / "chat.db"
    args = ["--no-tui", *TINY, "--db", str(db)]
    p = subprocess.run(
        [MINISGL, "chat", *args, "--max-tokens", "4"],
        input="one\n/temp 0.2\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "not saved" not in p.stderr, p.stderr  # each save ran on the thread that opened the database
    first_prompt = int(re.findall(r"cache hit \d+/(\d+)", p.stderr)[0])
    # the chat's own settings come back (--max-tokens beside --resume is refused: tests/test_chat_plain.py)
    p = subprocess.run([MINISGL, "chat", *args, "--resume"], input="two\n", capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "resumed chat 1: one (2 messages)" in p.stderr
    assert int(re.findall(r"cache hit \d+/(\d+)", p.stderr)[0]) > first_prompt + 4  # the prompt carries turn one
    session, inputs = ChatStore(db).load(1)
    assert [m.content for m in session.history if m.role == "user"] == ["one", "two"]
    assert session.temperature == 0.2 and inputs == ["one", "/temp 0.2", "two"]
    assert session.model == "tiny-llama"  # the plain mode once saved none (exports read "Model: -")
    assert len(ChatStore(db).sessions()) == 1
    p = subprocess.run([MINISGL, "chat", *args, "--resume", "7"], input="", capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no chat 7" in p.stderr
    p = subprocess.run([MINISGL, "chat", *TINY, "--no-save"], input="x\n", capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and not default_db_path().exists()


def test_resume_from_a_database_that_does_not_exist_creates_none(tmp_path):
    """--resume with no database file: refused by name before the model loads, and no empty database is left behind
    (opening it to look created one)."""
    db = tmp_path / "none.db"
    for resume in (["--resume"], ["--resume", "3"]):
        p = subprocess.run(
            [MINISGL, "chat", "--no-tui", *TINY, "--db", str(db), *resume],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and "does not exist" in p.stderr, p.stderr
        assert not db.exists()


def test_resume_flag_takes_an_optional_id():
    assert resume_flag(["minisgl", "chat", "--resume"]) == ["minisgl", "chat", "--resume", "last"]
    assert resume_flag(["minisgl", "chat", "--resume", "--no-tui"]) == [
        "minisgl",
        "chat",
        "--resume",
        "last",
        "--no-tui",
    ]
    assert resume_flag(["minisgl", "chat", "--resume", "3"]) == ["minisgl", "chat", "--resume", "3"]
    # a negative id is a value (refused by the id check, naming it), not an unknown option
    assert resume_flag(["minisgl", "chat", "--resume", "-1"]) == ["minisgl", "chat", "--resume", "-1"]
    assert resume_flag(["minisgl", "serve", "--resume"]) == ["minisgl", "serve", "--resume"]  # only chat's


def test_titles_with_brackets_show_as_typed_in_the_sessions_list(tiny, db):
    """A title is text, never markup: `[/x]` once crashed the app at ctrl+o (and at every ctrl+o after, as the title
    was saved), and `arr[i]` showed as `arr` in italics."""

    def shown(screen: SessionsScreen) -> str:
        box = screen.query_one(OptionList)
        return "\n".join(box.render_line(y).text for y in range(box.size.height))

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "[/x] what is 2+2?")
        await idle(app, pilot)
        screen = await open_sessions(app, pilot)
        await pilot.pause()
        assert "[/x] what is 2+2?" in shown(screen)
        for title in ("[/oops] renamed", "👋 漢字 wide", "arr[i]"):
            await pilot.press("r")
            screen.query_one("#rename", Input).value = title
            await pilot.press("enter")
            await pilot.pause()
            assert title in shown(screen)
            # the columns stay put in terminal cells ("▶ ", 48 for the title, " ", 3 for the count): an emoji or a
            # CJK character takes two, and str padding pushed that row's columns out
            starts = {cell_len(line[: line.index(" msgs")]) for line in shown(screen).splitlines() if " msgs" in line}
            assert starts == {2 + 48 + 1 + 3}, shown(screen)
        assert app.session.title == "arr[i]" and app.is_running
        await pilot.press("escape")
        await send(pilot, "/rename [b]bold[/b] and [/unclosed]")
        await pilot.pause()
        assert app.session.title == "[b]bold[/b] and [/unclosed]"
        assert "[b]bold[/b] and [/unclosed]" in notices(app)[-1]
        screen = await open_sessions(app, pilot)
        await pilot.pause()
        assert "[b]bold[/b] and [/unclosed]" in shown(screen)

    run_app(tiny, scenario, ChatStore(db), max_tokens=2)


def test_an_answer_cut_by_a_new_chat_or_quitting_is_saved(tiny, db):
    """ctrl+n or ctrl+q mid-answer: the chat is saved with what had arrived, as a stopped answer, and with its input
    history (it once kept the question alone, so --resume ended on an unanswered question)."""
    store = ChatStore(db)

    async def scenario(app: ChatApp, pilot) -> None:
        for key, question in (("ctrl+n", "first question"), ("ctrl+q", "second question")):
            before = app.turn
            await send(pilot, question)
            await wait_for(pilot, lambda b=before: app.turn is not b and app.turn.output_tokens >= 5, what="tokens")
            assert app.generating
            await pilot.press(key)
            await pilot.pause()

    run_app(tiny, scenario, store, max_tokens=1500)
    chats = [ChatStore(db).load(info.id) for info in reversed(ChatStore(db).sessions())]
    for (session, inputs), question in zip(chats, ("first question", "second question"), strict=True):
        assert [m.role for m in session.history] == ["user", "assistant"] and inputs == [question]
        stats = known(session.history[1].stats)
        assert stats.finish_reason == "abort" and 5 <= stats.output_tokens < 1500


def test_opening_a_saved_chat_shows_its_own_tbt_window(tiny, db):
    """ctrl+o, enter: the panel showed the opened chat's last turn beside the TBT sparkline and p50/p90 of the chat
    left behind (the window was not cleared, and only the opened turn's gaps past the old turn's count were added),
    where --resume of the same chat shows its own. A chat with no answer yet kept the old chat's last turn too."""
    store = ChatStore(db)
    slow = ChatSession(max_tokens=4, model="tiny-llama")
    slow.add(ChatMessage("user", "slow chat"))
    stats = TurnStats(prompt_tokens=9, output_tokens=13, ttft=0.25, itls=[0.5] * 12, decode_seconds=6.0)
    slow.add(ChatMessage("assistant", "slow answer", stats=stats))
    store.save(slow, ["slow chat"])
    unanswered = ChatSession(max_tokens=4, model="tiny-llama")
    unanswered.add(ChatMessage("user", "no answer yet"))
    store.save(unanswered, ["no answer yet"])

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "hello")
        await idle(app, pilot)
        panel = app.query_one(MetricsPanel)
        assert panel.tbt_ms and max(panel.tbt_ms) < 500
        screen = await open_sessions(app, pilot)
        await pilot.press(*["down"] * [i.title for i in screen.infos].index("slow chat"), "enter")
        await wait_for(pilot, lambda: app.session.title == "slow chat", what="opened chat")
        await pilot.pause()
        assert list(panel.tbt_ms) == [500.0] * 12
        assert "500.0 / 500.0 ms" in panel_text(app, "tbt")
        screen = await open_sessions(app, pilot)
        await pilot.press(*["down"] * [i.title for i in screen.infos].index("no answer yet"), "enter")
        await wait_for(pilot, lambda: app.session.title == "no answer yet", what="opened chat")
        await pilot.pause()
        assert not panel.tbt_ms and app.turn == TurnStats()
        assert "250.0 ms" not in panel_text(app, "turn")

    run_app(tiny, scenario, store, max_tokens=8)


def test_a_click_on_an_answer_that_never_joined_the_history_copies_nothing_else():
    """An answer that ended with nothing (stopped or failed before its first token) is not kept in the history, but
    its bubble stays, holding the index the next message then takes: a click on it copied the following question
    as "the answer"."""

    class FirstEmpty(ScriptedBackend):
        def start(self, messages, params, thinking):
            self.sent.append((messages, thinking))
            return ScriptedAnswer([] if len(self.sent) == 1 else ["the answer"], 0.01, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "first question")
        await wait_for(pilot, lambda: not app.generating, what="the empty answer's end")
        await send(pilot, "second question")
        await wait_for(pilot, lambda: not app.generating and len(app.session.history) == 3, what="the second answer")
        empty = list(app.query(AssistantMessage))[0]
        await pilot.click(empty)
        await pilot.pause()
        assert not app.clipboard and "nothing to copy" in notices(app)[-1], notices(app)[-1]
        await pilot.click(list(app.query(AssistantMessage))[1])  # the answer kept is copied
        await pilot.pause()
        assert app.clipboard == "the answer"

    run_pilot(ChatApp(FirstEmpty(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_editing_the_first_message_renames_a_chat_named_after_it(db):
    """A chat is named after its first message until /rename: editing that message (ctrl+g) left the title, the
    header and the saved-chats list naming the message edited away. A /rename'd chat keeps its name."""
    store = ChatStore(db)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "What is the capital of Frnace?")
        await idle(app, pilot)
        await pilot.press("ctrl+g")
        app.query_one(PromptBox).value = "What is the capital of France?"
        await pilot.press("enter")
        await idle(app, pilot)
        assert app.session.title == "What is the capital of France?" and app.title == "What is the capital of France?"
        assert [i.title for i in store.sessions()] == ["What is the capital of France?"]
        await send(pilot, "/rename Capitals")
        await pilot.press("ctrl+g")
        app.query_one(PromptBox).value = "And of Germany?"  # the only question: the first again
        await pilot.press("enter")
        await idle(app, pilot)
        assert app.session.history[0].content == "And of Germany?" and app.session.title == "Capitals"

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64), store), scenario)


def test_opening_a_saved_chat_mid_edit_leaves_the_edited_message_behind(db):
    """ctrl+g, then ctrl+o and another chat: the box still held the left chat's message under edit, no longer an
    edit, so enter sent it into the opened chat as a new message (ctrl+n already emptied the box)."""
    store = ChatStore(db)
    other = ChatSession(max_tokens=64, model="scripted-qwen3")
    other.add(ChatMessage("user", "the other chat"))
    other.add(ChatMessage("assistant", "its answer"))
    store.save(other, ["the other chat"])

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "a private question")
        await idle(app, pilot)
        await pilot.press("ctrl+g")
        assert app.query_one(PromptBox).value == "a private question"
        screen = await open_sessions(app, pilot)
        await pilot.press(*["down"] * [i.title for i in screen.infos].index("the other chat"), "enter")
        await wait_for(pilot, lambda: app.session.title == "the other chat", what="opened chat")
        assert app.editing is None and app.query_one(PromptBox).value == ""
        await pilot.press("enter")  # sends nothing
        await pilot.pause()
        assert [m.content for m in app.session.history] == ["the other chat", "its answer"]

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64), store), scenario)


def test_an_edit_gives_back_the_question_being_typed():
    """ctrl+g replaced a question being typed with the message to edit, and esc (or ctrl+n) then emptied the box:
    the draft was lost. It comes back when the edit ends, however it ends."""

    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        await send(pilot, "first")
        await idle(app, pilot)
        await pilot.press(*"a draft")
        await pilot.press("ctrl+g")
        assert box.value == "first"
        await pilot.press("escape")
        assert box.value == "a draft" and app.editing is None
        await pilot.press("ctrl+g", *", edited", "enter")
        await idle(app, pilot)
        assert [m.content for m in app.session.history if m.role == "user"] == ["first, edited"]
        assert box.value == "a draft"
        await pilot.press("ctrl+g", "ctrl+n")
        await pilot.pause()
        assert box.value == "a draft" and not app.session.history

    run_pilot(
        ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario
    )


def test_a_chat_reopened_with_another_model_says_so_and_names_it(db):
    """A saved chat resumed or opened (ctrl+o, the plain mode's --resume) with another model went on without a word,
    and its row and exports kept naming the model it began with, beside answers from the one answering now."""
    import io

    from minisgl_cli.tui.plain import run_plain

    store = ChatStore(db)
    for title in ("resumed chat", "opened chat"):
        s = ChatSession(max_tokens=64, model="SmolLM2-135M-Instruct")
        s.add(ChatMessage("user", title))
        s.add(ChatMessage("assistant", "an answer"))
        store.save(s, [title])
    resumed, inputs = store.load(1)

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.pause()
        said = "this chat was with SmolLM2-135M-Instruct; scripted-qwen3 answers from here on"
        assert said in notices(app) and app.session.model == "scripted-qwen3"
        screen = await open_sessions(app, pilot)
        await pilot.press(*["down"] * [i.title for i in screen.infos].index("opened chat"), "enter")
        await wait_for(pilot, lambda: app.session.title == "opened chat", what="opened chat")
        assert notices(app).count(said) == 2 and app.session.model == "scripted-qwen3"
        await send(pilot, "/export md " + str(db.parent / "opened.md"))
        assert "Model: scripted-qwen3 ·" in (db.parent / "opened.md").read_text()

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), resumed, store, inputs), scenario)
    assert {i.model for i in store.sessions()} == {"scripted-qwen3"}

    other = ChatSession(max_tokens=64, model="SmolLM2-135M-Instruct")
    other.add(ChatMessage("user", "plain chat"))
    store.save(other, [])
    err = io.StringIO()
    run_plain(ScriptedBackend(thinking_switch=None), store.load(3)[0], store, [], io.StringIO(""), io.StringIO(), err)
    assert "warning: this chat was with SmolLM2-135M-Instruct; scripted-qwen3 answers" in err.getvalue()
    assert store.load(3)[0].model == "scripted-qwen3"


def test_the_open_chat_is_deleted_on_a_second_press(db):
    """oterm deletes the open chat with a key; ours could only delete others from the saved-chats list.
    ctrl+shift+delete (or /delete) asks first, as that list's `d d` does, and leaves a new empty chat; --resume then
    finds the other."""
    store = ChatStore(db)
    older = ChatSession(max_tokens=64, model="scripted-qwen3")
    older.add(ChatMessage("user", "older chat"))
    store.save(older, [])

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.press("ctrl+shift+delete")
        assert "this chat is not saved: nothing to delete" in notices(app)[-1]
        await send(pilot, "hello")
        await idle(app, pilot)
        await pilot.press("ctrl+shift+delete")
        assert notices(app)[-1] == "press ctrl+shift+delete again to delete 'hello'"
        await send(pilot, "and more")  # the chat changed since the first press: it asks again
        await idle(app, pilot)
        await pilot.press("ctrl+shift+delete")
        assert notices(app)[-1] == "press ctrl+shift+delete again to delete 'hello'"
        assert [i.title for i in store.sessions()] == ["hello", "older chat"]
        await pilot.press("ctrl+shift+delete")
        await pilot.pause()
        assert notices(app)[-1] == "deleted 'hello'; a new conversation"
        assert not app.query(UserMessage) and not app.query(AssistantMessage) and app.title == "minisgl chat"
        assert app.session.id is None and not app.session.history and app.query_one(PromptBox).entries == []
        assert [i.title for i in store.sessions()] == ["older chat"]
        await send(pilot, "another")
        await idle(app, pilot)
        await send(pilot, "/delete")
        await send(pilot, "/delete")
        await pilot.pause()
        assert notices(app)[-1] == "deleted 'another'; a new conversation"

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64), store), scenario)
    assert [i.title for i in store.sessions()] == ["older chat"] and store.last_id() == older.id
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1  # the deleted chats' messages went too


def test_a_deleted_chats_id_is_never_handed_out_again(db):
    """sessions.id is SQLite's INTEGER PRIMARY KEY, which takes the highest id + 1: once the newest chat was deleted,
    the next one got its id, and a `--resume 2` kept in a shell's history or a note opened that other chat."""
    store = saved_chats(db, (("first", "a"), ("second", "b")))
    second = store.last_id()
    assert second == 2
    store.delete(second)
    store.close()
    store = saved_chats(db, (("third", "c"),))  # another connection: the highest id is kept in the file
    assert store.last_id() == 3 and [i.id for i in store.sessions()] == [3, 1]
    with pytest.raises(KeyError):
        store.load(second)
    store.delete(3)
    store.delete(1)  # every chat gone
    assert saved_chats(db, (("fourth", "d"),)).last_id() == 4


def test_a_database_written_before_the_highest_id_was_kept_hands_out_no_id_twice(db):
    """A file of schema 2 as minisgl wrote it before (no meta table): it opens as it was, at the same schema (an
    older minisgl still opens it), and its newest chat deleted, the next chat still gets a new id."""
    old = sqlite3.connect(db, isolation_level=None)
    old.executescript(SCHEMA.replace(META, "") + "PRAGMA user_version = 2;")
    for title in ("one", "two"):
        old.execute(
            "INSERT INTO sessions (title, model, system, temperature, max_tokens, thinking, created, updated)"
            " VALUES (?, 'm', NULL, 0.5, 100, NULL, 1, 1)",
            (title,),
        )
    old.execute("INSERT INTO messages (session_id, seq, role, content, created) VALUES (2, 0, 'user', 'two', 1)")
    old.close()
    store = ChatStore(db)
    assert [m.content for m in store.load(2)[0].history] == ["two"]
    store.delete(2)
    assert saved_chats(db, (("three", "c"),)).last_id() == 3
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == 2


def saved_chats(db, turns: tuple[tuple[str, str], ...]) -> ChatStore:
    """A store holding one saved chat per (question, answer), titled by its question."""
    store = ChatStore(db)
    for question, answer in turns:
        s = ChatSession(max_tokens=64, model="scripted-qwen3")
        s.add(ChatMessage("user", question))
        s.add(ChatMessage("assistant", answer))
        store.save(s, [])
    return store


def test_the_sessions_filter_ignores_case_beyond_ascii(db):
    """SQLite's LIKE folds ASCII letters only: "émile" did not find a chat titled "Émile", "STRASSE" not "Straße"."""
    store = saved_chats(db, (("Émile's chat", "hello"), ("other", "Die Straße ist lang"), ("ΣΟΦΙΑ", "x")))
    assert [i.title for i in store.sessions("émile")] == ["Émile's chat"]
    assert [i.title for i in store.sessions("ÉMILE")] == ["Émile's chat"]
    assert [i.title for i in store.sessions("STRASSE")] == ["other"]
    assert [i.title for i in store.sessions("σοφια")] == ["ΣΟΦΙΑ"]
    assert [i.title for i in store.sessions("50%")] == []  # the wildcards stay characters


def test_the_sessions_list_filters_by_title_and_message_text(db):
    """A filter in the saved-chats list, as a long list needs: `/`, then what is typed narrows the rows to the chats
    whose title or a message holds it; open, rename and delete work on the rows shown."""
    store = saved_chats(db, (("alpha chat", "about 50% of cats"), ("beta chat", "dogs"), ("gamma chat", "CATS again")))

    async def scenario(app: ChatApp, pilot) -> None:
        screen = await open_sessions(app, pilot)
        await pilot.press("slash", *"cat")  # in the filter r and d are letters, not rename and delete
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["gamma chat", "alpha chat"]  # by message text, any case
        await pilot.press("backspace", "backspace", "backspace", *"ALPHA")
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["alpha chat"]
        await pilot.press("ctrl+a", "ctrl+k", *"50%")  # LIKE's wildcard is a character here
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["alpha chat"]
        await pilot.press("ctrl+a", "ctrl+k", *"_")
        await pilot.pause()
        assert screen.infos == [] and "(no chat holds '_')" in str(
            screen.query_one(OptionList).get_option_at_index(0).prompt
        )
        await pilot.press("ctrl+a", "ctrl+k", "g", "escape")  # esc: back to the list, the filter kept
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen) and [i.title for i in screen.infos] == ["gamma chat", "beta chat"]
        await pilot.press("down", "d", "d")
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["gamma chat"]
        await pilot.press("r")
        screen.query_one("#rename", Input).value = "gamma renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert [i.title for i in screen.infos] == ["gamma renamed"]
        await pilot.press("slash", "enter")  # enter in the filter opens the first row shown
        await wait_for(pilot, lambda: app.session.title == "gamma renamed", what="opened chat")
        assert [w.answer.source for w in app.query(AssistantMessage)] == ["CATS again"]

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64), store), scenario)
    assert sorted(i.title for i in store.sessions()) == ["alpha chat", "gamma renamed"]
