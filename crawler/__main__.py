import sys

try:
    from crawler.cli import main

    status = main()
except KeyboardInterrupt:  # Ctrl-C before the command took SIGINT over: while modules load
    print("crawler: interrupted", file=sys.stderr)
    status = 130
raise SystemExit(status)
