"""The ``export`` command: a crawl's pages to WARC, WACZ and/or JSON lines."""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import logging
import os
import shlex
import shutil
import sys
from typing import Any

from .. import config as cfgmod
from ..exceptions import CrawlerError
from ..read.export import export
from ..read.listing import DEFAULT_MAX_TEXT_CHARS
from ..read.markdown import INDEX as MARKDOWN_INDEX
from ..read.warc import split_name
from ..state.settings import load_settings, settings_path
from ._common import count, log_to_stderr, number, size_in, stdout_gone
from .progress import DEFAULT_INTERVAL, Progress
from .startopts import check_saved, header_value

log = logging.getLogger(__name__)
INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)


def add_parsers(sub: Any) -> None:
    export_p = sub.add_parser(
        "export",
        help="export a crawl's pages to WARC, WACZ and/or JSON lines",
        description="Write every page record of a crawl (running or stopped: read-only, "
        "streaming) as Markdown (--markdown: each page's main content, for people and "
        "language models), as WARC (warcinfo, then request/response records, revisits for repeated "
        "payloads, conversion records of browser-rendered DOMs, metadata records for URLs with no "
        "answer), as a WACZ package (those WARC records with a CDXJ index, a page list and "
        "a datapackage.json with digests: a file replay tools such as pywb and "
        "ReplayWeb.page open) and/or as JSON lines. "
        "The formats are described in docs/EXPORT.md. Every file is logged as it is "
        "finished (name, records, bytes) and the last line on stdout lists the files written "
        "(on stderr when --jsonl - takes stdout). Progress (percentage, rate, time left) goes "
        "to stderr: a bar on a terminal, else a line every --progress-interval seconds. All "
        "or nothing: an export that fails (exit 1) or is interrupted (exit 130; SIGTERM: 143) "
        "removes every file it wrote.",
        epilog="example: python -m crawler export crawl1 --warc crawl1.warc.gz --max-size 1G "
        "--jsonl crawl1.jsonl --text   (writes crawl1-00000.warc.gz, crawl1-00001.warc.gz... "
        "and crawl1.jsonl; then: python -m warcio.cli check crawl1-*.warc.gz)",
    )
    export_p.add_argument("data", metavar="DIR", help="crawl data directory")
    export_p.add_argument(
        "--warc", metavar="OUT.warc.gz",
        help="WARC output, written under exactly this name unless --max-size splits it "
        "(gzip per record if it ends in .gz)",
    )
    export_p.add_argument(
        "--wacz", metavar="OUT.wacz",
        help="WACZ 1.1.1 output: the WARC records (one WARC, never split), a CDXJ index, "
        "pages/pages.jsonl and datapackage.json with SHA-256 digests, in one ZIP",
    )
    export_p.add_argument(
        "--max-size",
        type=size_in(1, cfgmod.MAX_WARC_SIZE),
        metavar="BYTES",
        help="split the WARC: a new file once one reaches BYTES (K, M, G suffixes). The files "
        "are always numbered, OUT-00000.warc.gz, OUT-00001.warc.gz... (like wget "
        "--warc-max-size), even when one file results: OUT.warc.gz itself is not written",
    )
    export_p.add_argument(
        "--jsonl", metavar="OUT.jsonl", help="JSON lines output, one object per page (- = stdout)"
    )
    export_p.add_argument(
        "--markdown", metavar="OUTDIR",
        help="one Markdown file per page (main content, boilerplate removed; title, URL, "
        "fetch time and language in YAML front matter) in a new directory: "
        "OUTDIR/HOST/URLKEY.md",
    )
    export_p.add_argument(
        "--text", action="store_true", help="add each page's visible text to the JSONL objects"
    )
    export_p.add_argument(
        "--text-limit",
        type=count(1, cfgmod.MAX_BODY_BYTES),  # text is never longer than the stored body
        default=DEFAULT_MAX_TEXT_CHARS,
        metavar="CHARS",
        help="visible text kept per page",
    )
    export_p.add_argument(
        "--user-agent", type=header_value,
        help="User-Agent of the rebuilt WARC request records (default: the one the crawl "
        "sent, from its settings.json; for a crawl without one, the crawler's default)",
    )
    export_p.add_argument(
        "--no-revisits", action="store_true", help="write repeated payloads in full"
    )
    export_p.add_argument(
        "--skip-failures",
        action="store_true",
        help="no WARC metadata records for URLs that got no HTTP answer",
    )
    export_p.add_argument(
        "--strict",
        action="store_true",
        help="stop at a damaged record (exit 1) instead of skipping it with a warning",
    )
    export_p.add_argument(
        "--progress-interval",
        type=number(0, cfgmod.MAX_SECONDS),
        default=DEFAULT_INTERVAL,
        metavar="S",
        help="seconds between progress lines when stderr is not a terminal (default: "
        "%(default)s)",
    )
    export_p.add_argument(
        "--quiet", action="store_true", help="no progress: only warnings on stderr"
    )
    export_p.add_argument(
        "--force", action="store_true",
        help="replace outputs that exist (without it an export refuses them): files once "
        "the new ones are whole; a --markdown directory only if it holds a Markdown "
        "export, removed once the new one is whole",
    )


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    if args.command == "export":
        if not (args.warc or args.wacz or args.jsonl or args.markdown):
            parser.error("export: give --warc OUT.warc.gz, --wacz OUT.wacz, --jsonl OUT.jsonl "
                         "and/or --markdown OUTDIR")
        if args.warc == "-":
            parser.error("export: --warc needs a file name (WARC is not written to stdout)")
        if args.wacz is not None and not args.wacz.endswith(".wacz"):
            parser.error("export: --wacz needs a name ending in .wacz (WACZ 1.1.1 requires "
                         "the extension)")
        if args.max_size is not None and not args.warc:
            parser.error("export: --max-size splits the WARC output: give --warc")
        if args.text and not args.jsonl:
            parser.error("export: --text adds text to the JSONL output: give --jsonl")
        named = [(opt, os.path.abspath(value)) for opt, value in
                 (("--warc", args.warc), ("--wacz", args.wacz), ("--jsonl", args.jsonl),
                  ("--markdown", args.markdown))
                 if value and value != "-"]
        for i, (opt, path) in enumerate(named):
            for other, other_path in named[i + 1:]:
                if path == other_path:
                    parser.error(f"export: {opt} and {other} name the same file")


