"""Benchmark full-text index libraries on a synthetic crawl (issue 30's second choice). Not a test.

Usage (from the repository root; SQLite FTS5 is the standard library's, tantivy needs
``pip install tantivy``)::

    python tools/bench_index.py --pages 1000000 --repeat 3 --workdir /tmp/bench-index
    python tools/bench_index.py --pages 200000 --libraries sqlite-fts5,tantivy --repeat 3

The corpus (``--pages``, deterministic by ``--seed``; written once to
``--workdir/corpus-<pages>-<seed>-v1.tsv`` and reused). A fixed vocabulary of
``--vocab`` pseudo-words (consonant-vowel syllables: the frequent words short, 4
letters, the rare ones 6, as in a natural language) is drawn from a Zipf law (s = 1:
the commonest word is ~7.6% of the words, about what "the" is in English). A page has a
body of lognormal length (median 250 words, sigma 0.9, 20 to 10,000: ~375 words, ~2.1
KB on average, the size of a page's main text), a title of 3-12 words, and a URL
``https://h<host>.example.com/<word>/<word>-<page>.html`` (hosts Zipf-distributed; the
page number makes one unique term a page, as real URLs do). The first pages of a
bigger corpus are a smaller one's pages.

Each library runs in fresh processes (``--worker``), ``--repeat`` times, libraries
alternating: a build (every page added, a commit every ``--batch`` pages: the crawler's
indexing pass would commit that way), then, in a new process, the queries. Measured:

- build: pages/s and CPU ms a page (the process's user + system, every thread), peak
  RSS (VmHWM), index size on disk against the corpus's raw text bytes (URL + title +
  body);
- queries: the fixed set below, each run ``--query-runs`` times after one warm-up run
  (the index in the page cache): top 10 by BM25 over title, body and URL weighted 5, 1
  and 2, their URLs and titles read back; p50 and p95 latency a query and over all. The
  number of matching pages of each query (counted apart, untimed) must be equal across
  libraries (the check that they answer the same question);
- crash (``--crash-trials``, on the first ``--crash-pages`` pages): a process adds pages
  and commits every ``--batch``; after two commits it is killed with SIGKILL at a
  different point of a commit or batch each trial. Then a new process reopens the
  index: is it intact (FTS5's integrity-check; tantivy opens and counts), how many pages
  does it hold against those committed before the kill, does a query run, and can a
  writer add and commit more.

Memory setting: ``--writer-mb`` (default 64): tantivy's writer heap
(``Index.writer(heap_size=...)``, at least 15 MB a thread); SQLite's page cache
(``PRAGMA cache_size``) with FTS5's pending-terms hash at its 1 MB default. The
queries: single words of the vocabulary's ranks 1, 10, 100, 1,000, 10,000 and 100,000,
three two-word ANDs, two phrases (ranks 1 and 2; ranks 50 and 200).

Libraries (``--libraries``): ``sqlite-fts5`` (the standard library's sqlite3 over the
system's SQLite; FTS5 with its content stored, so snippets and deletes work; WAL,
synchronous=NORMAL), ``sqlite-fts5-contentless`` (``content=''``: the index alone, for
its size; SQLite before 3.43 cannot delete from it), ``tantivy`` (tantivy-py: url and
title stored, body stored, lz4 doc store: snippets need it), ``tantivy-unstored`` (body
indexed, not stored). ``--tantivy-threads`` (default 1, like SQLite's one) sets the
indexing threads; merges run in tantivy's own threads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("sqlite-fts5", "sqlite-fts5-contentless", "tantivy", "tantivy-unstored")
DEFAULT_LIBRARIES = "sqlite-fts5,tantivy"
CORPUS_VERSION = 1
CHUNK = 10_000  # pages generated at a time (fixed: a corpus's prefix is a smaller corpus)
CONSONANTS, VOWELS = "bcdfghjklmnprstvwz", "aeiou"
SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 90
WEIGHTS = {"title": 5.0, "body": 1.0, "url": 2.0}
# The queries: single words by rank, ANDs, phrases (ranks are 1-based).
QUERY_RANKS: list[tuple[str, tuple[int, ...]]] = [
    ("word", (1,)), ("word", (10,)), ("word", (100,)), ("word", (1_000,)),
    ("word", (10_000,)), ("word", (100_000,)),
    ("and", (10, 1_000)), ("and", (100, 10_000)), ("and", (1_000, 1_001)),
    ("phrase", (1, 2)), ("phrase", (50, 200))]
WORKER_TIMEOUT = 4 * 3600.0
TANTIVY_MIN_HEAP = 15_000_000


# -- the corpus ----------------------------------------------------------------------------


def word(i: int) -> str:
    """The vocabulary's word of 0-based rank ``i``: ``i + 90`` in base 90, one syllable a
    digit (so ranks under 8,010 have two syllables, the rest three)."""
    n, out = i + len(SYLLABLES), []
    while n:
        n, d = divmod(n, len(SYLLABLES))
        out.append(SYLLABLES[d])
    return "".join(reversed(out))


def query_set(vocab: int) -> list[dict[str, Any]]:
    out = []
    for kind, ranks in QUERY_RANKS:
        if max(ranks) > vocab:
            continue
        words = [word(r - 1) for r in ranks]
        text = f'"{" ".join(words)}"' if kind == "phrase" else " ".join(words)
        out.append({"name": f"{kind} {'+'.join(map(str, ranks))}", "kind": kind,
                    "words": words, "text": text})
    return out


def generate(path: Path, pages: int, seed: int, vocab: int) -> dict[str, Any]:
    """Write the corpus as TSV lines ``id url title body``; returns its sizes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab + 1, dtype=np.float64)  # Zipf, s = 1
    cdf = np.cumsum(weights / weights.sum())
    words = np.array([word(i) for i in range(vocab)], dtype=object)
    hosts_cdf = np.cumsum(1.0 / np.arange(1, 20_001)) / np.sum(1.0 / np.arange(1, 20_001))
    text_bytes = body_words = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        for start in range(0, pages, CHUNK):
            n = min(CHUNK, pages - start)
            lengths = np.clip(rng.lognormal(np.log(250), 0.9, CHUNK), 20, 10_000).astype(int)
            titles = rng.integers(3, 13, CHUNK)
            hosts = np.searchsorted(hosts_cdf, rng.random(CHUNK))
            total = int(lengths.sum() + titles.sum() + 2 * CHUNK)
            drawn = words[np.minimum(np.searchsorted(cdf, rng.random(total)), vocab - 1)]
            drawn = drawn.tolist()
            pos = 0
            lines = []
            for k in range(n):
                i = start + k
                t, b = int(titles[k]), int(lengths[k])
                d1, d2 = drawn[pos], drawn[pos + 1]
                title = " ".join(drawn[pos + 2 : pos + 2 + t])
                body = " ".join(drawn[pos + 2 + t : pos + 2 + t + b])
                pos += 2 + t + b
                url = f"https://h{hosts[k]}.example.com/{d1}/{d2}-{i}.html"
                text_bytes += len(url) + len(title) + len(body)
                body_words += b
                lines.append(f"{i + 1}\t{url}\t{title}\t{body}\n")
            f.write("".join(lines))
    tmp.rename(path)
    return {"pages": pages, "text_bytes": text_bytes, "body_words": body_words,
            "file_bytes": path.stat().st_size}


