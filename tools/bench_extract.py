"""Benchmark main-content extraction libraries on real HTML (issue 30's first choice). Not a test.

Usage (from the repository root; the extractors measured are whichever are installed:
resiliparse is the crawler's own, trafilatura and readability-lxml come with the bench
extra, ``python -m pip install --upgrade pip && pip install -e '.[bench]'``)::

    python tools/bench_extract.py --fetch-debian-docs --workdir /tmp/extract-docs --repeat 3
    python tools/bench_extract.py --html-dir /usr/share/doc/python3.11/html --repeat 3
    git clone https://github.com/scrapinghub/article-extraction-benchmark /tmp/aeb
    python tools/bench_extract.py --articles /tmp/aeb --fetch-debian-docs \
        --debian-packages python3.11-doc,postgresql-doc-15 --workdir /tmp/extract-docs \
        --extractors ours,resiliparse,trafilatura --repeat 3

``--fetch-debian-docs`` downloads Debian documentation packages with ``apt-get download``
(``--debian-packages``; default python3.11-doc, postgresql-doc-15, debian-reference-en:
HTML made by Sphinx and by the DocBook XSL stylesheets, written by nobody here) and
unpacks each with ``dpkg-deb -x`` into ``--workdir`` (kept there: a second run reuses it).
``--html-dir DIR`` (repeatable) takes any directory of ``*.html``/``*.htm`` instead.
``--articles DIR`` adds pages of the open web with a human's reference: a checkout of
Scrapinghub's article-extraction benchmark (181 news and blog pages, ``html/*.html.gz``,
and ``ground-truth.json`` with each page's ``articleBody``, the reference).

``ours`` is the search index's reading of a page (crawler.read.pagetext.read_html: the
text it indexes, its main content by crawler.read.mainblocks' rule); ``resiliparse`` is
resiliparse's own main-content rule, which the index used before.

Each extractor runs in a fresh process of its own (``--worker``) over the same files, in
the same order, ``--repeat`` times, extractors alternating. A file is read before its
clock starts; what is timed is bytes in, plain text out. Reported per extractor: pages/s
(one thread: the sum of per-page wall times), CPU ms per page (``time.process_time``
around each page: every thread of the process), peak RSS of the worker (VmHWM, polled
by ``run_measured``; the interpreter and the library included), and quality. Medians of
the repeats; quality is computed once, from the first run (it is the same every run:
each run's output is hashed to check).

Quality proxy. Documentation generators mark their main content, so the reference is
known without a human: Sphinx's ``<div role="main">`` (``div.body``); for DocBook XSL
(PostgreSQL, debian-reference) the ``<body>`` without its ``div.navheader`` and
``div.navfooter``. Page text is the visible text (no script, style, noscript, template),
blocks separated, in lowercase ``\\w+`` tokens; an extractor's text gets the same
tokenizer. Per page: token-multiset precision, recall and F1 against the reference (the
measure of the article-extraction benchmarks, e.g. ScrapingHub's and Bevendorff et al.,
"An Empirical Comparison of Web Content Extraction Algorithms", SIGIR 2023), and the
boilerplate leak: of the tokens that only the navigation/sidebar/footer regions hold
(their multiset minus the reference's), the share the extractor output anyway (beyond
the reference's own count). Pages of no known generator count for speed only. A
reference is the page author's idea of its body: it keeps tables of contents, indexes and
code. Every extractor drops link lists by design (link density), so F1 is also given over
the content pages alone: those whose reference has at most half its words in links
(``LINK_LIST_SHARE``); the leak figure is the boilerplate measure.

``visible`` is the baseline every extractor should beat on precision: crawler.web.pagemeta's
visible text (what export and the index would read without an extractor).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

REPO = Path(__file__).resolve().parents[1]
EXTRACTORS = ("visible", "ours", "trafilatura", "trafilatura-fast", "resiliparse",
              "readability")
# The distribution each extractor needs (None: ours, always there).
DISTRIBUTIONS: dict[str, str | None] = {
    "visible": None, "ours": None, "trafilatura": "trafilatura", "trafilatura-fast": "trafilatura",
    "resiliparse": "resiliparse", "readability": "readability-lxml"}
DEBIAN_PACKAGES = "python3.11-doc,postgresql-doc-15,debian-reference-en"
WORKER_TIMEOUT = 3600.0
LINK_LIST_SHARE = 0.5  # a page with more of its reference's words in links is a link list
_TOKEN = re.compile(r"\w+")


# -- the extractors (each runs in a worker process of its own) ------------------------------


def _block_text(root: Any, skip: Iterable[Any] = ()) -> str:
    """The visible text under an lxml element, a space at every block boundary (so
    ``<td>a</td><td>b</td>`` is two words, ``<b>a</b>b`` one), without ``skip``'s subtrees."""
    from crawler.web.pagemeta import BLOCKS, INVISIBLE

    skipped = set(skip)
    out: list[str] = []

    def walk(el: Any) -> None:
        tag = el.tag if isinstance(el.tag, str) else None
        if tag is not None and el not in skipped and tag.lower() not in INVISIBLE:
            block = tag.lower() in BLOCKS
            if block:
                out.append(" ")
            if el.text:
                out.append(el.text)
            for child in el:
                walk(child)
                if child.tail:
                    out.append(child.tail)
            if block:
                out.append(" ")

    walk(root)
    return " ".join("".join(out).split())


