"""The ``python -m crawler`` parser and dispatch, over the command modules.

A command named on the command line loads only its own module (``start`` needs
neither numpy nor lxml, and its process supervises the crawl for its whole
length); no command or an unknown one (``python -m crawler --help``, a typo) load
them all."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType, ModuleType

from ..exceptions import CrawlerError, UsageError
from ..read.display import printable
from ._common import DefaultsFormatter, Parser, flush_or_quiet

# Each command's module, in the order ``--help`` lists them. A module adds its own
# commands (``add_parsers``) and names them in its ``COMMANDS`` table; a test holds
# that table and this one equal.
MODULE_OF = {
    "demo": "demo",
    "start": "crawl",
    "status": "status",
    "export": "export",
    "pages": "pages",
    "show": "pages",
    "links": "links",
    "rank": "rank",
    "report": "report",
    "index": "index",
    "search": "search",
    "serve": "report",
    "retry": "retry",
    "recrawl": "recrawl",
    "sitemaps": "sitemaps",
    "move-shard": "moveshard",
    "reshard": "reshard",
    "compact": "compact",
}


def command_modules(argv: Sequence[str] | None = None) -> list[ModuleType]:
    """The modules that parse ``argv``: its command's one, or all of them."""
    names = list(dict.fromkeys(MODULE_OF.values()))
    if argv and argv[0] in MODULE_OF:
        names = [MODULE_OF[argv[0]]]
    return [importlib.import_module(f"{__package__}.{name}") for name in names]


def build_parser(modules: Sequence[ModuleType] | None = None) -> Parser:
    parser = Parser(prog="python -m crawler", description="A single-PC web crawler on kvstore.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in modules if modules is not None else command_modules():
        module.add_parsers(sub)
    for command in sub.choices.values():  # every command's --help shows its defaults
        command.formatter_class = DefaultsFormatter
    return parser


def _dash_hint(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The hint of ``argv``'s command for an argument that starts with "-" (an argument
    the command leaves over is an error of the top parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv:
            return getattr(action.choices.get(argv[0]), "dash_hint", None)
    return None


def _store_errors() -> tuple[type[BaseException], ...]:
    """kvstore's errors, if a command imported kvstore (one that did not cannot meet them)."""
    exceptions = sys.modules.get("kvstore.exceptions")
    return (exceptions.KVStoreError,) if exceptions is not None else ()


TERMINATED = 143  # 128 + SIGTERM: what a shell reports for a command SIGTERM stopped
# Commands that take SIGTERM themselves (start: a clean stop of the crawl).
OWN_SIGNALS = frozenset({"start"})


class _Terminated:
    """Whether a SIGTERM came (a flag the handler sets before it raises)."""

    came = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _Terminated.came = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM stops at once
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (systemd, ``timeout``, a scheduler) stops a command as Ctrl-C does, so
    its clean-up runs: an export removes its files, rank its work directory. Only where
    SIGTERM has its default action and in the main thread (a command run by another,
    like demo's steps, is already covered)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    _Terminated.came = False
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    modules = command_modules(argv)
    parser = build_parser(modules)
    parser.dash_hint = _dash_hint(parser, argv)
    try:
        args = parser.parse_args(argv)
        for module in modules:  # combinations argparse cannot express; parser.error exits 2
            check: Callable[..., None] | None = getattr(module, "check_usage", None)
            if check is not None:
                check(parser, args)
    except SystemExit as exc:
        return int(exc.code or 0)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {}
    for module in modules:
        commands.update(module.COMMANDS)
    run = commands[args.command]
    try:
        if args.command in OWN_SIGNALS:
            status = run(args)
        else:
            with sigterm_as_ctrl_c():
                status = run(args)
            # stopped by SIGTERM (the command said so on stderr, or served to its end)
            status = TERMINATED if _Terminated.came and status in (0, 130) else status
        flush_or_quiet(sys.stdout)  # a reader gone (`| head`) shows here, not at the exit
        return status
    except BrokenPipeError:
        # A reader went away (`status | head -3`): not an error, no message; exit 0.
        for stream in (sys.stdout, sys.stderr):
            flush_or_quiet(stream)
        return 0
    except KeyboardInterrupt:
        if not _Terminated.came:
            raise  # Ctrl-C: __main__ says "interrupted", 130
        print("crawler: terminated", file=sys.stderr)
        return TERMINATED
    except Exception as exc:
        # OSError: what no command foresaw (a disk error...): one line, not a trace
        if not isinstance(exc, (CrawlerError, OSError, *_store_errors())):
            raise
        # printable: a message may quote a damaged file or a value typed with a newline
        print(f"crawler: error: {printable(str(exc))}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
