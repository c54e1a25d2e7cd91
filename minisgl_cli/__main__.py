import sys

try:
    from minisgl_cli.app import main
except KeyboardInterrupt:  # Ctrl-C while the CLI imports (e.g. a bench-offline peer child stopped at once)
    sys.exit(130)

main()
