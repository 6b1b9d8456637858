"""HTML for the generated pages: text from a seeded paragraph pool, links in
varied but equivalent forms.

Every href written here resolves (RFC 3986 join, fragment dropped, host
lowercased) to exactly the canonical URL it was made from; the forms vary so
a crawler's URL handling is exercised: root-relative, relative (``p7.html``,
``../s2/p7.html``), absolute, protocol-relative, an uppercase host, and an
optional ``#fragment``. Each page also has a fragment-only link and an anchor
without href, which lead nowhere new.
"""

from __future__ import annotations

from html import escape
from random import Random

SYLLABLES = (
    "ka ri to na me lo su vi de pa ne ro ma ti lu go ba ce fi ha ju ko le mi no "
    "pu qua re sa te u ve wo xi ya ze an el in or us"
).split()
PARAGRAPHS = 64
ANCHORS = 256


class TextPool:
    """Seeded words and paragraphs; pages pick paragraphs instead of words (fast)."""

    def __init__(self, seed: int) -> None:
        rng = Random(seed ^ 0x7E57)
        words = []
        for _ in range(400):
            n = 1 + int(rng.random() * 4)
            words.append("".join(SYLLABLES[int(rng.random() * len(SYLLABLES))] for _ in range(n)))
        self.words = words
        self.paragraphs: list[str] = []
        for _ in range(PARAGRAPHS):
            target = 300 + int(rng.random() * 500)
            out: list[str] = []
            size = 0
            while size < target:
                w = words[int(rng.random() * len(words))]
                out.append(w)
                size += len(w) + 1
            text = " ".join(out)
            self.paragraphs.append(text[0].upper() + text[1:] + ".")
        # Anchor texts, picked by index: cheaper than drawing words per link.
        self.anchors = [self.phrase(rng) for _ in range(ANCHORS)]

    def phrase(self, rng: Random, n: int = 2) -> str:
        return " ".join(self.words[int(rng.random() * len(self.words))] for _ in range(n))


def relative_href(page_path: str, target: str) -> str:
    """A relative reference from ``page_path`` (``/`` or ``/sK/pN.html``) to ``target``."""
    page_dir = page_path[: page_path.rindex("/") + 1]
    if page_dir == "/":
        return target[1:] or "./"
    if target.startswith(page_dir):
        return target[len(page_dir) :] or "./"
    return "../" + target[1:]  # page_dir is one level deep


def href_for(link: str, page_origin: str, page_path: str, rng: Random) -> str:
    """One of the equivalent ways to write ``link`` on the page at ``page_origin + page_path``."""
    r = rng.random()
    if link.startswith(page_origin + "/"):
        target = link[len(page_origin) :]
        if r < 0.35:
            href = target
        elif r < 0.75:
            href = relative_href(page_path, target)
        else:
            href = link
    else:
        scheme, rest = link.split("://", 1)
        if r < 0.1 and page_origin.startswith(scheme + "://"):
            href = "//" + rest
        elif r < 0.2:
            netloc, slash, tail = rest.partition("/")
            href = f"{scheme.upper()}://{netloc.upper()}{slash}{tail}"
        else:
            href = link
    if rng.random() < 0.1:
        href += f"#sec{int(rng.random() * 9)}"
    return href


def render_page(
    pool: TextPool,
    *,
    seed: int,
    pid: int,
    host: str,
    page_origin: str,
    page_path: str,
    links: tuple[str, ...],
    size: int,
) -> bytes:
    """The HTML of generated page ``pid``: at least ``size`` bytes, every link once."""
    rng = Random(seed * 1_000_003 + pid)
    title = f"{pool.phrase(rng, 3).title()} (page {pid} on {host})"
    anchors = pool.anchors
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<title>{escape(title)}</title>\n</head>\n<body>\n<a id=\"top\"></a>\n",
        f"<h1>{escape(title)}</h1>\n",
        "<p><a href=\"#main\">Skip to text</a> <a name=\"main\">.</a></p>\n",
    ]
    length = sum(map(len, parts))
    i = 0
    paragraphs = pool.paragraphs
    while i < len(links) or length < size:
        para = paragraphs[int(rng.random() * len(paragraphs))]
        if i < len(links):
            n = min(len(links) - i, 1 + int(rng.random() * 4))
            items = []
            for link in links[i : i + n]:
                # Canonical URLs hold no '&', '<' or '"': no escaping needed.
                href = href_for(link, page_origin, page_path, rng)
                anchor = anchors[int(rng.random() * ANCHORS)]
                items.append(f"<li><a href=\"{href}\">{anchor}</a></li>")
            i += n
            chunk = f"<p>{para}</p>\n<ul>{''.join(items)}</ul>\n"
        else:
            chunk = f"<p>{para}</p>\n"
        parts.append(chunk)
        length += len(chunk)
    parts.append("<p><a href=\"#top\">Back to top</a></p>\n</body>\n</html>\n")
    return "".join(parts).encode()


def leaf_page(title: str, extra: str = "") -> bytes:
    """A small page with no links (or only ``extra`` markup)."""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title></head>\n<body><h1>{escape(title)}</h1>\n"
        f"<p>A leaf page of the test web.</p>\n{extra}</body></html>\n"
    ).encode()


def link_list(title: str, hrefs: list[str], head: str = "") -> bytes:
    """A plain index page linking each href (already in the form to write)."""
    items = "".join(f"<li><a href=\"{escape(h)}\">{escape(h)}</a></li>\n" for h in hrefs)
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">{head}"
        f"<title>{escape(title)}</title></head>\n<body><h1>{escape(title)}</h1>\n"
        f"<ul>\n{items}</ul>\n</body></html>\n"
    ).encode()
