import logging
import os
import sys

try:
    from crawler.cli import main

    status = main()
except KeyboardInterrupt:  # Ctrl-C before the command took SIGINT over: while modules load
    print("crawler: interrupted", file=sys.stderr)
    status = 130
common = sys.modules.get("crawler.cli._common")  # not loaded if Ctrl-C came first
if common is not None and common.exit_at_once_asked():  # a thread in native code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        common.flush_or_quiet(stream)
    os._exit(status)
raise SystemExit(status)
