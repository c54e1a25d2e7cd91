"""Chat sessions saved in SQLite (the standard library's sqlite3): settings, messages with each answer's numbers,
and the input history. `save` writes a whole session in one transaction, so a save that failed (a locked or broken
file) is simply made good by the next one."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.cache_paths import xdg_home
from minisgl_cli.tui.session import ChatMessage, ChatSession
from minisgl_cli.tui.turn import TurnStats

SCHEMA_VERSION = 2
# The highest chat id ever handed out (key 'last_id'): sessions.id takes the highest id left + 1, so deleting the newest
# chat gave its id to the next one, and a `--resume N` kept in a note opened another chat. A table of its own, not a
# rebuilt `id ... AUTOINCREMENT`, so the schema stays 2: an older minisgl still opens the file (and ignores it).
META = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT NOT NULL,
    system TEXT,
    temperature REAL NOT NULL,
    max_tokens INTEGER NOT NULL,
    thinking INTEGER,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    sampling TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    finish_reason TEXT,
    ttft REAL,
    tbt_p50 REAL,
    tbt_p90 REAL,
    decode_tps REAL,
    prompt_tokens INTEGER,
    output_tokens INTEGER,
    reasoning_tokens INTEGER,
    cache_hit_tokens INTEGER,
    itls_ms TEXT,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS inputs (
    session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    line TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""
SCHEMA += META
# From each older schema to the next one, in order (a database of schema 1 runs MIGRATIONS[0], then the rest).
MIGRATIONS = [
    "ALTER TABLE sessions ADD COLUMN sampling TEXT NOT NULL DEFAULT '{}';",  # 1 -> 2: the chat's /set fields (JSON)
]


class StoreError(Exception):
    """The database cannot be opened, read or written; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: int
    title: str
    model: str
    messages: int
    updated: float


def default_db_path() -> Path:
    return xdg_home("XDG_DATA_HOME", ".local/share") / "minisgl" / "chat.db"


