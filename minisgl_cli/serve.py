"""placeholder: being written (see the issue for `minisgl serve`)."""
import typer


def register(app: typer.Typer) -> None:
    pass
