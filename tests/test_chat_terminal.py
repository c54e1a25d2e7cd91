"""`minisgl chat` in a real terminal (tmux): the TUI runs in a child of the engine's process on the same terminal
(minisgl_cli/tui/frontend.py). A person's view: the answer appears, the panel counts it, ctrl+q ends both processes
and leaves the terminal to the shell. And if the engine's process is killed outright, the chat says so."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.turn import TurnStats
from tests.test_chat_plain import MINISGL, TINY

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Terminal:
    def __init__(self, sock: Path) -> None:
        self.sock = str(sock)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "chat")

    def wait_for(self, cond: Callable[[str], bool], what: str, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                return text
            assert time.monotonic() < end, f"timed out waiting for {what}; the screen:\n{text}"
            time.sleep(0.2)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path / "tmux.sock")
    yield term
    subprocess.run(["tmux", "-S", term.sock, "kill-server"], capture_output=True)


def processes(marker: str) -> dict[int, int]:
    """pid -> parent pid of the Python processes whose command line holds `marker`: the engine's and the chat's
    (not the shell or tmux that started them)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if "python" in Path(argv[0].decode()).name and any(marker.encode() in a for a in argv):
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone meanwhile
    return found


def start(term: Terminal, tmp_path: Path, command: str) -> None:
    """`command` in the terminal; its exit status goes to tmp_path/status. The terminal's own size, not the COLUMNS
    and LINES this process may have in its environment (80x24 here: the TUI ran 80 columns wide)."""
    status = tmp_path / "status"
    term.tmux(
        "new-session",
        "-d",
        "-s",
        "chat",
        "-x",
        "120",
        "-y",
        "40",
        # written whole, then renamed: a reader polling for the file once found it created and still empty
        f"unset COLUMNS LINES; {command}; echo $? > {status}.part; mv {status}.part {status}; sleep 600",
    )


def start_chat(term: Terminal, tmp_path: Path, marker: str, *flags: str, env: str = "") -> None:
    flags = flags or ("--no-save", "--max-tokens", "6")
    start(term, tmp_path, f"{env} {' '.join([MINISGL, 'chat', *TINY, *flags, '--system', marker])}")
    term.wait_for(lambda s: "Type a message" in s, "the chat to start")


