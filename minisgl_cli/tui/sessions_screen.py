"""The saved-sessions list (ctrl+o, /sessions): enter opens one, r renames, d twice deletes, / filters, esc closes."""

from __future__ import annotations

import time

from rich.cells import set_cell_size
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from minisgl_cli.tui.store import ChatStore, SessionInfo, StoreError


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


class Renamed(Message):
    """A saved session was renamed in the list (the open one needs its title updated too)."""

    def __init__(self, id: int, title: str) -> None:
        super().__init__()
        self.id, self.title = id, title


class SessionsScreen(ModalScreen[int | None]):
    """Dismisses with the id of the session to open, or None."""

    DEFAULT_CSS = """
    SessionsScreen { align: center middle; }
    SessionsScreen > Vertical {
        width: 90; max-width: 100%; height: 24; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    SessionsScreen OptionList { height: 1fr; }
    SessionsScreen #filter { border: none; height: 1; padding: 0; }
    SessionsScreen #filter:focus { background: $boost; }
    SessionsScreen #rename { display: none; }
    SessionsScreen #rename.-open { display: block; }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("slash", "filter", "Filter"),
        Binding("down", "to_list", show=False),  # in the filter (the list takes its own up and down)
    ]

    def __init__(self, store: ChatStore, current: int | None) -> None:
        super().__init__()
        self.store, self.current = store, current
        self.infos: list[SessionInfo] = []
        self._armed: int | None = None  # the session a first `d` marked for deletion

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Saved chats   enter open · r rename · d d delete · / filter · esc close", classes="title")
            yield Input(id="filter", placeholder="/ to filter by title or message text")
            yield OptionList(id="list")
            yield Input(id="rename", placeholder="new title, enter to save, esc to cancel")

    def on_mount(self) -> None:
        self.reload()
        self.query_one(OptionList).focus()

    @property
    def match(self) -> str:
        return self.query_one("#filter", Input).value.strip()

    def reload(self, top: bool = False) -> None:
        """The list again (with the filter's text, if any), the same row highlighted, or the first with `top`."""
        try:
            self.infos = self.store.sessions(self.match)
        except StoreError as e:
            self.app.notify(str(e), title="sessions", severity="error", markup=False)
            self.infos = []
        box = self.query_one(OptionList)
        keep = 0 if top else box.highlighted or 0
        box.clear_options()
        box.add_options(
            [
                Option(  # Text: a title is shown as typed, never read as markup
                    Text(
                        # cut and padded by terminal cells: an emoji takes two, and str's widths shifted the columns
                        f"{'▶ ' if i.id == self.current else '  '}{set_cell_size(i.title, 48)} "
                        f"{i.messages:>3} {'msg ' if i.messages == 1 else 'msgs'}  {_when(i.updated)}"
                    ),
                    id=str(i.id),
                )
                for i in self.infos
            ]
        )
        if not self.infos:
            box.add_option(
                Option(Text(f"(no chat holds {self.match!r})" if self.match else "(no saved chats yet)"), disabled=True)
            )
        else:
            box.highlighted = min(keep, len(self.infos) - 1)

    def selected(self) -> SessionInfo | None:
        box = self.query_one(OptionList)
        if box.highlighted is None or box.highlighted >= len(self.infos):
            return None
        return self.infos[box.highlighted]

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_close(self) -> None:
        """esc: out of the rename field or the filter (which keeps its text) to the list, else close."""
        box = self.query_one("#rename", Input)
        if box.has_class("-open"):
            box.remove_class("-open")
            self.query_one(OptionList).focus()
        elif self.query_one("#filter", Input).has_focus:
            self.query_one(OptionList).focus()
        else:
            self.dismiss(None)

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_to_list(self) -> None:
        if self.query_one("#filter", Input).has_focus:
            self.query_one(OptionList).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.reload(top=True)

    def action_rename(self) -> None:
        info = self.selected()
        if info is None:
            return
        box = self.query_one("#rename", Input)
        box.value = info.title
        box.add_class("-open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        info, title = self.selected(), event.value.strip()
        if event.input.id == "filter":  # enter opens the row highlighted, the first match unless moved
            if info is not None:
                self.dismiss(info.id)
            return
        event.input.remove_class("-open")
        self.query_one(OptionList).focus()
        if info is None or not title:
            return
        try:
            self.store.rename(info.id, title)
        except StoreError as e:
            self.app.notify(str(e), title="rename", severity="error", markup=False)
        self.app.post_message(Renamed(info.id, title))
        self.reload()

    def action_delete(self) -> None:
        info = self.selected()
        if info is None:
            return
        if info.id == self.current:
            self.app.notify(
                "this is the open chat: start a new one (ctrl+n) to delete it", severity="warning", markup=False
            )
            return
        if self._armed != info.id:
            self._armed = info.id
            self.app.notify(f"press d again to delete {info.title!r}", severity="warning", markup=False)
            return
        self._armed = None
        try:
            self.store.delete(info.id)
        except StoreError as e:
            self.app.notify(str(e), title="delete", severity="error", markup=False)
        self.reload()