_HINTS = {
    errno.EACCES: "permission denied: write somewhere you may",
    errno.EPERM: "permission denied: write somewhere you may",
    errno.EROFS: "read-only file system: write somewhere else",
    errno.ENOSPC: "disk full: free some space or write somewhere else",
    errno.EDQUOT: "disk quota exceeded: free some space or write somewhere else",
    errno.EFBIG: "file too large for this file system or the file size limit (ulimit -f)",
    errno.EISDIR: "is a directory: give a file name",
}


def write_error(what: str, exc: OSError) -> str:
    """One line for an output that cannot be written: the path (the user's name, not
    the ``.part`` being written), what is wrong and the fix."""
    path = exc.filename if isinstance(exc.filename, str) else ""
    path = path.removesuffix(".part")
    parent = os.path.dirname(os.path.abspath(path)) if path else ""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and parent and not os.path.isdir(parent):
        found = parent
        while not os.path.exists(found):
            found = os.path.dirname(found)
        hint = (f"the directory {parent} does not exist: create it first"
                if os.path.isdir(found) else f"{found} is a file, not a directory")
    else:
        hint = _HINTS.get(exc.errno or 0, exc.strerror or str(exc))
    return f"{what}: {path}: {hint}" if path else f"{what}: {hint}"


def _crawl_user_agent(data_dir: str) -> str:
    """The User-Agent the crawl sent (its saved settings, checked as a resume checks
    them: it goes into the WARC's request records), else the default."""
    saved = load_settings(data_dir) if os.path.isdir(data_dir) else None
    agent = (saved or {}).get("user_agent")
    if agent is None:
        return cfgmod.DEFAULT_USER_AGENT
    check_saved({"user_agent": agent}, settings_path(data_dir))
    return str(agent)


def existing(option: str, path: str | None, force: bool) -> list[str]:
    """What of output ``path`` (given as ``option``) exists already: nothing, or with
    ``force`` the paths it will replace; CrawlerError naming --force without it."""
    if path is None or path == "-" or not os.path.lexists(path):
        return []
    if os.path.isdir(path):  # not replaced even with --force: the write fails, naming it
        return []
    if not force:
        raise CrawlerError(f"{option} {path}: exists: give --force to replace it")
    return [path]


def _split_files(path: str) -> list[str]:
    """The numbered files of a split WARC named ``path`` that exist (OUT-00000.warc.gz...)."""
    found: list[str] = []
    while os.path.lexists(name := split_name(path, len(found))):
        found.append(name)
    return found


