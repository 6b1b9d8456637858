import sys

try:
    from kvstore.cli import main

    status = main()
except KeyboardInterrupt:  # Ctrl-C before main() took it over: while the CLI loads
    print("kvstore: error: interrupted", file=sys.stderr)
    status = 130
raise SystemExit(status)
