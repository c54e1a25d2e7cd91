"""placeholder: being written (see the issue for `minisgl bench-trace`)."""
import typer


def register(app: typer.Typer) -> None:
    pass
