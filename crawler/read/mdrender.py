"""Markdown of resiliparse's minimal HTML (crawler.read.pagetext reads a page into it):
headings, paragraphs, line breaks, links resolved against the page, fenced preformatted
text, lists with their markers and nesting, and tables as GitHub's.

resiliparse writes a page's tables as lines of cells joined by two tabs, one line a row
(trailing empty cells left out), and nothing else marks them: :func:`mark_tables` finds
such runs of lines (two rows at least, the first with two cells, outside ``<pre>``)
and marks them with tags of our own (``<table>``, ``<tr>``, ``<td>``; the outline's
text has its ``<`` escaped, so no text can look like one), which
:func:`outline_markdown` writes as a table whose first row is the header, every row
padded to the widest. Lists come as ``<ul>``/``<ol>``/``<li>`` (resiliparse's
``list_bullets``): ``- `` and ``1. `` markers, nested lists and an item's later
paragraphs indented to its text, as CommonMark reads them.

Inline code (``<code>``, not in ``<pre>``) is written between backticks, as it is
(not escaped): :func:`mark_code` marks it in the page before resiliparse reads it;
:func:`mark_images` writes each ``<img>`` there as marked text, written as
``![alt](source)`` with the source made absolute. What
the outline does not say is not made up: definition lists and admonitions come out as
text (resiliparse keeps no such markup).

Thread safety: pure functions.
"""

from __future__ import annotations

import re
from html import escape, unescape
from urllib.parse import urljoin

# The tags of resiliparse's minimal HTML, ours for tables, and what Markdown says
# specially in text.
_MD_TAG = re.compile(r'<(/?)(h[1-6]|p|ul|ol|li|pre|br|a|table|tr|td)(?: href="([^"]*)")?>')
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>])")
_MD_LINE_START = re.compile(r"^([#>+-]|\d+[.)])", re.M)
_PRE = re.compile(r"<pre>.*?</pre>", re.S)
# Inline code: resiliparse keeps no <code>, so mark_code puts this character at each
# one's start and end in the page first. A control character (RS): resiliparse drops a
# text node of only a private-use or non-character code point (the mark between <code>
# and its first <span>, Sphinx's way), not this; any already in the page is removed.
CODE_MARK = "\x1e"
_CODE_OPEN = re.compile(r"<code(?:\s[^<>]*)?>", re.IGNORECASE)
_CODE_CLOSE = re.compile(r"</code\s*>", re.IGNORECASE)
# Images: mark_images writes each <img> as its alt text and source between these (FS,
# and US between the two), for the same reason.
IMAGE_MARK = "\x1c"
_IMAGE_SEP = "\x1f"
_IMG = re.compile(r"<img\b[^<>]*>", re.IGNORECASE)
_ATTR = re.compile(r"""([\w:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>]+))""")
MAX_IMAGE_URL = 2_000  # characters of an image's source written; a longer one: its alt
# Admonitions (a note, a warning): crawler.read.pagetext puts QUOTE_OPEN as the first
# child of each and QUOTE_CLOSE as its last (GS and SUB), written as a block quote.
QUOTE_OPEN = "\x1d"
QUOTE_CLOSE = "\x1a"
_NO_MARKS = dict.fromkeys(map(ord, CODE_MARK + IMAGE_MARK + _IMAGE_SEP + QUOTE_OPEN
                              + QUOTE_CLOSE))
_CELLS = "\t\t"  # between two cells of a row, in resiliparse's text of a table


def _table(rows: list[str]) -> str:
    cells = [row.split(_CELLS) for row in rows]
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    cells.insert(1, ["---"] * width)  # the first row is the header
    return "\n<table>" + "".join(
        "<tr>" + "<td>".join(row) + "</tr>" for row in cells) + "</table>\n"


