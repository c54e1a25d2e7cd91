"""The `minisgl` command: chat, bench-offline, bench-trace, bench-serve, bench-compare, serve, cache. Each command
module imports torch and the engine only inside its command, so `minisgl --help` stays fast."""

from __future__ import annotations

import typer
from typer.core import TyperCommand

from minisgl_cli import bench_compare, bench_offline, bench_serve, bench_trace, cache, chat, serve
from minisgl_cli.options import PlainCommand

app = typer.Typer(
    help="minisgl: a small, fast LLM inference engine - chat, benchmark, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's boxed table cut long flag names to "--repetition-pen…" in an 80-column terminal
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as vLLM's and SGLang's commands take it
)


def _version(value: bool) -> None:
    if value:
        from minisgl_cli import version

        typer.echo(f"minisgl {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version and exit"),
) -> None:
    pass


for module in (chat, bench_offline, bench_trace, bench_serve, bench_compare, serve, cache):
    module.register(app)


def _plain_usage(typer_app: typer.Typer) -> None:
    """Every command, those of a group such as `cache` too, is a PlainCommand: click's `FILES...` in its usage."""
    for info in typer_app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default
            info.cls = PlainCommand
        assert issubclass(info.cls, PlainCommand), f"{info.name}: {info.cls} is no PlainCommand"
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        _plain_usage(group.typer_instance)


_plain_usage(app)


def main() -> None:
    import sys

    from minisgl_cli.ctrl_c import deliver_after_finalizers

    deliver_after_finalizers()
    sys.argv = chat.resume_flag(sys.argv)
    try:
        app()  # standalone: it ends in SystemExit, also when the command returns
    except SystemExit as e:
        from minisgl_cli.process_exit import exit_now

        exit_now(e.code)
