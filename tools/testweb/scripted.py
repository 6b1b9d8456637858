"""The ``scripts`` feature: pages whose links appear only after JavaScript runs.

Everything lives under ``/x/scripts/`` on the fault's host. Each page's
server HTML links only what ``Node.links`` says; the links its scripts add
to the DOM are ``Node.script_links``, and the URLs the browser requests while
running them (``app.js``, ``data.json``) are ``Node.subresources``. So a
plain crawler gets ``links``, a rendering one ``links + script_links``, and
the oracle tells the two apart without running any script.

Every href, script ``src`` and ``fetch()`` argument is relative to the page
(``/x/scripts/<page>``), so the scripts resolve them against the document
URL exactly as the canonical URLs here are built. ``endless.html`` and
``hog.html`` run forever or until the tab dies: they add no links, and the
link written in their server HTML before the script is the one to find.
"""

from __future__ import annotations

import json

from .faults import Fault
from .model import NOT_FOUND, Node, SiteView
from .render import leaf_page, link_list

JS = "text/javascript"
JSON = "application/json"

PAGES = ("inline.html", "timeout.html", "fetch.html", "external.html", "endless.html", "hog.html")
FETCHED = ("t/fetch-1.html", "t/fetch-2.html")  # the links data.json holds

# Appends one <a href> to the body; the scripts below build their links with it.
_ADD = (
    "function addLink(href) {\n"
    "  var a = document.createElement('a');\n"
    "  a.href = href;\n"
    "  a.textContent = href;\n"
    "  var p = document.createElement('p');\n"
    "  p.appendChild(a);\n"
    "  document.body.appendChild(p);\n"
    "}\n"
)


def app_js() -> bytes:
    """The external script of ``external.html``."""
    return (_ADD + "addLink('t/external.html');\n").encode()


def data_json() -> bytes:
    """What ``fetch.html``'s script fetches."""
    return (json.dumps({"links": list(FETCHED)}) + "\n").encode()


def _scripts(f: Fault) -> dict[str, tuple[list[str], str, list[str], list[str]]]:
    """page -> (server hrefs, <script> markup, script-only hrefs, subresource names)."""
    delay = int(f.num("delay_ms"))
    return {
        "inline.html": (
            ["t/plain.html"],
            f"<script>\n{_ADD}addLink('t/inline.html');\n</script>",
            ["t/inline.html"], [],
        ),
        "timeout.html": (
            [],
            f"<script>\n{_ADD}setTimeout(function () {{ addLink('t/timeout.html'); }}, {delay});"
            "\n</script>",
            ["t/timeout.html"], [],
        ),
        "fetch.html": (
            [],
            f"<script>\n{_ADD}fetch('data.json')\n"
            "  .then(function (r) { return r.json(); })\n"
            "  .then(function (d) { d.links.forEach(addLink); });\n</script>",
            list(FETCHED), ["data.json"],
        ),
        "external.html": ([], '<script src="app.js"></script>', ["t/external.html"], ["app.js"]),
        "endless.html": (["t/after-endless.html"], "<script>for(;;){}</script>", [], []),
        "hog.html": (
            ["t/after-hog.html"],
            # Keep every block reachable from a global, so nothing can be collected.
            "<script>\nwindow.hog = [];\n"
            "for (;;) { window.hog.push(new Array(1 << 20).fill(window.hog.length)); }\n"
            "</script>",
            [], [],
        ),
    }


def _targets(scripts: dict[str, tuple[list[str], str, list[str], list[str]]]) -> set[str]:
    return {t for server, _, script, _ in scripts.values() for t in server + script}


def scripts(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    """What ``/x/scripts/<rest>`` answers on ``host``."""
    m = f.mount

    def canon(names: list[str]) -> tuple[str, ...]:
        return tuple(site.url(host, m + n) for n in names)

    if rest == "":
        return Node(200, links=canon(list(PAGES)), body=link_list("scripts", list(PAGES)))
    table = _scripts(f)
    page = table.get(rest)
    if page is not None:
        server, script, script_only, subs = page
        body = link_list(f"scripts {rest}", server).replace(
            b"</body>", script.encode() + b"\n</body>", 1
        )
        return Node(200, links=canon(server), script_links=canon(script_only),
                    subresources=canon(subs), body=body)
    if rest == "app.js":
        return Node(200, html=False, content_type=JS, body=app_js())
    if rest == "data.json":
        return Node(200, html=False, content_type=JSON, body=data_json())
    if rest in _targets(table):
        return Node(200, body=leaf_page(f"scripts target {rest}"))
    return NOT_FOUND