def make_extractor(name: str) -> Callable[[bytes], str]:
    """``name``'s function: the page's bytes in, its main text out."""
    if name == "visible":
        from crawler.web.pagemeta import read_html

        return lambda data: read_html(data, text_limit=1 << 30).text
    if name == "ours":
        from resiliparse.parse.encoding import detect_encoding

        from crawler.read import pagetext

        def index_text(data: bytes) -> str:  # (decoded as resiliparse guesses, as below)
            html = data.decode(detect_encoding(data) or "utf-8", "replace")
            return pagetext.read_html(html, "http://bench.invalid/").text

        return index_text
    if name in ("trafilatura", "trafilatura-fast"):
        import trafilatura

        fast = name == "trafilatura-fast"  # no readability/jusText fallback pass
        return lambda data: trafilatura.extract(data, fast=fast) or ""
    if name == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.encoding import detect_encoding
        from resiliparse.parse.html import HTMLTree

        def resiliparse_text(data: bytes) -> str:
            tree = HTMLTree.parse_from_bytes(data, detect_encoding(data) or "utf-8")
            return str(extract_plain_text(tree, main_content=True))

        return resiliparse_text
    if name == "readability":
        import lxml.html
        from readability import Document

        def readability_text(data: bytes) -> str:  # it returns HTML: its text, blocks apart
            summary = Document(data).summary(html_partial=True)
            return _block_text(lxml.html.fromstring(summary)) if summary.strip() else ""

        return readability_text
    raise ValueError(f"unknown extractor {name!r}")


def worker(args: argparse.Namespace) -> int:
    """Extract every file of ``--files`` with ``--worker``; texts to ``--texts-out``."""
    t0 = time.perf_counter()
    extract = make_extractor(args.worker)
    import_s = time.perf_counter() - t0
    files = Path(args.files).read_text(encoding="utf-8").splitlines()
    wall = cpu = 0.0
    failures: list[str] = []
    digest = hashlib.sha1()
    html_bytes = text_bytes = 0
    with open(args.texts_out, "w", encoding="utf-8") as out:
        for path in files:
            data = Path(path).read_bytes()
            if path.endswith(".gz"):
                data = gzip.decompress(data)
            html_bytes += len(data)
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                text = extract(data)
            except Exception as exc:  # a library's failure on a page is a result, not a crash
                text = ""
                failures.append(f"{path}: {exc!r}"[:300])
            wall += time.perf_counter() - w0
            cpu += time.process_time() - c0
            encoded = text.encode("utf-8", "surrogatepass")
            text_bytes += len(encoded)
            digest.update(encoded + b"\0")
            out.write(json.dumps(text) + "\n")
    bu.emit({"extractor": args.worker, "pages": len(files), "html_bytes": html_bytes,
             "text_bytes": text_bytes,
             "wall_s": wall, "cpu_s": cpu, "import_s": import_s, "failures": len(failures),
             "first_failures": failures[:3], "texts_sha1": digest.hexdigest(),
             "version": _version(args.worker)})
    return 0


def _version(name: str) -> str | None:
    dist = DISTRIBUTIONS[name]
    return "ours" if dist is None else bu.package_version(dist)


def installed(name: str) -> bool:
    dist = DISTRIBUTIONS[name]
    return dist is None or bu.package_version(dist) is not None


# -- the reference: what the generator marked as the page's body ----------------------------


def tokens(text: str) -> Counter[str]:
    return Counter(_TOKEN.findall(text.lower()))


Reference = tuple[str, Counter[str], Counter[str], float]