def _mark_lines(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    run: list[str] = []
    for line in [*lines, ""]:
        # a row; or, once rows began, a row of one cell (resiliparse drops trailing empty
        # cells): any next line that is neither blank (a block's margin) nor a tag
        if _CELLS in line or (run and line.strip() and not line.lstrip().startswith("<")):
            run.append(line)
            continue
        if len(run) >= 2:
            out.append(_table(run))
        else:
            out.extend(run)
        run = []
        out.append(line)
    return "\n".join(out[:-1])


def mark_tables(outline: str) -> str:
    """``outline`` with each table resiliparse wrote as lines of cells marked with our
    ``<table>``/``<tr>``/``<td>`` tags (the module docstring); ``<pre>`` left as it is."""
    if _CELLS not in outline:
        return outline
    out, pos = [], 0
    for m in _PRE.finditer(outline):
        out.append(_mark_lines(outline[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_mark_lines(outline[pos:]))
    return "".join(out)


def mark_code(html: str) -> str:
    """``html`` with CODE_MARK just inside each ``<code>`` and ``</code>``, for
    :func:`outline_markdown` to write inline code as code. The page's own marks must be
    gone (:func:`mark_page`)."""
    html = _CODE_OPEN.sub(lambda m: m.group(0) + CODE_MARK, html)
    return _CODE_CLOSE.sub(lambda m: CODE_MARK + m.group(0), html)


def mark_page(html: str) -> str:
    """``html`` ready for resiliparse and :func:`outline_markdown`: the page's own mark
    characters removed, then its inline code and images marked (:func:`mark_code`,
    :func:`mark_images`)."""
    return mark_images(mark_code(html.translate(_NO_MARKS)))


def mark_images(html: str) -> str:
    """``html`` with each ``<img>`` replaced by its alt text and source between
    IMAGE_MARKs (resiliparse keeps neither), for :func:`outline_markdown` to write as an
    image; one with no source or a ``data:`` one (bytes, not an address) by its alt
    text alone. The page's own marks must be gone (:func:`mark_page`)."""
    def one(m: re.Match[str]) -> str:
        attrs: dict[str, str] = {}
        for a in _ATTR.finditer(m.group(0), 4):
            value = a.group(2) if a.group(2) is not None else (
                a.group(3) if a.group(3) is not None else a.group(4))
            attrs.setdefault(a.group(1).lower(), value)
        src = unescape(attrs.get("src", "")).strip()
        alt = " ".join(unescape(attrs.get("alt", "")).split())
        if not src or src[:5].lower() == "data:" or len(src) > MAX_IMAGE_URL:
            return escape(alt)
        return IMAGE_MARK + escape(alt) + _IMAGE_SEP + escape(src) + IMAGE_MARK
    return _IMG.sub(one, html)


def _code_span(raw: str, cell: bool) -> str:
    """Inline code as Markdown: its text unescaped, whitespace collapsed, between as
    many backticks as it needs (one more than its longest run); ``|`` escaped in a
    table's cell (GitHub's tables split on it even in code)."""
    code = " ".join(unescape(raw).split())
    if not code:
        return ""
    ticks = "`" * (_longest_ticks(code) + 1)
    pad = " " if code[0] == "`" or code[-1] == "`" else ""
    if cell:
        code = code.replace("|", "\\|")
    return f"{ticks}{pad}{code}{pad}{ticks}"


def _escape_start(m: re.Match[str]) -> str:
    mark = m.group(1)  # "#", ">", "+", "-", or "12." / "12)": its punctuation escaped
    return "\\" + mark if not mark[0].isdigit() else mark[:-1] + "\\" + mark[-1]


def md_text(raw: str, line_start: bool, *, cell: bool = False) -> str:
    """Text of the outline as Markdown text: whitespace collapsed (one space kept at
    each end), Markdown's characters escaped, and what would start a block at the start
    of a line (``#``, ``-``, ``1.``) too; in a table ``cell``, ``|`` too."""
    words = unescape(raw).split()
    if not words:
        return "" if line_start or not raw else " "
    text = _MD_SPECIAL.sub(r"\\\1", " ".join(words))
    if cell:
        text = text.replace("|", "\\|")
    if line_start or raw[0].isspace():  # a new line may follow a space once wrapped
        text = _MD_LINE_START.sub(_escape_start, text)
    lead = " " if raw[0].isspace() and not line_start else ""
    return lead + text + (" " if raw[-1].isspace() else "")


def _longest_ticks(code: str) -> int:
    """The longest run of backticks in ``code``: a fence or a span around it is longer."""
    return max((len(m) for m in re.findall(r"`+", code)), default=0)


def _fence(code: str) -> str:
    return "`" * max(3, _longest_ticks(code) + 1)


class _Writer:
    """The Markdown being written, and where in lists and tables it is."""

    def __init__(self, base: str) -> None:
        self.base = base  # what images' sources resolve against
        self.out: list[str] = []
        self.lists: list[list[int]] = []  # [ordered, items so far, marker's column]
        self.indent = 0  # the column an open item's text starts at (0: in no item)
        self.fresh = True  # nothing written since the last line start or item marker
        self.cell = False  # inside a table's row
        self.in_code = False  # inside inline code (CODE_MARK)
        self.in_link = False  # inside a link's text: no paragraph break there
        # A line break in resiliparse's text is where one block ended and another began
        # (a <div>, a <dt>, a <dd>): a paragraph break before the next text, unless a tag
        # made one already.
        self.pending = False

    def text(self, raw: str) -> None:
        """Text between two tags; CODE_MARKs in it open and close inline code (which
        may span tags: a link in code is code in a link)."""
        if QUOTE_OPEN in raw or QUOTE_CLOSE in raw:
            for piece in re.split(f"([{QUOTE_OPEN}{QUOTE_CLOSE}])", raw):
                if piece in (QUOTE_OPEN, QUOTE_CLOSE):
                    self.quote(piece)
                elif piece:
                    self.text(piece)
            return
        for i, part in enumerate(raw.split(CODE_MARK)):
            if i:
                self.in_code = not self.in_code
            for j, line in enumerate(part.split("\n")):
                if j:
                    self.pending = True
                for k, piece in enumerate(line.split(IMAGE_MARK)):
                    if k % 2:
                        self._image(piece)
                    else:
                        self._part(piece)

    def quote(self, mark: str) -> None:
        """A block quote's start or end, on a line of its own (outline_markdown's last
        step makes the lines between them the quote's)."""
        self.pending = False
        self._new_line("\n\n")
        self.out.append(" " * self.indent + mark + "\n\n" + " " * self.indent)
        self.fresh = True

    def _image(self, marked: str) -> None:
        """An image mark_images wrote: ``![alt](source)``, the source resolved."""
        alt, _, src = marked.partition(_IMAGE_SEP)
        try:
            target = urljoin(self.base, unescape(src).strip())
        except ValueError:  # a bad source: its alt text stays
            target = ""
        if self.in_code or not target:
            self._part(alt)
            return
        self.resolve()
        target = target.replace(" ", "%20").replace("(", "%28").replace(")", "%29")
        words = md_text(alt, False, cell=self.cell).strip()
        lead = " " if self.out and not self.fresh and not self.out[-1].endswith(
            (" ", "[", "\n")) else ""
        self.out.append(f"{lead}![{words}]({target})")
        self.fresh = False

    def resolve(self) -> None:
        """Before text or a link: the paragraph break a line's end asked for, if no tag
        made one (in a link's text or a table's cell, a space)."""
        if not self.pending:
            return
        self.pending = False
        if not (self.fresh or self.in_link or self.cell):
            self.out.append("\n\n" + " " * self.indent)
            self.fresh = True
        elif not self.fresh and self.out and not self.out[-1].endswith(" "):
            self.out.append(" ")

    def _part(self, part: str) -> None:
        """One line of text (or of inline code) between two tags."""
        if part.strip():
            self.resolve()
        if self.in_code:
            piece = _code_span(part, self.cell)
            # (a space before it after another span: two spans side by side would read
            # as one; resiliparse drops a text node of only "->" between them)
            lead = " " if (part[:1].isspace() or self.out[-1:] and
                           self.out[-1].endswith("`")) and not self.fresh else ""
            piece = lead + piece + (" " if piece and part[-1:].isspace() else "")
        else:
            piece = md_text(part, self.fresh, cell=self.cell)
        if piece.strip():
            self.fresh = False
        if piece:
            self.out.append(piece)

    def block(self) -> None:
        """A blank line, then the open item's indentation (none after its marker)."""
        if self.lists and self.fresh:
            return
        self.out.append("\n\n" + " " * self.indent)
        self.fresh = True

    def line(self) -> None:
        self.out.append("\\\n" + " " * self.indent)
        self.fresh = True

    def open_list(self, ordered: bool) -> None:
        self._new_line("\n" if self.lists else "\n\n")
        self.lists.append([int(ordered), 0, self.indent])

    def close_list(self) -> None:
        if self.lists:
            self.lists.pop()
        self.indent = self.lists[-1][2] + self._width(self.lists[-1]) if self.lists else 0
        # (a blank line: text of the outer item right after would continue the inner one)
        self._new_line("\n\n")
        self.out.append(" " * self.indent)  # what follows in the outer item is its text
        self.fresh = True

    def _new_line(self, breaks: str) -> None:
        """``breaks`` unless the Markdown already ends with a line's start (indentation
        pending there is dropped: what comes next sets its own)."""
        while self.out and not self.out[-1].strip(" "):
            self.out.pop()  # (nothing but spaces: an indentation no text followed)
        if self.out and self.out[-1].endswith("\n"):
            return
        self.out.append(breaks)

    @staticmethod
    def _width(entry: list[int]) -> int:
        return len(f"{entry[1]}. ") if entry[0] else 2

    def item(self) -> None:
        if not self.lists:  # an <li> outside a list: a line of its own
            self.block()
            return
        entry = self.lists[-1]
        entry[1] += 1
        marker = f"{entry[1]}. " if entry[0] else "- "
        self._new_line("\n")
        self.out.append(" " * entry[2] + marker)
        self.indent = entry[2] + len(marker)
        self.fresh = True

    def code(self, code: str) -> None:
        fence = _fence(code)
        pad = "\n" + " " * self.indent
        body = pad.join(code.split("\n"))
        self.out.append(f"\n\n{' ' * self.indent}{fence}{pad}{body}{pad}{fence}\n\n"
                        + " " * self.indent)
        self.fresh = True


def outline_markdown(outline: str, base: str) -> str:
    """Markdown of resiliparse's minimal HTML (the module docstring), links resolved
    against ``base``."""
    w = _Writer(base)
    out = w.out
    pos, link, pre_start = 0, "", -1
    opened = -1  # where the open link's "[" is in out, or -1

    def drop_link() -> None:  # a link with no text, or one a block cuts: its text stays
        nonlocal opened
        if opened >= 0:
            out[opened] = ""
            opened = -1
        w.in_link = False

    outline = mark_tables(outline)
    for m in _MD_TAG.finditer(outline):
        raw, pos = outline[pos:m.start()], m.end()
        closing, tag, href = m.group(1) == "/", m.group(2), m.group(3)
        if tag != "a" and opened >= 0 and tag != "br":
            drop_link()
        if pre_start >= 0:  # inside <pre>: its text as it is, up to its end
            if tag == "pre" and closing:
                code = unescape(outline[pre_start:m.start()]).replace(CODE_MARK, "")
                w.code(code.strip("\n"))
                pre_start = -1
            continue
        w.text(raw)
        if tag == "a" and not closing:
            w.resolve()  # (a link that begins a block: a list of links, one a line)
        elif tag != "a":
            w.pending = False  # a tag of a block, or a line's: it made the break
        if tag == "pre" and not closing:
            pre_start = pos
        elif tag[0] == "h":
            w.block()
            if not closing:
                out.append("#" * int(tag[1]) + " ")
                w.fresh = False  # (a heading's text starts no block of its own)
        elif tag in ("p", "table"):
            w.block()
            w.cell = w.in_code = False  # (inline code a block cut: closed)
        elif tag in ("ul", "ol") and closing:
            w.close_list()
        elif tag in ("ul", "ol"):
            w.open_list(tag == "ol")
        elif tag == "li" and not closing:
            w.item()
        elif tag == "br":
            w.line()
        elif tag == "tr":
            w.cell = not closing
            out.append(" |" if closing else "\n" + " " * w.indent + "| ")
            w.fresh = False
        elif tag == "td":
            out.append(" | ")
        elif tag == "a" and not closing:
            drop_link()
            written = unescape(href or "").strip()  # "": an <a> with no href, too
            try:
                link = urljoin(base, written) if written else ""
            except ValueError:  # a bad href: its text stays, without a link
                link = ""
            opened = len(out)
            out.append("[")
            w.in_link = True
        elif tag == "a" and opened >= 0:
            target = link.replace(" ", "%20").replace("(", "%28").replace(")", "%29")
            if target and "".join(out[opened + 1:]).strip():
                out.append(f"]({target})")
                opened = -1
                w.in_link = False
            else:
                drop_link()
    if pre_start < 0:
        w.text(outline[pos:])
    drop_link()
    lines = _quoted([ln.rstrip(" ") for ln in "".join(out).split("\n")])
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _quoted(lines: list[str]) -> list[str]:
    """``lines`` with each between a QUOTE_OPEN line and its QUOTE_CLOSE line quoted (``> ``
    after the indentation the open line had: a quote in a list item stays in it), those
    two lines gone, and no blank line of the quote's at its start or end."""
    out: list[str] = []
    quotes: list[int] = []  # the indentation of each open quote, outermost first

    def prefix(line: str) -> str:
        for indent in quotes:
            line = line.ljust(indent)
            line = line[:indent] + ">" + (" " + line[indent:] if line[indent:] else "")
        return line

    for line in lines:
        mark = line.strip(" ")
        if mark in (QUOTE_OPEN, QUOTE_CLOSE):
            if quotes:
                while out and out[-1] == prefix("").rstrip(" "):
                    out.pop()  # (the quote's blank lines before its end or a new one)
            if mark == QUOTE_CLOSE and quotes:
                quotes.pop()
            out.append(prefix("").rstrip(" ") if quotes else "")  # (the outer quote's)
            if mark == QUOTE_OPEN:
                quotes.append(len(line) - len(line.lstrip(" ")))
            continue
        if quotes and not line.strip():
            blank = prefix("").rstrip(" ")
            if out and out[-1].replace(">", "").strip():  # (none at its start)
                out.append(blank)
            continue
        out.append(prefix(line).rstrip(" ") if quotes else line)
    return out


__all__ = ["CODE_MARK", "IMAGE_MARK", "QUOTE_CLOSE", "QUOTE_OPEN", "mark_code", "mark_images",
           "mark_page", "mark_tables", "md_text", "outline_markdown"]
