"""The `minisgl chat` front ends: a Textual app (app.py) and a plain line-by-line mode (plain.py), both reaching the
engine through one backend (local.py: the engine loop in another process; remote.py: a server) and sharing the
conversation state (session.py), slash commands (commands.py) and turn metrics (stats.py)."""