def corpus(workdir: Path, pages: int, seed: int, vocab: int) -> tuple[Path, dict[str, Any]]:
    path = workdir / f"corpus-{pages}-{seed}-{vocab}-v{CORPUS_VERSION}.tsv"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        return path, dict(json.loads(meta_path.read_text()))
    bu.log(f"generating {pages:,} pages into {path} ...")
    t0 = time.monotonic()
    meta = generate(path, pages, seed, vocab)
    meta["generate_s"] = round(time.monotonic() - t0, 1)
    meta_path.write_text(json.dumps(meta))
    return path, meta


def read_corpus(path: Path, limit: int) -> Iterator[tuple[int, str, str, str]]:
    with open(path, encoding="ascii") as f:
        for n, line in enumerate(f):
            if n >= limit:
                return
            i, url, title, body = line.rstrip("\n").split("\t")
            yield int(i), url, title, body


# -- the libraries (each in a worker process) ----------------------------------------------


class Fts5:
    """SQLite FTS5 (stdlib sqlite3): title, body, url columns; rowid is the page id."""

    def __init__(self, path: Path, *, contentless: bool, writer_mb: int) -> None:
        self.db = sqlite3.connect(path / "index.sqlite", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(f"PRAGMA cache_size=-{writer_mb * 1024}")
        content = ", content=''" if contentless else ""
        self.db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS pages USING fts5(title, body, url,"
                        f" tokenize='unicode61 remove_diacritics 2'{content})")
        w = WEIGHTS
        self.db.execute("INSERT INTO pages(pages, rank) VALUES('rank', ?)",
                        (f"bm25({w['title']}, {w['body']}, {w['url']})",))
        self.contentless = contentless

    def add_batch(self, batch: list[tuple[int, str, str, str]]) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO pages(rowid, url, title, body) VALUES (?,?,?,?)", batch)

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def finish(self) -> None:
        pass

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM pages").fetchone()[0])

    def integrity(self) -> str:
        self.db.execute("INSERT INTO pages(pages) VALUES('integrity-check')")
        return str(self.db.execute("PRAGMA quick_check").fetchone()[0])

    def search(self, q: str) -> list[tuple[str, str]]:
        if self.contentless:  # no columns to read back: the ids are what it has
            rows = self.db.execute("SELECT rowid FROM pages WHERE pages MATCH ? ORDER BY rank"
                                   " LIMIT 10", (q,)).fetchall()
            return [(str(r[0]), "") for r in rows]
        return self.db.execute("SELECT url, title FROM pages WHERE pages MATCH ? ORDER BY rank"
                               " LIMIT 10", (q,)).fetchall()

    def hits(self, q: str) -> int:
        return int(self.db.execute("SELECT count(*) FROM pages WHERE pages MATCH ?",
                                   (q,)).fetchone()[0])

    def close(self) -> None:
        self.db.close()


class Tantivy:
    """tantivy-py: id (u64, indexed), url and title stored, body stored or not."""

    def __init__(self, path: Path, *, stored: bool, writer_mb: int, threads: int,
                 write: bool) -> None:
        import tantivy

        self.t = tantivy
        sb = tantivy.SchemaBuilder()
        sb.add_unsigned_field("id", stored=True, indexed=True)
        sb.add_text_field("url", stored=True)
        sb.add_text_field("title", stored=True)
        sb.add_text_field("body", stored=stored)
        self.schema = sb.build()
        self.index = tantivy.Index(self.schema, path=str(path))
        self.writer = (self.index.writer(heap_size=max(writer_mb * 1_000_000,
                                                       TANTIVY_MIN_HEAP * threads),
                                         num_threads=threads) if write else None)
        self.searcher: Any = None

    def add_batch(self, batch: list[tuple[int, str, str, str]]) -> None:
        assert self.writer is not None
        doc = self.t.Document
        for i, url, title, body in batch:
            d = doc(url=url, title=title, body=body)
            d.add_unsigned("id", i)
            self.writer.add_document(d)

    def commit(self) -> None:
        assert self.writer is not None
        self.writer.commit()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.wait_merging_threads()  # the writer is spent after this
            self.writer = None

    def _searcher(self) -> Any:
        if self.searcher is None:
            self.index.reload()
            self.searcher = self.index.searcher()
        return self.searcher

    def count(self) -> int:
        return int(self._searcher().num_docs)

    def integrity(self) -> str:
        s = self._searcher()
        n = s.search(self.t.Query.all_query(), 1, count=True).count
        return "ok" if n == s.num_docs else f"all_query counts {n}, num_docs {s.num_docs}"

    def _query(self, q: str) -> Any:
        return self.index.parse_query(q, ["title", "body", "url"],
                                      field_boosts={"title": WEIGHTS["title"],
                                                    "url": WEIGHTS["url"]},
                                      conjunction_by_default=True)

    def search(self, q: str) -> list[tuple[str, str]]:
        s = self._searcher()
        hits = s.search(self._query(q), 10, count=False).hits
        docs = [s.doc(addr) for _score, addr in hits]
        return [(d.get_first("url"), d.get_first("title")) for d in docs]

    def hits(self, q: str) -> int:
        return int(self._searcher().search(self._query(q), 1, count=True).count)

    def close(self) -> None:
        self.finish()
        self.searcher = None


def open_library(name: str, path: Path, args: argparse.Namespace, *, write: bool) -> Any:
    if name.startswith("sqlite-fts5"):
        return Fts5(path, contentless=name.endswith("contentless"), writer_mb=args.writer_mb)
    return Tantivy(path, stored=name == "tantivy", writer_mb=args.writer_mb,
                   threads=args.tantivy_threads, write=write)


def library_version(name: str) -> str | None:
    if name.startswith("sqlite"):
        return f"SQLite {sqlite3.sqlite_version}"
    return bu.package_version("tantivy")


def installed(name: str) -> bool:
    if name.startswith("sqlite"):
        try:
            sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(a)")
        except sqlite3.OperationalError:
            return False
        return True
    return bu.package_version("tantivy") is not None


# -- the worker's phases -------------------------------------------------------------------


def phase_build(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.index_dir)
    path.mkdir(parents=True, exist_ok=True)
    lib = open_library(args.worker, path, args, write=True)
    t0 = time.monotonic()
    commits: list[float] = []
    batch: list[tuple[int, str, str, str]] = []
    n = 0
    for page in read_corpus(Path(args.corpus), args.pages):
        batch.append(page)
        if len(batch) >= args.batch:
            n += _commit(lib, batch, commits)
            if n % 100_000 < args.batch:
                bu.log(f"{args.worker}: {n:,} pages {n / (time.monotonic() - t0):,.0f}/s")
    if batch:
        n += _commit(lib, batch, commits)
    lib.finish()
    wall = time.monotonic() - t0
    count = lib.count()
    lib.close()
    return {"pages": n, "count": count, "wall_s": wall, "pages_per_s": n / wall,
            "commit_s_median": bu.median(commits) if commits else None,
            "peak_rss_bytes": bu.peak_rss_bytes(), "disk_bytes": bu.disk_usage(path)[0],
            "files": sum(len(f) for _r, _d, f in os.walk(path))}


def _commit(lib: Any, batch: list[tuple[int, str, str, str]], commits: list[float]) -> int:
    lib.add_batch(batch)
    t = time.monotonic()
    lib.commit()
    commits.append(time.monotonic() - t)
    n = len(batch)
    batch.clear()
    return n


def phase_query(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    lib = open_library(args.worker, Path(args.index_dir), args, write=False)
    lib.count()
    open_s = time.monotonic() - t0
    out = []
    for q in query_set(args.vocab):
        hits = lib.hits(q["text"])
        first = lib.search(q["text"])  # the warm-up run
        times = []
        for _ in range(args.query_runs):
            t = time.perf_counter()
            lib.search(q["text"])
            times.append(time.perf_counter() - t)
        out.append({"name": q["name"], "text": q["text"], "hits": hits,
                    "returned": len(first), "ms": [round(1e3 * x, 4) for x in times]})
    lib.close()
    return {"open_s": open_s, "queries": out, "peak_rss_bytes": bu.peak_rss_bytes()}


def phase_crashbuild(args: argparse.Namespace) -> dict[str, Any]:
    """Add pages and commit every --batch, saying so on stdout, until killed (or done)."""
    path = Path(args.index_dir)
    path.mkdir(parents=True, exist_ok=True)
    lib = open_library(args.worker, path, args, write=True)
    batch: list[tuple[int, str, str, str]] = []
    n = 0
    for page in read_corpus(Path(args.corpus), args.pages):
        batch.append(page)
        if len(batch) >= args.batch:
            n += len(batch)
            lib.add_batch(batch)
            _say(f"begin {n}")
            lib.commit()
            _say(f"done {n}")
            batch.clear()
    lib.close()
    return {"pages": n}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def phase_verify(args: argparse.Namespace) -> dict[str, Any]:
    """Reopen a killed index: intact? how many pages? a query? a writer that can go on?"""
    path = Path(args.index_dir)
    out: dict[str, Any] = {}
    try:
        lib = open_library(args.worker, path, args, write=False)
        out["count"] = lib.count()
        out["integrity"] = lib.integrity()
        out["query_results"] = len(lib.search(query_set(args.vocab)[2]["text"]))
        lib.close()
    except Exception as exc:  # what a damaged index does on open is the result
        out["open_error"] = repr(exc)[:300]
        return out
    try:
        lib = open_library(args.worker, path, args, write=True)
        extra = [(10_000_000 + i, f"https://crash.example/{i}", "after the crash", "again")
                 for i in range(10)]
        lib.add_batch(extra)
        lib.commit()
        lib.finish()
        out["count_after_more"] = lib.count()
        lib.close()
    except Exception as exc:
        out["write_error"] = repr(exc)[:300]
    return out


def worker(args: argparse.Namespace) -> int:
    phases: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "build": phase_build, "query": phase_query, "crashbuild": phase_crashbuild,
        "verify": phase_verify}
    result = phases[args.phase](args)
    result["library"] = args.worker
    result["version"] = library_version(args.worker)
    bu.emit(result)
    return 0


# -- the driver ----------------------------------------------------------------------------


def _worker_cmd(args: argparse.Namespace, lib: str, phase: str, index_dir: Path, corpus_path: Path,
                pages: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", lib, "--phase", phase,
            "--index-dir", str(index_dir), "--corpus", str(corpus_path), "--pages", str(pages),
            "--batch", str(args.batch), "--writer-mb", str(args.writer_mb),
            "--tantivy-threads", str(args.tantivy_threads), "--vocab", str(args.vocab),
            "--query-runs", str(args.query_runs)]


def run_phase(args: argparse.Namespace, lib: str, phase: str, index_dir: Path,
              corpus_path: Path, pages: int) -> dict[str, Any]:
    out = index_dir.parent / f"{index_dir.name}.{phase}.out"
    err = index_dir.parent / f"{index_dir.name}.{phase}.err"
    m = bu.run_measured(_worker_cmd(args, lib, phase, index_dir, corpus_path, pages), cwd=REPO,
                        env=bu.child_env(), timeout=WORKER_TIMEOUT, stdout_path=out,
                        stderr_path=err)
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    if m["returncode"] != 0 or not lines:
        tail = err.read_text(errors="replace").strip().splitlines()
        raise bu.WorkerError(f"{lib} {phase}: exit {m['returncode']}: {tail[-1:]}")
    r: dict[str, Any] = json.loads(lines[-1])
    r["measured"] = {k: m[k] for k in ("wall_s", "cpu_s", "peak_rss_bytes",
                                       "rss_anon_at_peak_bytes", "rss_file_at_peak_bytes")}
    return r


def crash_trial(args: argparse.Namespace, lib: str, work: Path, corpus_path: Path,
                trial: int) -> dict[str, Any]:
    """Kill a committing writer with SIGKILL: trial t waits for the 3rd commit's "begin",
    then sleeps a fraction of the last commit's time (0, 1/3, 2/3) or, every 4th trial, half
    the time between commits (mid-batch: pages added, no commit running)."""
    index_dir = work / f"crash-{lib}-{trial}"
    shutil.rmtree(index_dir, ignore_errors=True)
    cmd = _worker_cmd(args, lib, "crashbuild", index_dir, corpus_path,
                      min(args.crash_pages, args.pages))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO, env=bu.child_env())
    assert proc.stdout is not None
    begins: dict[int, float] = {}
    dones: dict[int, float] = {}
    committed = 0
    mode = "mid-batch" if trial % 4 == 3 else f"commit+{trial % 4}/3"
    in_flight = False
    try:
        for line in proc.stdout:
            what, n = line.split()
            now = time.monotonic()
            (begins if what == "begin" else dones)[int(n)] = now
            if what == "done":
                committed = int(n)
            if len(dones) < 2:
                continue
            last = max(dones)
            commit_s = dones[last] - begins[last]
            if mode == "mid-batch" and what == "done":
                between = begins[last] - dones[min(dones)] if len(dones) > 1 else commit_s
                time.sleep(between / 2)
                break
            if mode != "mid-batch" and what == "begin":
                time.sleep(commit_s * (trial % 4) / 3)
                in_flight = True
                break
    finally:
        killed = proc.poll() is None  # False: it ended before the kill (too few batches)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # A "done" the kill raced past is read now (the pipe keeps what was written).
    rest = proc.stdout.read().split()
    for what, n in zip(rest[::2], rest[1::2], strict=False):
        if what == "done":
            committed = max(committed, int(n))
    attempted = committed + args.batch if in_flight or mode == "mid-batch" else committed
    v = run_phase(args, lib, "verify", index_dir, corpus_path, 0)
    count = v.get("count")
    shutil.rmtree(index_dir, ignore_errors=True)
    return {"trial": trial, "mode": mode, "killed": killed, "committed_before_kill": committed,
            "attempted": attempted, "count_after": count,
            "intact": "open_error" not in v and v.get("integrity") == "ok",
            "at_a_commit": count in (committed, committed + args.batch),
            "lost_pages": None if count is None else attempted - count,
            "query_ok": v.get("query_results", 0) > 0,
            "writable_after": count is not None and v.get("count_after_more") == count + 10,
            "verify": v}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--pages", type=int, default=1_000_000)
    p.add_argument("--libraries", default=DEFAULT_LIBRARIES, help=f"of {','.join(LIBRARIES)}")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch", type=int, default=10_000, help="pages a commit")
    p.add_argument("--writer-mb", type=int, default=64)
    p.add_argument("--tantivy-threads", type=int, default=1)
    p.add_argument("--query-runs", type=int, default=20)
    p.add_argument("--crash-trials", type=int, default=4)
    p.add_argument("--crash-pages", type=int, default=50_000)
    p.add_argument("--vocab", type=int, default=300_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep-index", action="store_true", help="keep the last build's index")
    p.add_argument("--workdir", type=Path, help="corpus and indexes (default: a temp dir)")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/index-<ts>.json)")
    p.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    p.add_argument("--phase", choices=("build", "query", "crashbuild", "verify"),
                   help=argparse.SUPPRESS)
    p.add_argument("--index-dir", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    names = [n for n in args.libraries.split(",") if n]
    unknown = sorted(set(names) - set(LIBRARIES))
    if unknown:
        raise SystemExit(f"bench_index: unknown libraries {unknown}; known: {LIBRARIES}")
    skipped = {n: "not installed (pip install tantivy)" if n.startswith("tantivy")
               else "this Python's SQLite has no FTS5" for n in names if not installed(n)}
    for n, why in skipped.items():
        bu.log(f"skipped {n}: {why}")
    names = [n for n in names if n not in skipped]
    temp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-index-")) if temp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    revision = bu.git_revision(REPO)
    try:
        corpus_path, meta = corpus(work, args.pages, args.seed, args.vocab)
        bu.log(f"corpus: {meta}")
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rep in range(args.repeat):
            for name in names if rep % 2 == 0 else list(reversed(names)):
                index_dir = work / f"index-{name}"
                shutil.rmtree(index_dir, ignore_errors=True)
                b = run_phase(args, name, "build", index_dir, corpus_path, args.pages)
                q = run_phase(args, name, "query", index_dir, corpus_path, args.pages)
                runs[name].append({"build": b, "query": q})
                bu.log(f"run {rep + 1} {name}: {b['pages_per_s']:,.0f} pages/s, "
                       f"{b['disk_bytes'] / meta['text_bytes']:.2f}x the text, "
                       f"p95 {_pct(_all_ms(q), 95):.2f} ms")
                if not (args.keep_index and rep == args.repeat - 1):
                    shutil.rmtree(index_dir, ignore_errors=True)
        crashes = {n: [crash_trial(args, n, work, corpus_path, t)
                       for t in range(args.crash_trials)] for n in names}
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    summary = [_summarize(n, runs[n], crashes[n], meta, args) for n in names]
    agree = _hits_agree(summary)
    _print_tables(summary, agree)
    out_path = args.out or REPO / "bench-results" / f"index-{bu.timestamp()}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "machine": bu.machine_info(("numpy", "tantivy")), "sqlite": sqlite3.sqlite_version,
        "loadavg": bu.loadavg(), "revision": revision,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "corpus": meta, "skipped": skipped, "hits_agree": agree, "runs": runs,
        "crash": crashes, "summary": summary}, indent=1, default=str))
    bu.log(f"wrote {out_path}")
    return 0


