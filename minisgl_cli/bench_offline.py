"""placeholder: being written (see the issue for `minisgl bench-offline`)."""
import typer


def register(app: typer.Typer) -> None:
    pass
