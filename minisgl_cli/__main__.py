import sys

from minisgl_cli.ctrl_c import deliver_after_finalizers

deliver_after_finalizers()  # before the imports below, in which a Ctrl-C can land in a finalizer too
try:
    from minisgl_cli.app import main
except KeyboardInterrupt:  # Ctrl-C while the CLI imports (e.g. a bench-offline peer child stopped at once)
    sys.exit(130)

main()