def _markdown_export(path: str) -> bool:
    """Whether directory ``path`` holds a Markdown export and nothing else (HOST/*.md,
    and its index)."""
    for host in os.scandir(path):
        if host.name == MARKDOWN_INDEX and host.is_file(follow_symlinks=False):
            continue
        if not host.is_dir(follow_symlinks=False):
            return False
        for entry in os.scandir(host.path):
            if not (entry.is_file(follow_symlinks=False) and entry.name.endswith(".md")):
                return False
    return True


def _replaced(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """One rule for every output: an existing one is refused unless --force (then: the
    files it will replace, and the --markdown directory set aside until the new one is
    whole). Checked before anything is read or written."""
    force = args.force
    files: list[str] = []
    for option, path in (("--wacz", args.wacz), ("--jsonl", args.jsonl)):
        files += existing(option, path, force)
    if args.warc is not None:
        found = _split_files(args.warc) if args.max_size is not None else []
        if args.max_size is None:
            files += existing("--warc", args.warc, force)
        elif found and not force:
            raise CrawlerError(f"--warc {args.warc}: {found[0]} exists (a split export): "
                               "give --force to replace the files")
        files += found
    aside = None
    if args.markdown is not None and os.path.lexists(args.markdown):
        if not force:
            raise CrawlerError(f"--markdown {args.markdown}: exists: give --force to "
                               "replace it")
        if os.path.islink(args.markdown) or not os.path.isdir(args.markdown) \
                or not _markdown_export(args.markdown):
            raise CrawlerError(f"--markdown {args.markdown}: not a Markdown export, so "
                               "--force leaves it alone: give a new directory")
        aside = args.markdown.rstrip(os.sep) + ".replaced"
        if os.path.lexists(aside):
            raise CrawlerError(f"--markdown {args.markdown}: {aside} exists (an export "
                               "stopped by a crash?): remove it first")
    return files, aside


def cmd_export(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    replaced, aside = _replaced(args)
    if aside is not None:  # back in place unless the new one is whole; then removed
        os.rename(args.markdown, aside)
    files: list[str] | None = None
    try:
        status, files = _export(args)
    finally:
        if aside is not None and files is None:
            os.rename(aside, args.markdown)
    if files is None:
        return status
    written = {os.path.abspath(f) for f in files}
    for name in replaced:  # a split export's old files past the new last one
        if os.path.abspath(name) not in written:
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)
    if aside is not None:
        shutil.rmtree(aside)
    if replaced or aside is not None:
        log.info("replaced what was there: %s", " ".join(
            shlex.quote(f) for f in [*replaced, *([args.markdown] if aside else [])]))
    return status


def _export(args: argparse.Namespace) -> tuple[int, list[str] | None]:
    """The export: its exit status, and the files it wrote (None: it did not finish)."""
    stream: io.TextIOWrapper | None = None
    jsonl: str | io.TextIOWrapper | None = args.jsonl
    if args.jsonl == "-":
        sys.stdout.flush()
        stream = jsonl = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        with Progress(quiet=args.quiet, interval=args.progress_interval) as progress:
            stats = export(
                args.data,
                warc=args.warc,
                wacz=args.wacz,
                jsonl=jsonl,
                markdown=args.markdown,
                max_size=args.max_size,
                text=args.text,
                text_limit=args.text_limit,
                user_agent=args.user_agent or _crawl_user_agent(args.data),
                revisits=not args.no_revisits,
                skip_failures=args.skip_failures,
                strict=args.strict,
                progress=progress.phase("export"),
            )
    except BrokenPipeError:
        return stdout_gone(), None
    except OSError as exc:
        raise CrawlerError(write_error("cannot write the export", exc)) from exc
    except KeyboardInterrupt:
        print("crawler: export interrupted: the files it wrote were removed", file=sys.stderr)
        return INTERRUPTED, None
    finally:
        if stream is not None:
            try:
                stream.flush()
            except BrokenPipeError:
                pass
            stream.detach()  # sys.stdout keeps its buffer
    listing = "wrote " + " ".join(shlex.quote(f) for f in stats.files)  # paste-able names
    if stream is not None:  # stdout is the JSONL: the listing goes with the log
        if stats.files:
            log.info("%s", listing)
        return 0, stats.files
    try:
        print(listing, flush=True)
    except BrokenPipeError:
        return stdout_gone(), stats.files
    return 0, stats.files


COMMANDS = {"export": cmd_export}
