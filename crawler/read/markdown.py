"""``export --markdown DIR``: one Markdown file per page, its main content, for people and
for language models.

Each fetched page (status 200, a text body, not ``noindex``: a page that asked not to be
indexed is not handed on) becomes ``DIR/<host>/<url key>.md``: YAML front matter (the
title, the source URL, the fetch time, the language, each a JSON string, which YAML
reads as it is), then the page's main content as Markdown (crawler.read.pagetext:
boilerplate removed, headings, paragraphs, code, links resolved). The file name is the
URL's md5 (crawler.web.urls.url_key): no name a page chooses reaches the disk, and two
URLs never share a file. ``<host>`` is the lowercase host name, characters other than
letters, digits, ``.`` and ``-`` replaced by ``_``. ``DIR/index.jsonl`` says which file
is which page: one JSON object a file, ``{"url", "title", "file"}`` (``file`` relative
to ``DIR``), in the order written.

All or nothing, like the rest of export: the files go into ``DIR.part`` (which must not
exist), renamed to ``DIR`` (which must not exist either) at the end; a failed or
interrupted export removes ``DIR.part``.

Thread safety: for one thread.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import NamedTuple

from ..exceptions import ConfigError
from ..state.pages import PageRecord
from ..web.urls import host_of, url_key
from .htmlbounds import DEFAULT_BOUNDS, ReadBounds
from .listing import iso_time
from .pagetext import detect_language, page_text, read_markdown

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^a-z0-9.-]")
INDEX = "index.jsonl"  # which file is which page


def front_matter(page: PageRecord, title: str, lang: str) -> str:
    fields = {"title": title, "url": page.url, "fetched": iso_time(page.fetched_at),
              "lang": lang}
    return "---\n" + "".join(f"{k}: {json.dumps(v, ensure_ascii=False)}\n"
                             for k, v in fields.items()) + "---\n\n"


class MarkdownFile(NamedTuple):
    text: str  # the whole file: front matter and Markdown
    plain: str  # why it is the page's whole text, not its main content ("": it is not)
    title: str


def markdown_file(page: PageRecord, *,
                  bounds: ReadBounds = DEFAULT_BOUNDS) -> MarkdownFile | None:
    """The file for ``page``; None for a page that is not written (see the module
    docstring). Read within ``bounds`` (crawler.read.htmlbounds)."""
    if page.status != 200 or page.noindex:
        return None
    md = read_markdown(page, bounds=bounds)
    if md is None:
        return None
    read = page_text(page, text_limit=5_000, bounds=bounds)  # its <title> and language
    if read is None:
        return MarkdownFile(front_matter(page, "", detect_language(md.text)) + md.text,
                            md.plain, "")
    return MarkdownFile(front_matter(page, read.title, read.lang) + md.text,
                        md.plain or read.plain, read.title)


class MarkdownSink:
    def __init__(self, directory: str | os.PathLike[str], *,
                 bounds: ReadBounds = DEFAULT_BOUNDS) -> None:
        self.directory = os.fspath(directory)
        self.part = self.directory + ".part"
        self.bounds = bounds
        self.files = self.bytes = self.skipped = 0
        self.plain = 0  # files of a page's whole text, not its main content (bounds)
        self.done = False
        if os.path.lexists(self.directory):
            raise ConfigError(f"--markdown {self.directory}: it exists; give a new directory")
        self._made = False
        try:
            os.mkdir(self.part)
        except FileExistsError:
            raise ConfigError(f"--markdown: {self.part} exists (an export stopped by a "
                              "crash?); remove it first") from None
        self._made = True
        self._hosts: set[str] = set()
        self._index = open(os.path.join(self.part, INDEX), "w", encoding="utf-8")

    def write(self, page: PageRecord) -> None:
        made = markdown_file(page, bounds=self.bounds)
        if made is None:
            self.skipped += 1
            return
        self.plain += bool(made.plain)
        host = _UNSAFE.sub("_", host_of(page.url).lower()) or "_"
        folder = os.path.join(self.part, host)
        if host not in self._hosts:
            os.makedirs(folder, exist_ok=True)
            self._hosts.add(host)
        data = made.text.encode("utf-8")
        name = url_key(page.url).hex() + ".md"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        self._index.write(json.dumps({"url": page.url, "title": made.title,
                                      "file": f"{host}/{name}"}, ensure_ascii=False) + "\n")
        self.files += 1
        self.bytes += len(data)

    def close(self, *, complete: bool = True) -> None:
        """Rename ``DIR.part`` to ``DIR``; with ``complete`` False remove it. Idempotent."""
        if not self._made or self.done:
            return
        self._index.close()
        if complete:
            os.rename(self.part, self.directory)
            self.done = True
            log.info("export: wrote %s (%s Markdown files, %s bytes)", self.directory,
                     f"{self.files:,}", f"{self.bytes:,}")
        else:
            shutil.rmtree(self.part, ignore_errors=True)
            self._made = False
            log.info("export: removed %s", self.part)


__all__ = ["INDEX", "MarkdownFile", "MarkdownSink", "markdown_file"]
