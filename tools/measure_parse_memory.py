"""Measure what link extraction (crawler.web.links.extract) costs in memory. Not a test.

    python tools/measure_parse_memory.py                 # 20 MiB bodies, every case
    python tools/measure_parse_memory.py --size 5M --case nul --case html

Each case runs in a fresh interpreter: it builds the body, resets the process's
peak RSS (``/proc/self/clear_refs``), notes the RSS, runs ``extract`` once and
reads the peak (VmHWM) again. "extra" is that peak minus the RSS before: every
copy the extraction makes (decoded text, NUL replacement, UTF-8, the parser's
own buffers, the links), whether Python or libxml2 allocated it. "x body" is
extra / body size: the multiple the crawl's memory budget must allow for a
parse on top of the body itself. Linux only (/proc). Prints a table, and JSON
with --json. The worker sets malloc up as a crawl does (a fixed mmap threshold,
crawler.run.budget) unless --glibc-default. To measure another checkout (the
commit before a change), put its tree first: ``git archive HEAD crawler | tar x
-C /tmp/old && PYTHONPATH=/tmp/old python tools/measure_parse_memory.py``.

Cases: ``nul`` (NUL bytes), ``ff`` (0xff bytes: each one an invalid UTF-8
byte, decoded as U+FFFD), ``spaces`` (what a gzip bomb decodes to), ``html``
(a real-ish page: text, tables, scripts, non-ASCII words and ~1 link per 200
bytes, up to the size), ``dense`` (``<br>`` tags only: the most elements a byte
can buy), ``nested`` (``<div>`` only, never closed: libxml2 keeps a stack entry
per open element), ``page`` (one 40 KiB real-ish page: a usual case).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from random import Random
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: after PYTHONPATH, which may name another
    sys.path.append(str(REPO))  # checkout's crawler to compare with (git archive ... | tar x)

from tools._benchutil import fmt_bytes, markdown_table, run_worker  # noqa: E402

CASES = ("nul", "ff", "spaces", "html", "dense", "nested", "page")
DEFAULT_SIZE = 20 << 20
PAGE_SIZE = 40 << 10  # the "page" case: a usual page, whatever --size says

_WORDS = ("crawler", "page", "link", "store", "memory", "bounded", "café", "naïve", "Привет",
          "日本語", "hostile", "budget", "parse", "text", "body", "host", "index", "table")


def realish_html(size: int, seed: int = 0) -> bytes:
    """A deterministic page of ``size`` bytes that looks like the web: a head, then blocks
    of paragraphs with inline links, tables, lists and scripts, some non-ASCII words."""
    rng = Random(seed)
    head = (b"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>real-ish</title>\n"
            b"<style>p{margin:0}</style></head><body>\n")
    blocks: list[bytes] = []
    total = len(head)
    n = 0
    while total < size:
        n += 1
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 60)))
        href = rng.choice((f"/s{n % 7}/p{n}.html", f"p{n}.html", f"../a/{n}?q={n % 13}",
                           f"https://other{n % 50}.example/x/{n}", f"#frag{n}"))
        kind = n % 5
        if kind == 0:
            block = (f"<table><tr><td>{words}</td><td><a href=\"{href}\">cell</a></td></tr>"
                     "</table>\n")
        elif kind == 1:
            block = f"<ul><li><a href='{href}'>{words[:40]}</a></li><li>{words[40:]}</li></ul>\n"
        elif kind == 2:
            block = f"<script>var x{n} = \"{words[:30]}\"; if (x{n} < 3) {{}}</script>\n"
        else:
            block = f"<p>{words} <a href=\"{href}\" rel=\"nofollow\">more</a> &amp; {n}</p>\n"
        data = block.encode("utf-8")
        blocks.append(data)
        total += len(data)
    return (head + b"".join(blocks))[:size]


def body_of(case: str, size: int) -> tuple[bytes, str]:
    """(body, Content-Type) of a case."""
    if case == "nul":
        return bytes(size), "text/html"
    if case == "ff":
        return b"\xff" * size, "text/html"
    if case == "spaces":
        return b" " * size, "text/html"
    if case == "html":
        return realish_html(size), "text/html; charset=utf-8"
    if case == "dense":
        return (b"<br>" * (size // 4 + 1))[:size], "text/html"
    if case == "nested":
        return (b"<div>" * (size // 5 + 1))[:size], "text/html"
    if case == "page":
        return realish_html(PAGE_SIZE), "text/html; charset=utf-8"
    raise ValueError(case)


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(case: str, size: int, crawler_malloc: bool = True) -> dict[str, Any]:
    """One case in this (fresh) process: the extraction's peak memory over the body."""
    import ctypes
    import gc

    from crawler.web import links

    if crawler_malloc:
        try:
            from crawler.run import budget
        except ImportError:  # a checkout from before the memory budget: glibc's default
            pass
        else:
            budget.return_large_blocks()  # as a crawl sets it up (crawler.run.engine)
    body, ctype = body_of(case, size)
    links.extract(b"<a href=/warm>w</a>", "http://warm.test/", content_type="text/html")
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed pages back to the OS: reuse shows in RSS
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # VmHWM := VmRSS now
    before = _status_kib("VmRSS")
    cpu0 = time.process_time()
    page = links.extract(body, "http://measure.test/dir/page.html", content_type=ctype)
    cpu = time.process_time() - cpu0
    peak = _status_kib("VmHWM")
    extra = peak - before
    return {"case": case, "body_bytes": len(body), "extra_bytes": extra,
            "multiple": round(extra / len(body), 2), "cpu_s": round(cpu, 3),
            "links": len(page.links), "charset": page.charset}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=parse_size, default=DEFAULT_SIZE,
                   help="body size (20M by default; 'page' is always 40 KiB)")
    p.add_argument("--case", action="append", choices=CASES, help="repeatable; default all")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--glibc-default", action="store_true",
                   help="leave malloc as glibc sets it up (a crawl fixes its mmap "
                   "threshold: crawler.run.budget.return_large_blocks)")
    p.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.size, not args.glibc_default)))
        return 0
    extra = ["--glibc-default"] if args.glibc_default else []
    results = [run_worker([__file__, "--worker", case, "--size", str(args.size), *extra],
                          cwd=str(REPO), timeout=600)
               for case in (args.case or CASES)]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    rows = [(r["case"], fmt_bytes(r["body_bytes"]), fmt_bytes(r["extra_bytes"]),
             f'{r["multiple"]:.2f}', f'{r["cpu_s"]:.2f}', str(r["links"])) for r in results]
    print(markdown_table(("case", "body", "extra peak", "x body", "cpu s", "links"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