def exit_status(term: Terminal, tmp_path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not (tmp_path / "status").exists():
        assert time.monotonic() < deadline, term.screen()
        time.sleep(0.1)
    return int((tmp_path / "status").read_text())


def engine_pid(marker: str) -> int:
    pids = processes(marker)
    [engine] = [pid for pid, parent in pids.items() if parent not in pids]
    return engine


def gone(marker: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not processes(marker)


def test_the_tui_answers_and_ctrl_q_ends_both_processes(terminal, tmp_path):
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    start_chat(terminal, tmp_path, marker)
    assert len(processes(marker)) == 2  # the engine's process and the chat's
    terminal.tmux("send-keys", "-t", "chat", "hello there", "Enter")
    screen = terminal.wait_for(lambda s: "/ 6 out" in s, "the answer's numbers")
    assert "tiny-llama" in screen and "hello there" in screen
    terminal.tmux("send-keys", "-t", "chat", "C-q")
    assert exit_status(terminal, tmp_path) == 0
    assert processes(marker) == {}


@pytest.mark.parametrize("noticed", [False, True], ids=["message-first", "watch-first"])
def test_a_killed_engine_process_shows_in_the_chat(terminal, tmp_path, noticed):
    """The chat watches its engine's process (every 0.5 s). A message sent before it notices fails as an answer; one
    sent after is refused on the spot ("cannot send"). Either way the screen says the engine exited (CI once sent it
    after: the test waited for the first wording only)."""
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    start_chat(terminal, tmp_path, marker)
    os.kill(engine_pid(marker), signal.SIGKILL)
    if noticed:
        time.sleep(2.0)
    terminal.tmux("send-keys", "-t", "chat", "anyone there?", "Enter")
    # sent at once, it usually arrives before the watch notices; not always (a loaded machine)
    said = ("cannot send",) if noticed else ("failed", "cannot send")
    terminal.wait_for(lambda s: "exited" in s and any(w in s for w in said), "the chat to report the engine gone")
    terminal.tmux("send-keys", "-t", "chat", "C-q")
    assert gone(marker), terminal.screen()


BROKEN_BACKEND = """
import sys
from minisgl_cli.tui.frontend import run_chat
from minisgl_cli.tui.session import ChatSession

class Broken:
    model = title = "broken"
    context_limit = thinking_switch = None

    async def ready(self):
        raise RuntimeError("the backend broke")

    async def load(self):
        return None

    async def aclose(self):
        pass

sys.exit(run_chat(Broken(), ChatSession(), None, [], None, False))
"""


def test_a_crashed_tui_exits_non_zero(terminal, tmp_path):
    """The chat's process exits with the app's return code: `minisgl chat` passes it on, so a crash is no clean
    exit (it once exited 0)."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_BACKEND)
    start(terminal, tmp_path, f"{sys.executable} {script}")
    assert exit_status(terminal, tmp_path, timeout=120) == 1
    assert "the backend broke" in terminal.screen()


def test_ctrl_c_while_the_model_loads_exits_quietly(terminal, tmp_path):
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    start(terminal, tmp_path, f"{MINISGL} chat --device cpu --no-save --system {marker}")  # SmolLM2: seconds to load
    deadline = time.monotonic() + 60
    while len(processes(marker)) < 2:  # the chat's process is importing, the engine's loading the model
        assert time.monotonic() < deadline, terminal.screen()
        time.sleep(0.02)
    time.sleep(0.5)  # into the chat's imports (past Python's own start)
    terminal.tmux("send-keys", "-t", "chat", "C-c")
    assert exit_status(terminal, tmp_path, timeout=60) == 130, terminal.screen()
    assert "Traceback" not in terminal.screen() and "KeyboardInterrupt" not in terminal.screen(), terminal.screen()
    assert gone(marker)


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    """TMPDIR for the chat: where its engine's IPC directory goes (short: a socket path has ~100 bytes)."""
    where = Path(tempfile.mkdtemp(prefix="mc-"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def answering(term: Terminal, tmp_path: Path, marker: str, ipc_dir: Path) -> Path:
    """A saved chat in the middle of a long answer; its database. SmolLM2's shapes: the tiny model streamed all 1,900
    tokens in ~1.2 s, and under CI's load the answer could end before the signal came."""
    db = tmp_path / "chat.db"
    flags = ("--model", "dummy:SmolLM2-135M", "--db", str(db), "--max-tokens", "1900")
    start_chat(term, tmp_path, marker, *flags, env=f"TMPDIR={ipc_dir}")
    assert [p.name.startswith("minisgl-") for p in ipc_dir.iterdir()] == [True]
    term.tmux("send-keys", "-t", "chat", "hello there", "Enter")
    term.wait_for(lambda s: int((re.findall(r"/ (\d+) out", s) or ["0"])[-1]) >= 10, "the answer to stream")
    return db


def saved_answer(db: Path) -> TurnStats:
    session, inputs = ChatStore(db).load(1)
    assert [m.role for m in session.history] == ["user", "assistant"] and inputs == ["hello there"]
    stats = session.history[1].stats
    assert stats is not None and 10 <= stats.output_tokens < 1900
    return stats


def test_sigterm_mid_answer_restores_the_terminal_and_saves_the_answer(terminal, tmp_path, ipc_dir):
    """`kill <minisgl chat>`: its chat's process, which it ends with SIGTERM, leaves the app as ctrl+q does (it
    died on the spot: the terminal stayed in the alternate screen with mouse reporting on, and the answer was
    lost), and `minisgl chat` exits 143 (it exited 0)."""
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    db = answering(terminal, tmp_path, marker, ipc_dir)
    os.kill(engine_pid(marker), signal.SIGTERM)
    assert exit_status(terminal, tmp_path) == 143
    modes = "#{alternate_on} #{mouse_any_flag} #{mouse_button_flag} #{mouse_standard_flag} #{mouse_sgr_flag}"
    assert terminal.tmux("display", "-p", "-t", "chat", modes).split() == ["0"] * 5
    assert gone(marker) and list(ipc_dir.iterdir()) == []
    assert saved_answer(db).finish_reason == "abort"  # the engine was shut down, not crashed: it saved "error"


def test_closing_the_terminal_mid_answer_saves_it_and_cleans_up(terminal, tmp_path, ipc_dir):
    """SIGHUP to both processes: the chat saves the answer as stopped, the engine's process removes its IPC
    directory (it died on the spot and left it). Both are gone within seconds: restoring a terminal that is gone
    could hang the chat's process until the engine's killed it 10 s later (2 of 4 tries); it now leaves after 2 s."""
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    db = answering(terminal, tmp_path, marker, ipc_dir)
    terminal.tmux("kill-session", "-t", "chat")
    assert gone(marker, timeout=7)
    assert list(ipc_dir.iterdir()) == []
    assert saved_answer(db).finish_reason == "abort"


def test_the_terminal_says_why_it_waits_for_the_engines_step(capsys):
    """The engine ends its loop only between steps: after the chat quit mid-way through a long prompt's prefill on a
    CPU the terminal gave no prompt back for 13-16 s, with nothing on it. run_beside_front_end's watcher says so once
    the chat has exited and the loop has not ended STEP_NOTICE_S later, and says nothing when it has."""
    import threading

    from engine.engine_loop import EngineLoop, engine_info
    from engine.ipc import Addresses
    from minisgl_cli.serve import STEP_NOTICE_S, _when_the_front_end_exits
    from tests.conftest import make_llm

    llm = make_llm()
    addrs = Addresses.temporary()
    loop = EngineLoop(llm.engine, addrs, engine_info(llm))
    try:
        ended = threading.Event()
        _when_the_front_end_exits(subprocess.Popen(["true"]), loop, ended, True)  # the chat gone, the step going on
        assert "minisgl chat: the engine is ending its current step" in capsys.readouterr().err
        ended.set()
        started = time.monotonic()
        _when_the_front_end_exits(subprocess.Popen(["true"]), loop, ended, True)  # the loop ended with the chat
        assert capsys.readouterr().err == "" and time.monotonic() - started < STEP_NOTICE_S
        _when_the_front_end_exits(subprocess.Popen(["true"]), loop, threading.Event(), False)  # serve's: says nothing
        assert capsys.readouterr().err == ""
    finally:
        loop.close()
        addrs.remove()