def _all_ms(q: dict[str, Any]) -> list[float]:
    return [x for query in q["queries"] for x in query["ms"]]


def _pct(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(pct / 100 * len(s) + 0.5) - 1))]


def _summarize(name: str, runs: list[dict[str, Any]], crashes: list[dict[str, Any]],
               meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    builds = [r["build"] for r in runs]
    queries = [r["query"] for r in runs]
    per_query = []
    for k, q in enumerate(queries[0]["queries"] if queries else []):
        ms = [x for run in queries for x in run["queries"][k]["ms"]]
        per_query.append({"name": q["name"], "text": q["text"], "hits": q["hits"],
                          "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95)})
    return {
        "library": name, "version": builds[0]["version"] if builds else None,
        "runs": len(runs), "pages": args.pages,
        "build_pages_per_s": bu.median([b["pages_per_s"] for b in builds]),
        "build_cpu_ms_per_page": bu.median([1e3 * b["measured"]["cpu_s"] / b["pages"]
                                            for b in builds]),
        "build_peak_rss_bytes": bu.median([b["measured"]["peak_rss_bytes"] for b in builds]),
        "commit_s_median": bu.median([b["commit_s_median"] for b in builds]),
        "disk_bytes": bu.median([b["disk_bytes"] for b in builds]),
        "size_vs_text": bu.median([b["disk_bytes"] for b in builds]) / meta["text_bytes"],
        "count_ok": all(b["count"] == args.pages for b in builds),
        "query_open_s": bu.median([q["open_s"] for q in queries]),
        "query_peak_rss_bytes": bu.median([q["measured"]["peak_rss_bytes"] for q in queries]),
        # Percentiles over every timed run of every repeat (the repeats pooled).
        "query_p50_ms": _pct([x for q in queries for x in _all_ms(q)], 50),
        "query_p95_ms": _pct([x for q in queries for x in _all_ms(q)], 95),
        "queries": per_query,
        "crash": {"trials": len(crashes), "killed": sum(c["killed"] for c in crashes),
                  "intact": sum(c["intact"] for c in crashes),
                  "at_a_commit": sum(c["at_a_commit"] for c in crashes),
                  "query_ok": sum(c["query_ok"] for c in crashes),
                  "writable_after": sum(c["writable_after"] for c in crashes),
                  "lost_pages_max": max((c["lost_pages"] or 0 for c in crashes), default=0)},
        "writer_memory_setting": ("Index.writer(heap_size)" if name.startswith("tantivy")
                                  else "PRAGMA cache_size (+ FTS5 'hashsize', 1 MB)"),
        "bm25_field_weights": ("parse_query(field_boosts=...)" if name.startswith("tantivy")
                               else "bm25(title, body, url weights) as the rank function"),
    }


def _hits_agree(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every library counted the same matching pages for each query."""
    by_query: dict[str, dict[str, int]] = {}
    for s in summary:
        for q in s["queries"]:
            by_query.setdefault(q["name"], {})[s["library"]] = q["hits"]
    return {"all": all(len(set(v.values())) == 1 for v in by_query.values()),
            "by_query": by_query}


def _print_tables(summary: list[dict[str, Any]], agree: dict[str, Any]) -> None:
    base = summary[0] if summary else None
    rows = []
    for s in summary:
        ratio = f"{s['build_pages_per_s'] / base['build_pages_per_s']:.2f}" if base else "-"
        c = s["crash"]
        rows.append([s["library"], str(s["version"]), f"{s['build_pages_per_s']:,.0f} ({ratio})",
                     f"{s['build_cpu_ms_per_page']:.3f}", bu.fmt_bytes(s["build_peak_rss_bytes"]),
                     f"{bu.fmt_bytes(s['disk_bytes'])} ({s['size_vs_text']:.2f}x)",
                     f"{s['query_p50_ms']:.2f} / {s['query_p95_ms']:.2f}",
                     bu.fmt_bytes(s["query_peak_rss_bytes"]),
                     f"{c['intact']}/{c['trials']} intact, {c['writable_after']} writable, "
                     f"lost <= {c['lost_pages_max']}"])
    print(bu.markdown_table(["library", "version", "build pages/s (ratio)", "CPU ms/page",
                             "build peak RSS", "index size (vs text)", "query p50 / p95 ms",
                             "query RSS", "kill -9"], rows))
    print()
    names = [s["library"] for s in summary]
    qrows = []
    for k, q in enumerate(summary[0]["queries"] if summary else []):
        row = [q["name"], str(q["hits"])]
        for s in summary:
            sq = s["queries"][k]
            row.append(f"{sq['p50_ms']:.2f} / {sq['p95_ms']:.2f}")
        qrows.append(row)
    print(bu.markdown_table(["query", "matching pages"] + [f"{n} p50 / p95 ms" for n in names],
                            qrows))
    print(f"\nmatching-page counts agree across libraries: {agree['all']}")


if __name__ == "__main__":
    raise SystemExit(main())