def reference(data: bytes) -> Reference | None:
    """(generator, reference tokens, boilerplate-only tokens, the share of the reference's
    tokens in links) of a page, or None when its generator is not one whose markup says
    where the main content is."""
    import lxml.html
    from lxml import etree

    try:
        doc = lxml.html.document_fromstring(data)
    except (etree.ParserError, ValueError):
        return None
    body = doc.find("body")
    if body is None:
        return None
    main = body.xpath(".//div[@role='main']")
    if main:  # Sphinx
        generator, region = "sphinx", main[0]
        ref = _block_text(region)
        boiler = _block_text(body, skip=[region])
    else:
        nav = body.xpath(".//div[@class='navheader' or @class='navfooter']")
        if not nav:
            return None
        generator, region = "docbook", body
        ref = _block_text(body, skip=nav)
        boiler = " ".join(_block_text(n) for n in nav)
    ref_tokens = tokens(ref)
    navs = {id(n) for n in nav} if generator == "docbook" else set()
    linked = sum(len(_TOKEN.findall(_block_text(a))) for a in region.iter("a")
                 if not any(id(up) in navs for up in a.iterancestors()))
    share = linked / max(1, sum(ref_tokens.values()))
    return generator, ref_tokens, tokens(boiler) - ref_tokens, share


def score(out: Counter[str], ref: Counter[str], boiler: Counter[str]) -> dict[str, float]:
    """Token-multiset precision, recall, F1 of ``out`` against ``ref``, and the boilerplate
    tokens it leaked (beyond the reference's own count) against those there were."""
    common = sum((out & ref).values())
    n_out, n_ref = sum(out.values()), sum(ref.values())
    p = common / n_out if n_out else 0.0
    r = common / n_ref if n_ref else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    leaked = sum(((out - ref) & boiler).values())
    return {"p": p, "r": r, "f1": f1, "leaked": leaked, "boiler": sum(boiler.values())}


# -- the corpus ----------------------------------------------------------------------------


def article_pages(root: Path) -> list[tuple[Path, Reference]]:
    """The pages of a checkout of Scrapinghub's article-extraction benchmark, each with its
    reference: the human-written ``articleBody`` (no boilerplate figure: the pages' other
    regions are not marked)."""
    truth = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    out: list[tuple[Path, Reference]] = []
    for name, item in sorted(truth.items()):
        page = root / "html" / f"{name}.html.gz"
        if page.is_file():
            out.append((page, ("article", tokens(item["articleBody"]), Counter(), 0.0)))
    if not out:
        raise SystemExit(f"bench_extract: no pages of ground-truth.json under {root}/html")
    return out


def fetch_debian_docs(workdir: Path, packages: list[str]) -> list[tuple[str, Path]]:
    """``apt-get download`` each package into workdir/debs, ``dpkg-deb -x`` it into
    workdir/root/<package>; reused when already there. Returns (package, its root)."""
    debs, roots = workdir / "debs", workdir / "root"
    debs.mkdir(parents=True, exist_ok=True)
    out = []
    for pkg in packages:
        root = roots / pkg
        if not root.is_dir():
            have = sorted(debs.glob(f"{pkg}_*.deb"))
            if not have:
                bu.log(f"apt-get download {pkg}")
                subprocess.run(["apt-get", "download", pkg], cwd=debs, check=True)
                have = sorted(debs.glob(f"{pkg}_*.deb"))
            if not have:
                raise SystemExit(f"bench_extract: apt-get download {pkg} left no .deb")
            tmp = roots / f".{pkg}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(have[-1]), str(tmp)], check=True)
            tmp.rename(root)
        out.append((pkg, root))
    return out


def html_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".html", ".htm") and p.is_file())


def label_of(directory: Path) -> str:
    """A doc set's name: its directory's, skipping generic names (html, doc)."""
    for part in reversed(directory.resolve().parts):
        if part not in ("html", "htm", "doc", "docs", "share", "usr"):
            return part
    return str(directory)


def spread(items: list[Path], n: int) -> list[Path]:
    """``n`` items evenly spaced through ``items`` (deterministic), or all of them."""
    if n <= 0 or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


# -- the driver ----------------------------------------------------------------------------


def run_extractor(name: str, list_path: Path, texts: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".out", delete=False) as f:
        stdout = Path(f.name)
    try:
        m = bu.run_measured([sys.executable, str(Path(__file__).resolve()), "--worker", name,
                             "--files", str(list_path), "--texts-out", str(texts)],
                            cwd=REPO, env=bu.child_env(), timeout=WORKER_TIMEOUT,
                            stdout_path=stdout, stderr_path=str(texts) + ".err")
        lines = [ln for ln in stdout.read_text().splitlines() if ln.strip()]
    finally:
        stdout.unlink()
    if m["returncode"] != 0 or not lines:
        err = Path(str(texts) + ".err").read_text(errors="replace").strip().splitlines()
        return {"failed": (err or [f"exit {m['returncode']}"])[-1]}
    r: dict[str, Any] = json.loads(lines[-1])
    r["peak_rss_bytes"] = m["peak_rss_bytes"]
    r["process_cpu_s"] = m["cpu_s"]
    r["pages_per_s"] = r["pages"] / max(r["wall_s"], 1e-9)
    r["cpu_ms_per_page"] = 1e3 * r["cpu_s"] / max(r["pages"], 1)
    return r


