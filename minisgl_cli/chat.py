"""placeholder: being written (see the issue for `minisgl chat`)."""
import typer


def register(app: typer.Typer) -> None:
    pass
