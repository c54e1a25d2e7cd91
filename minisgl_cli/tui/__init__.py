"""The `minisgl chat` front ends: a Textual app (app.py) and a plain line-by-line mode (plain.py), both driving
one AsyncLLM and sharing the conversation state (session.py), slash commands (commands.py) and turn metrics
(stats.py)."""
