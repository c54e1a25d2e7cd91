"""`minisgl chat` in a real terminal (tmux): the TUI runs in a child of the engine's process on the same terminal
(minisgl_cli/tui/frontend.py). A person's view: the answer appears, the panel counts it, ctrl+q ends both processes
and leaves the terminal to the shell. And if the engine's process is killed outright, the chat says so."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


def start_chat(term: Terminal, tmp_path: Path, marker: str) -> None:
    chat = [MINISGL, "chat", *TINY, "--no-save", "--max-tokens", "6", "--system", marker]
    status = tmp_path / "status"
    term.tmux(
        "new-session", "-d", "-s", "chat", "-x", "120", "-y", "40", f"{' '.join(chat)}; echo $? > {status}; sleep 600"
    )
    term.wait_for(lambda s: "Type a message" in s, "the chat to start")


def test_the_tui_answers_and_ctrl_q_ends_both_processes(terminal, tmp_path):
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    start_chat(terminal, tmp_path, marker)
    assert len(processes(marker)) == 2  # the engine's process and the chat's
    terminal.tmux("send-keys", "-t", "chat", "hello there", "Enter")
    screen = terminal.wait_for(lambda s: "/ 6 out" in s, "the answer's numbers")
    assert "tiny-llama" in screen and "hello there" in screen
    terminal.tmux("send-keys", "-t", "chat", "C-q")
    deadline = time.monotonic() + 30
    while not (tmp_path / "status").exists():
        assert time.monotonic() < deadline, terminal.screen()
        time.sleep(0.2)
    assert (tmp_path / "status").read_text().strip() == "0"
    assert processes(marker) == {}


def test_a_killed_engine_process_shows_in_the_chat(terminal, tmp_path):
    marker = f"terminal-{uuid.uuid4().hex[:8]}"
    start_chat(terminal, tmp_path, marker)
    pids = processes(marker)
    [engine] = [pid for pid, parent in pids.items() if parent not in pids]
    os.kill(engine, signal.SIGKILL)
    terminal.tmux("send-keys", "-t", "chat", "anyone there?", "Enter")
    terminal.wait_for(lambda s: "exited" in s and "failed" in s, "the chat to report the engine gone")
    terminal.tmux("send-keys", "-t", "chat", "C-q")
    deadline = time.monotonic() + 30
    while processes(marker):
        assert time.monotonic() < deadline, terminal.screen()
        time.sleep(0.2)