def quality(texts: Path, refs: list[tuple[str, Reference | None]]) -> dict[str, dict[str, Any]]:
    """Per doc set, "all" and "content" (the pages that are not link lists): mean P, R, F1
    over pages, median F1, boilerplate leak (leaked / boilerplate-only tokens, summed over
    pages), pages with no text."""
    per: dict[str, list[dict[str, float]]] = {}
    empty: Counter[str] = Counter()
    with open(texts, encoding="utf-8") as f:
        for (label, ref), line in zip(refs, f, strict=True):
            if ref is None:
                continue
            text = json.loads(line)
            keys = (label, "all", "content") if ref[3] <= LINK_LIST_SHARE else (label, "all")
            for key in keys:
                empty[key] += not text.strip()
                per.setdefault(key, []).append(score(tokens(text), ref[1], ref[2]))
    out = {}
    for key, scores in per.items():
        boiler = sum(s["boiler"] for s in scores)
        out[key] = {"pages": len(scores), "empty": empty[key],
                    "p": sum(s["p"] for s in scores) / len(scores),
                    "r": sum(s["r"] for s in scores) / len(scores),
                    "f1": sum(s["f1"] for s in scores) / len(scores),
                    "f1_median": bu.median([s["f1"] for s in scores]),
                    "leak": sum(s["leaked"] for s in scores) / boiler if boiler else 0.0}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--html-dir", type=Path, action="append", default=[],
                   help="a directory of HTML files (repeatable)")
    p.add_argument("--articles", type=Path, metavar="DIR",
                   help="a checkout of scrapinghub/article-extraction-benchmark")
    p.add_argument("--fetch-debian-docs", action="store_true",
                   help="apt-get download and unpack --debian-packages into --workdir")
    p.add_argument("--debian-packages", default=DEBIAN_PACKAGES)
    p.add_argument("--extractors", default=",".join(EXTRACTORS))
    p.add_argument("--max-files", type=int, default=0,
                   help="at most this many files a doc set, evenly spread (0: all)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", type=Path, help="downloads, lists, outputs (default: a temp dir)")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/extract-<ts>.json)")
    p.add_argument("--worker", choices=EXTRACTORS, help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    p.add_argument("--texts-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    names = [n for n in args.extractors.split(",") if n]
    unknown = sorted(set(names) - set(EXTRACTORS))
    if unknown:
        raise SystemExit(f"bench_extract: unknown extractors {unknown}; known: {EXTRACTORS}")
    missing = [n for n in names if not installed(n)]
    for n in missing:
        bu.log(f"skipped {n}: {DISTRIBUTIONS[n]} is not installed")
    names = [n for n in names if n not in missing]
    temp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-extract-")) if temp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        sets = [(label_of(d), d) for d in args.html_dir]
        if args.fetch_debian_docs:
            sets += fetch_debian_docs(work, [x for x in args.debian_packages.split(",") if x])
        if not sets and args.articles is None:
            raise SystemExit("bench_extract: give --html-dir DIR, --articles DIR or "
                             "--fetch-debian-docs")
        files: list[tuple[str, Path]] = []
        for label, d in sets:
            files += [(label, f) for f in spread(html_files(d), args.max_files)]
        if not files and args.articles is None:
            raise SystemExit("bench_extract: no *.html files found")
        bu.log(f"{len(files)} files; references ...")
        refs = [(label, reference(f.read_bytes())) for label, f in files]
        if args.articles is not None:
            articles = article_pages(args.articles)
            files += [("articles", f) for f, _ in articles]
            refs += [("articles", ref) for _, ref in articles]
        corpus = _corpus_summary(files, refs)
        list_path = work / "files.txt"
        list_path.write_text("".join(f"{f.resolve()}\n" for _, f in files), encoding="utf-8")
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        texts = {n: work / f"texts-{n}.jsonl" for n in names}
        for rep in range(args.repeat):
            for name in names if rep % 2 == 0 else reversed(names):
                out = texts[name] if not runs[name] else work / f"texts-{name}-rerun.jsonl"
                r = run_extractor(name, list_path, out)
                runs[name].append(r)
                bu.log(f"run {rep + 1} {name}: " + (f"failed: {r['failed']}" if "failed" in r
                        else f"{r['pages_per_s']:.1f} pages/s {r['cpu_ms_per_page']:.2f} ms "
                             f"rss {r['peak_rss_bytes'] / 1e6:.0f} MB"))
        summary = [_summarize(n, runs[n], texts[n], refs) for n in names]
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    _print_tables(summary, corpus)
    out_path = args.out or REPO / "bench-results" / f"extract-{bu.timestamp()}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "machine": bu.machine_info(("lxml", "trafilatura", "resiliparse", "readability-lxml")),
        "loadavg": bu.loadavg(), "revision": bu.git_revision(REPO),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "skipped": {n: f"{DISTRIBUTIONS[n]} is not installed" for n in missing},
        "corpus": corpus, "runs": runs, "summary": summary}, indent=1, default=str))
    bu.log(f"wrote {out_path}")
    return 0


