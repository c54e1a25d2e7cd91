"""The `minisgl chat` front ends: a Textual app (app.py) and a plain line-by-line mode (plain.py), both reaching the
engine through one backend interface (backend.py; local.py: the engine loop in another process; server_backend.py: a
server, through remote.py's client) and sharing the conversation state (session.py), slash commands (commands.py),
turn metrics (turn.py) and the figures they show (stats.py)."""