class ChatStore:
    LOCK_TIMEOUT = 1.0  # seconds to wait for another writer before a save fails (and the next one retries)

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.is_dir():  # SQLite would say only "unable to open database file"
            raise StoreError(f"cannot open {path}: it is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=self.LOCK_TIMEOUT, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open {path}: {e}") from e
        try:
            self._setup()
        except StoreError:
            self.db.close()
            raise

    def _setup(self) -> None:
        self.db.execute("PRAGMA foreign_keys = ON")
        # SQLite's LIKE ignores the case of ASCII letters only: "émile" did not find "Émile"
        self.db.create_function("casefold", 1, _casefold, deterministic=True)
        with self._errors("open"):
            if self._schema() < SCHEMA_VERSION:  # in one transaction: a migration cut short leaves the file as it was
                with self._transaction():
                    # read again under the lock: another chat's upgrade may be done, or a newer minisgl's (refused)
                    version = self._schema()
                    if version < SCHEMA_VERSION:
                        steps = SCHEMA if version == 0 else "".join(MIGRATIONS[version - 1 :])
                        # one statement at a time: executescript would commit the transaction first
                        for statement in f"{steps} PRAGMA user_version = {SCHEMA_VERSION};".split(";"):
                            if statement.strip():
                                self.db.execute(statement)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The block as one write: the lock first (waiting LOCK_TIMEOUT for another writer), then COMMIT; anything
        raised in it (a KeyboardInterrupt too) rolls it back."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _schema(self) -> int:
        """The file's schema version; StoreError if a newer minisgl wrote it."""
        version: int = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} was written by a newer minisgl (schema {version}); not touching it")
        return version

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"cannot {what} {self.path}: {e}") from e

    def close(self) -> None:
        self.db.close()

    # ---- writing --------------------------------------------------------------------------------------------
    def save(self, s: ChatSession, inputs: list[str]) -> str | None:
        """Write the session (assigning s.id the first time), all its messages and its input history. Another chat
        may have the same session open (`--resume` in two terminals) or have deleted it: when its row is not as this
        chat last read or wrote it, the session is saved as a new chat instead of over the other's messages (or
        into a row that is gone), and the returned notice says so; None otherwise. A rename (which leaves `updated`
        as it was) by another chat's saved-chats list stands: this chat takes that title, unless it renamed the
        chat itself since (its own /rename, the last, wins)."""
        now = time.time()
        sampling = json.dumps(s.sampling)
        notice: str | None = None
        title = s.title
        with self._errors("save to"), self._transaction():
            id = s.id
            if id is not None:
                found = self.db.execute("SELECT updated, title FROM sessions WHERE id=?", (id,)).fetchone()
                if found is None or found[0] != s.saved_at:
                    why = "deleted" if found is None else "changed"
                    notice = f"chat {id} was {why} by another minisgl chat using {self.path}; this conversation"
                    id = None
                elif (s.title or "untitled") == s.saved_title and found[1] != s.saved_title:
                    title = found[1]  # renamed elsewhere: overwriting it lost the new name without a word
            written = title or "untitled"
            row = (written, s.model, s.system, s.temperature, s.max_tokens, s.thinking, sampling, now)
            if id is None:
                id = self._last_id() + 1
                self.db.execute(
                    "INSERT INTO sessions (title, model, system, temperature, max_tokens, thinking, sampling,"
                    " updated, id, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*row, id, now),
                )
                self._last_id()  # noted now too: an older minisgl deleting this chat would note nothing
            else:
                self.db.execute(
                    "UPDATE sessions SET title=?, model=?, system=?, temperature=?, max_tokens=?, thinking=?,"
                    " sampling=?, updated=? WHERE id=?",
                    (*row, id),
                )
            self.db.executemany(
                "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(id, i, *_message_row(m)) for i, m in enumerate(s.history)],
            )
            self.db.execute("DELETE FROM messages WHERE session_id=? AND seq>=?", (id, len(s.history)))
            self.db.execute("DELETE FROM inputs WHERE session_id=?", (id,))
            self.db.executemany("INSERT INTO inputs VALUES (?, ?, ?)", [(id, i, x) for i, x in enumerate(inputs)])
        s.id, s.saved_at = id, now  # only once committed: a failed save leaves the session as it was
        s.title, s.saved_title = title, written
        return None if notice is None else f"{notice} is saved anew as chat {id}"

    def rename(self, id: int, title: str) -> None:
        with self._errors("rename in"):
            self.db.execute("UPDATE sessions SET title=? WHERE id=?", (title, id))

    def delete(self, id: int) -> None:
        with self._errors("delete from"), self._transaction():
            self._last_id()  # before the row goes: it may be the newest
            self.db.execute("DELETE FROM sessions WHERE id=?", (id,))

    def _last_id(self) -> int:
        """The highest chat id ever handed out, noted in `meta` as it is now (inside the caller's transaction). The
        rows count too: a file written before `meta` was, or chats an older minisgl added, which it does not note."""
        self.db.execute(META)  # a file of an earlier minisgl, at the same schema, has no such table
        self.db.execute(
            "INSERT INTO meta VALUES ('last_id', (SELECT IFNULL(MAX(id), 0) FROM sessions))"
            " ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)"
        )
        last: int = self.db.execute("SELECT value FROM meta WHERE key = 'last_id'").fetchone()[0]
        return last

    # ---- reading --------------------------------------------------------------------------------------------
    def sessions(self, match: str = "") -> list[SessionInfo]:
        """Most recently updated first; with `match`, those whose title or a message holds it, ignoring case (Unicode's
        case folding: "STRASSE" finds "Straße")."""
        # LIKE's wildcards in `match` are its own characters
        folded = match.casefold()
        pattern = "%" + folded.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._errors("read"):
            rows = self.db.execute(
                "SELECT s.id, s.title, s.model, COUNT(m.seq), s.updated FROM sessions s"
                " LEFT JOIN messages m ON m.session_id = s.id"
                " WHERE ? = '' OR casefold(s.title) LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages f"
                " WHERE f.session_id = s.id AND casefold(f.content) LIKE ? ESCAPE '\\')"
                " GROUP BY s.id ORDER BY s.updated DESC, s.id DESC",
                (match, pattern, pattern),
            ).fetchall()
        return [SessionInfo(*r) for r in rows]

    def last_id(self) -> int | None:
        found = self.sessions()
        return found[0].id if found else None

    def load(self, id: int, max_tokens_limit: int | None = None) -> tuple[ChatSession, list[str]]:
        """The session and its input history; KeyError if there is no such session. max_tokens_limit: the context
        of the model it goes on with (a saved max_tokens at or above it is cut below it)."""
        with self._errors("read"):
            row = self.db.execute(
                "SELECT title, model, system, temperature, max_tokens, thinking, sampling, updated FROM sessions"
                " WHERE id=?",
                (id,),
            ).fetchone()
            if row is None:
                raise KeyError(id)
            messages = self.db.execute(
                "SELECT role, content, reasoning, created, finish_reason, ttft, prompt_tokens, output_tokens,"
                " reasoning_tokens, cache_hit_tokens, itls_ms FROM messages WHERE session_id=? ORDER BY seq",
                (id,),
            ).fetchall()
            inputs = [r[0] for r in self.db.execute("SELECT line FROM inputs WHERE session_id=? ORDER BY seq", (id,))]
        title, model, system, temperature, max_tokens, thinking, sampling, updated = row
        if max_tokens_limit is not None:
            max_tokens = min(max_tokens, max_tokens_limit - 1)
        try:
            settings = json.loads(sampling)
            if not isinstance(settings, dict):
                raise ValueError(f"not a JSON object: {sampling!r}")
            ChatSession(sampling=settings)  # each name and value checked as /set checks them
        except ValueError as e:
            raise StoreError(f"cannot read chat {id} of {self.path}: its sampling settings: {e}") from None
        s = ChatSession(
            system=system,
            temperature=temperature,
            max_tokens=max_tokens,
            max_tokens_limit=max_tokens_limit,
            thinking=None if thinking is None else bool(thinking),
            sampling=settings,
            id=id,
            title=title,
            model=model,
            saved_at=updated,
            saved_title=title,
        )
        s.history = [_message(r) for r in messages]
        return s, inputs


def _message_row(m: ChatMessage) -> tuple:
    t = m.stats
    if t is None:
        return (m.role, m.content, m.reasoning, m.created) + (None,) * 10
    itls = json.dumps([round(g * 1e3, 3) for g in t.itls])
    return (
        m.role,
        m.content,
        m.reasoning,
        m.created,
        t.finish_reason,
        t.ttft,
        t.tbt_p50,
        t.tbt_p90,
        t.decode_tps,
        t.prompt_tokens,
        t.output_tokens,
        t.reasoning_tokens,
        t.cache_hit_tokens,
        itls,
    )


def _message(r: tuple) -> ChatMessage:
    role, content, reasoning, created, finish, ttft, prompt, output, reasoning_tokens, hits, itls = r
    stats = None
    if output is not None:
        gaps = [g / 1e3 for g in json.loads(itls or "[]")]
        stats = TurnStats(prompt, hits or 0, output, reasoning_tokens or 0, ttft, gaps, sum(gaps), finish)
    return ChatMessage(role, content, reasoning, stats, created)


def _casefold(text: str | bytes | int | float | None) -> str | bytes | int | float | None:
    """SQL casefold(): a text's Unicode case folding; NULL and other values as they are."""
    return text.casefold() if isinstance(text, str) else text