def _corpus_summary(files: list[tuple[str, Path]],
                    refs: list[tuple[str, Reference | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (label, f), (_, ref) in zip(files, refs, strict=True):
        s = out.setdefault(label, {"files": 0, "html_bytes": 0, "with_reference": 0,
                                   "link_lists": 0, "generators": {}, "reference_tokens": 0})
        s["files"] += 1
        s["html_bytes"] += (len(gzip.decompress(f.read_bytes())) if f.suffix == ".gz"
                            else f.stat().st_size)
        if ref is not None:
            s["with_reference"] += 1
            s["generators"][ref[0]] = s["generators"].get(ref[0], 0) + 1
            s["reference_tokens"] += sum(ref[1].values())
            s["link_lists"] += ref[3] > LINK_LIST_SHARE
    return out


def _summarize(name: str, runs: list[dict[str, Any]], texts: Path,
               refs: list[tuple[str, Reference | None]]) -> dict[str, Any]:
    good = [r for r in runs if "failed" not in r]
    if not good:
        return {"extractor": name, "failed": runs[0].get("failed") if runs else "no runs"}
    return {"extractor": name, "version": good[0]["version"], "runs": len(good),
            "pages": good[0]["pages"], "html_bytes": good[0]["html_bytes"],
            "text_bytes": good[0]["text_bytes"],
            "pages_per_s": bu.median([r["pages_per_s"] for r in good]),
            "cpu_ms_per_page": bu.median([r["cpu_ms_per_page"] for r in good]),
            "peak_rss_bytes": bu.median([r["peak_rss_bytes"] for r in good]),
            "failures": good[0]["failures"], "first_failures": good[0]["first_failures"],
            "deterministic": len({r["texts_sha1"] for r in good}) == 1,
            "quality": quality(texts, refs)}


def _print_tables(summary: list[dict[str, Any]], corpus: dict[str, Any]) -> None:
    ok = [s for s in summary if "failed" not in s]
    base = next((s for s in ok if s["extractor"] == "visible"), None)
    rows = []
    for s in summary:
        if "failed" in s:
            rows.append([s["extractor"], "failed: " + str(s["failed"])[:60], "", "", "", "", "",
                         ""])
            continue
        q, c = s["quality"].get("all", {}), s["quality"].get("content", {})
        ratio = (f"{s['cpu_ms_per_page'] / base['cpu_ms_per_page']:.1f}x" if base else "-")
        rows.append([s["extractor"], str(s["version"]), f"{s['pages_per_s']:.1f}",
                     f"{s['cpu_ms_per_page']:.2f} ({ratio})", bu.fmt_bytes(s["peak_rss_bytes"]),
                     f"{q.get('f1', 0):.3f}", f"{c.get('f1', 0):.3f}",
                     f"{q.get('leak', 0):.3f}"])
    print(bu.markdown_table(["extractor", "version", "pages/s", "CPU ms/page (vs visible)",
                             "peak RSS", "F1 all pages", "F1 content pages",
                             "boilerplate leak"], rows))
    print()
    qrows = []
    for s in ok:
        for label in [*corpus, "content"]:
            q = s["quality"].get(label)
            if q:
                qrows.append([s["extractor"], label, str(q["pages"]), f"{q['p']:.3f}",
                              f"{q['r']:.3f}", f"{q['f1']:.3f}", f"{q['f1_median']:.3f}",
                              f"{q['leak']:.3f}", str(q["empty"])])
    print(bu.markdown_table(["extractor", "doc set", "pages", "precision", "recall", "F1",
                             "median F1", "leak", "empty"], qrows))


if __name__ == "__main__":
    raise SystemExit(main())
