"""The hostile pages: what each fault of faults.KINDS answers.

Each feature lives under ``/x/<kind>/`` on its host. The canonical links of
every page are written out next to its HTML, so the oracle and the tests can
compare one with the other. A link whose extraction is ambiguous between
sane parsers (inside 20,000 nested divs, after broken markup) always points
at a URL that is linked plainly elsewhere too, so the oracle stays exact.
"""

from __future__ import annotations

import re
import struct
import zlib
from html import escape
from random import Random

from .cookiewall import cookie_wall
from .encodings import BOMBS
from .faults import Fault
from .model import NOT_FOUND, Node, SiteView, text_node
from .render import leaf_page, link_list
from .scripted import scripts
from .sitemapped import sitemaps
from .urls import idna_host, quote_path

_MONTH = re.compile(r"([0-9]{4,5})-([0-9]{2})")

# -- response faults -------------------------------------------------------------


def filler(size: int) -> bytes:
    """``size`` bytes of link-free HTML-ish text."""
    unit = b"<p>testweb filler text without any links in it.</p>\n"
    return (unit * (size // len(unit) + 1))[:size]


def apply_response_fault(site: SiteView, host: str, node: Node, f: Fault) -> Node:
    """``node`` as answered under response fault ``f``."""
    kind = f.kind
    if kind == "slow_first_byte":
        return node.but(delivery=f, fault=kind)
    if kind in ("slow_drip", "reset"):
        return Node(200, body=filler(int(f.num("size"))), delivery=f, fault=kind)
    if kind in ("huge_body", "nul_body", *BOMBS):
        return Node(200, body=b"", delivery=f, fault=kind)
    if kind in ("status_429", "status_503"):
        times = int(f.num("times"))
        if times < 0:  # forever: the page is never served
            status = int(kind[-3:])
            return text_node(status, "Try again later.", fault=kind).but(
                headers=(("Retry-After", str(f.get("retry_after"))),), html=False
            )
        return node.but(retries=times, delivery=f, fault=kind)
    if kind == "status_500":
        return text_node(500, "Internal server error.", fault=kind).but(html=False)
    if kind == "wrong_type":
        body = site.body(host, node)
        return node.but(body=body, links=(), html=False, content_type=str(f.get("content_type")),
                        fault=kind)
    raise AssertionError(f"not a response fault: {kind}")


def dedicated_page(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    """The own leaf page ``/x/<kind>/1`` of a response fault."""
    if rest == "1":
        extra = ""
        if f.kind == "wrong_type":  # a link a parser would find if it ignored the type
            extra = f"<p><a href=\"{f.mount}hidden\">hidden</a></p>\n"
        return Node(200, body=leaf_page(f"{f.kind} {rest}", extra))
    if f.kind == "wrong_type" and rest == "hidden":
        return Node(200, body=leaf_page("hidden"))
    return NOT_FOUND


# -- robots.txt faults -----------------------------------------------------------


def robots_fault(f: Fault, base: str | None) -> Node:
    kind = f.kind
    plain = "text/plain"
    if kind == "robots_5xx":
        return Node(int(f.num("status")), html=False, content_type=plain,
                    body=b"Service unavailable\n", fault=kind)
    if kind == "robots_huge":
        head = (base or "User-agent: *\nDisallow:\n").encode()
        size = int(f.num("size"))
        line = b"# " + b"robots filler " * 5 + b"\n"
        body = head + (line * (size // len(line) + 1))[: max(0, size - len(head))]
        return Node(200, html=False, content_type=plain, body=body, fault=kind)
    if kind == "robots_garbage":
        junk = bytes(b for b in Random(f"garbage:{f.where}").randbytes(4096) if b not in b":\n")
        body = b"<html><body>Oops we could not find that page</body></html>\n" + junk
        return Node(200, html=False, content_type=plain, body=body, fault=kind)
    if kind == "robots_slow":
        if base is None:
            return NOT_FOUND.but(html=False, delivery=f, fault=kind)
        return Node(200, html=False, content_type=plain, body=base.encode(), delivery=f,
                    fault=kind)
    raise AssertionError(f"not a robots fault: {kind}")


# -- features --------------------------------------------------------------------


def entry(site: SiteView, f: Fault, host: str) -> str:
    """The canonical URL the ``/x/`` index links for feature ``f``."""
    if f.kind == "spider_trap":
        return site.url(host, f"{f.mount}{f.get('start')}")
    return site.url(host, f.mount)


def feature(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    handler = _FEATURES[f.kind]
    return handler(site, f, host, rest)


def _index(site: SiteView, f: Fault, host: str, names: list[str]) -> Node:
    links = tuple(site.url(host, f.mount + n) for n in names)
    return Node(200, links=links, body=link_list(f.kind, [f.mount + n for n in names]))


def _redirect(status: int, location: str, raw: str | None = None) -> Node:
    return Node(status, location=location, raw_location=raw or location, html=False, body=b"")


def _redirects(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    hops = int(f.num("hops"))
    here = site.url(host, f.mount)
    if rest == "":
        return _index(site, f, host, ["loop-a", "chain/0", "to-host", "to-out", "relative",
                                      "303", "307", "308"])
    if rest in ("loop-a", "loop-b"):
        return _redirect(302, here + ("loop-b" if rest == "loop-a" else "loop-a"))
    if rest.startswith("chain/"):
        step = rest[6:]
        if step == "end":
            return Node(200, body=leaf_page("end of the chain"))
        if step.isdigit() and str(int(step)) == step and int(step) < hops:
            k = int(step)
            nxt = f"chain/{k + 1}" if k + 1 < hops else "chain/end"
            return _redirect(301, here + nxt)
        return NOT_FOUND
    if rest == "to-host":
        other = "h1.test" if "h1.test" in site.hosts and host != "h1.test" else "out.test"
        return _redirect(301, site.url(other))
    if rest == "to-out":
        return _redirect(302, site.url("out.test"))
    if rest == "relative":
        return _redirect(302, here + "rel-target", raw="rel-target")
    if rest in ("303", "307", "308"):
        return _redirect(int(rest), here + f"target-{rest}", raw=f"{f.mount}target-{rest}")
    if rest in ("rel-target", "target-303", "target-307", "target-308"):
        return Node(200, body=leaf_page(rest))
    return NOT_FOUND


def _png(width: int = 4, height: int = 4) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + \
        chunk(b"IEND", b"")


_PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)


def _binary(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    if rest == "":
        return _index(site, f, host, ["image", "pdf", "png-as-html", "octet"])
    if rest == "image":
        return Node(200, html=False, content_type="image/png", body=_png())
    if rest == "pdf":
        return Node(200, html=False, content_type="application/pdf", body=_PDF)
    if rest == "png-as-html":  # parsed as HTML by type; it has no links
        return Node(200, content_type="text/html", body=_png(64, 64))
    if rest == "octet":
        return Node(200, html=False, content_type="application/octet-stream",
                    body=site.rng("octet", host).randbytes(2048))
    return NOT_FOUND


# name -> (Content-Type header, extra <head> markup, codec, visible text, link path)
_CHARSET_PAGES = {
    "header": ("text/html; charset=iso-8859-1", "", "latin-1", "Café crème", "café"),
    "meta": (
        "text/html",
        '<meta http-equiv="Content-Type" content="text/html; charset=koi8-r">',
        "koi8-r", "Привет, мир", "привет",
    ),
    "sjis": ("text/html; charset=shift_jis", "", "shift_jis", "日本語のページ", "日本"),
    "conflict": ("text/html; charset=iso-8859-1", '<meta charset="utf-8">', "latin-1",
                 "Señal: the header wins over the meta tag", "señal"),
    "none": ("text/html", "", "cp1252", "A naïve page with no declared charset", "none-target"),
}


def _charset_target(word: str) -> str:
    return quote_path(word)


def _charsets(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    if rest == "":
        return _index(site, f, host, list(_CHARSET_PAGES))
    page = _CHARSET_PAGES.get(rest)
    if page is not None:
        ctype, head, codec, text, word = page
        html = (
            f"<!DOCTYPE html>\n<html><head>{head}<title>{rest}</title></head>\n<body>"
            f"<p>{escape(text)}</p>\n<p><a href=\"{f.mount}{word}\">{escape(word)}</a></p>\n"
            "</body></html>\n"
        )
        link = site.url(host, f.mount + _charset_target(word))
        return Node(200, links=(link,), content_type=ctype, body=html.encode(codec))
    targets = {_charset_target(p[4]) for p in _CHARSET_PAGES.values()}
    if rest in targets:
        return Node(200, body=leaf_page(f"charset target {rest}"))
    return NOT_FOUND


def _malformed(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    m = f.mount
    if rest == "":
        return _index(site, f, host, ["broken", "deep"])
    if rest == "broken":
        body = (
            "<html><head><title>broken</title><body>\n"
            f"<div><p>text <a href=\"{m}ok-1\">one</a> <table><tr><td>"
            f"<a href='{m}ok-2'>two</td></div></p>\n"
            f"<a href={m}ok-3>three <b><i>unclosed</b>\n"
            "</table></table></span></html>\n"
            f"<p <p>>> & &amp &#xZZ; < > \"'\n<a href=\"{m}ok-1\">after the end</a>\n"
            "<!-- a comment that never ends <a href=\"/x/never\">\n"
        ).encode()
        return Node(200, links=tuple(site.url(host, m + f"ok-{i}") for i in (1, 2, 3)), body=body)
    if rest == "deep":
        depth = int(f.num("depth"))
        body = (
            f"<!DOCTYPE html>\n<html><body><p><a href=\"{m}ok-4\">before</a></p>\n"
            + "<div>" * depth
            + f"deep <a href=\"{m}ok-1\">inside</a>"
            + "</div>" * depth
            + "\n</body></html>\n"
        ).encode()
        return Node(200, links=(site.url(host, m + "ok-4"),), body=body)
    if rest in ("ok-1", "ok-2", "ok-3", "ok-4"):
        return Node(200, body=leaf_page(rest))
    return NOT_FOUND


def _base_href(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    m = f.mount
    if rest == "":
        return _index(site, f, host, ["rel", "abs"])
    if rest == "rel":
        hrefs = ["a.html", "b.html?q=1", f"{m}root.html", "../up.html"]
        links = ("dir/a.html", "dir/b.html?q=1", "root.html", "up.html")
        return Node(200, links=tuple(site.url(host, m + x) for x in links),
                    body=link_list("base rel", hrefs, head=f'<base href="{m}dir/">'))
    if rest == "abs":
        base = site.url(host, m + "abs/")
        return Node(200, links=(base + "c.html",),
                    body=link_list("base abs", ["c.html"], head=f'<base href="{base}">'))
    if rest in ("dir/a.html", "dir/b.html", "root.html", "up.html", "abs/c.html"):
        return Node(200, body=leaf_page(rest))
    return NOT_FOUND


def _link_schemes(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    m = f.mount
    if rest == "":
        return _index(site, f, host, ["page"])
    if rest == "page":
        origin = site.origin(host)
        scheme, netloc = origin.split("://")
        hrefs = [
            "javascript:void(0)",
            f"mailto:someone@{host}",
            'data:text/html,<a href="/x/from-data">x</a>',
            "tel:+15550100",
            f"ftp://{host}/file.txt",
            f"  {m}spaces  ",
            f"//{netloc}{m}proto-relative",
            f"{scheme.upper()}://{netloc.upper()}{m}Upper",
            f"{m}frag#one",
            f"{m}frag#two",
            "",
            "#",
            f"{m}dots/../dotted",
            f"{m}sp ace",
        ]
        items = "".join(f"<li><a href=\"{escape(h)}\">link</a></li>\n" for h in hrefs)
        items += f"<li><a href=\"&#47;{m[1:]}entity\">entity-encoded</a></li>\n"
        body = (
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>schemes</title></head>"
            f"<body><ul>\n{items}</ul></body></html>\n"
        ).encode()
        names = ["spaces", "proto-relative", "Upper", "frag", "page", "dotted", "sp%20ace",
                 "entity"]
        return Node(200, links=tuple(site.url(host, m + n) for n in names), body=body)
    if rest in ("spaces", "proto-relative", "Upper", "frag", "dotted", "sp%20ace", "entity"):
        return Node(200, body=leaf_page(rest))
    return NOT_FOUND


def _long_urls(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    m = f.mount + "a/"
    if rest == "":
        return _index(site, f, host, ["page"])
    lengths = f.get("lengths")
    assert isinstance(lengths, tuple)
    if rest == "page":
        targets = [m + "x" * (n - len(m)) for n in lengths]
        return Node(200, links=tuple(site.url(host, t) for t in targets),
                    body=link_list("long URLs", targets))
    if rest.startswith("a/") and set(rest[2:]) == {"x"} and len(m) + len(rest) - 2 in lengths:
        return Node(200, body=leaf_page(f"a long URL of {len(m) + len(rest) - 2} characters"))
    return NOT_FOUND


def _spider_trap(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    match = _MONTH.fullmatch(rest)
    if match is None:
        return NOT_FOUND
    year, month = int(match.group(1)), int(match.group(2))
    if not 1 <= month <= 12 or year < 1 or f"{year:04d}-{month:02d}" != rest:
        return NOT_FOUND
    prev = None
    if year > 1 or month > 1:
        prev = f"{year - (month == 1):04d}-{(month - 2) % 12 + 1:02d}"
    nxt = f"{year + (month == 12):04d}-{month % 12 + 1:02d}"
    names = [n for n in (prev, nxt) if n is not None and _MONTH.fullmatch(n)]
    days = "".join(f"<td>{d}</td>" for d in range(1, 29)).encode()
    body = link_list(f"Calendar {rest}", [f.mount + n for n in names])
    body = body.replace(b"<ul>", b"<table><tr>" + days + b"</tr></table>\n<ul>", 1)
    return Node(200, links=tuple(site.url(host, f.mount + n) for n in names), body=body)


def _shortcut(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    """Two paths to ``trap/1``: ``chain/1`` .. ``chain/N`` (N = ``chain``) and ``slow``,
    both linked from the index; ``trap/1`` .. ``trap/L`` (L = ``length``) follow it in a
    line. Made slow (a ``slow_first_byte`` fault on ``/x/shortcut/slow``), the short
    path answers after the long one: a crawler that keeps the depth it first met
    ``trap/1`` at cuts the line early under a depth limit."""
    n, length = int(f.num("chain")), int(f.num("length"))
    match = _SHORTCUT.fullmatch(rest)
    if rest == "":
        return _index(site, f, host, ["chain/1", "slow"])
    if rest == "slow":
        names = ["trap/1"]
    elif match is not None and 1 <= int(match.group(2)) <= (n if match.group(1) == "chain"
                                                            else length):
        kind, i = match.group(1), int(match.group(2))
        last = n if kind == "chain" else length
        names = [f"{kind}/{i + 1}"] if i < last else (["trap/1"] if kind == "chain" else [])
    else:
        return NOT_FOUND
    if not names:
        return Node(200, body=leaf_page(f"shortcut {rest}"))
    return Node(200, links=tuple(site.url(host, f.mount + m) for m in names),
                body=link_list(f"shortcut {rest}", [f.mount + m for m in names]))


_SHORTCUT = re.compile(r"(chain|trap)/([1-9][0-9]{0,5})")


# name -> (meta tag, X-Robots-Tag header, nofollow, noindex, leaf names)
_META_PAGES = {
    "nofollow": ('<meta name="robots" content="nofollow">', None, True, False, ["nf-1", "nf-2"]),
    "noindex": ('<meta name="robots" content="noindex">', None, False, True, ["ni-1"]),
    "none": ('<meta name="ROBOTS" content="none">', None, True, True, ["none-1"]),
    "header": ("", "nofollow", True, False, ["hdr-1"]),
    "other-bot": ('<meta name="badbot" content="nofollow">', None, False, False, ["ob-1"]),
}


def _meta_robots(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    if rest == "":
        return _index(site, f, host, list(_META_PAGES))
    page = _META_PAGES.get(rest)
    if page is not None:
        meta, header, nofollow, noindex, leaves = page
        return Node(
            200,
            links=tuple(site.url(host, f.mount + n) for n in leaves),
            nofollow=nofollow,
            noindex=noindex,
            headers=(("X-Robots-Tag", header),) if header else (),
            body=link_list(f"meta robots {rest}", [f.mount + n for n in leaves], head=meta),
        )
    if any(rest in p[4] for p in _META_PAGES.values()):
        return Node(200, body=leaf_page(rest))
    return NOT_FOUND


def _idn(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    if rest != "":
        return NOT_FOUND
    uname = str(f.get("name"))
    aname = idna_host(uname)
    assert aname is not None
    home = site.url(aname)
    unicode_home = home.replace(aname, uname, 1)
    hrefs = [unicode_home, site.url(aname, "/e/1.html")]
    return Node(200, links=(home, site.url(aname, "/e/1.html")), body=link_list("IDN", hrefs))


_FEATURES = {
    "redirects": _redirects,
    "binary": _binary,
    "charsets": _charsets,
    "malformed": _malformed,
    "base_href": _base_href,
    "link_schemes": _link_schemes,
    "long_urls": _long_urls,
    "spider_trap": _spider_trap,
    "meta_robots": _meta_robots,
    "idn": _idn,
    "scripts": scripts,
    "sitemaps": sitemaps,
    "shortcut": _shortcut,
    "cookie_wall": cookie_wall,
}
