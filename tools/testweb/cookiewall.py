"""The ``cookie_wall`` feature: a page that redirects to itself until a cookie comes back.

A common pattern of real sites (consent and bot walls): ``GET /x/cookie_wall/page``
without the cookie gets ``302 Location: /x/cookie_wall/page`` (itself) with
Set-Cookie; with it, the page. What the server answers without the cookie is
``Node.wall`` (the server picks by the request's Cookie header), so the oracle
tells a crawler with cookies (the page, and the link behind it) from one
without (a self-redirect, nothing behind it) without modelling a jar.

The wall sets four cookies, each a rule of RFC 6265 a test can check in the
request log (``Request.cookie``):

- ``kvwall=1; Path=/x/cookie_wall/; HttpOnly``: host-only, for the wall's pages;
- ``kvsite=1; Domain=<host>; Path=/``: every path of the host (a domain cookie
  for the host and its subdomains: the test web has none);
- ``kvleak=1; Domain=test; Path=/``: a cookie for the public suffix ``test``,
  which a jar must refuse (it would reach every host of the test web);
- ``kvsecure=1; Secure; Path=/``: never sent over plain HTTP.

The page behind the wall sets one more, ``kvseen=1; Max-Age=600;
Path=/x/cookie_wall/`` (a persistent cookie, in the page's own record), and
links ``inside``, which a crawler reaches only through the wall.
"""

from __future__ import annotations

from .faults import Fault
from .model import NOT_FOUND, Node, SiteView
from .render import leaf_page, link_list

NEEDS = "kvwall=1"  # the cookie the page asks for
SEEN = "kvseen=1; Max-Age=600"  # what the page behind the wall sets (its Path: the mount)


def set_cookies(f: Fault, host: str) -> tuple[tuple[str, str], ...]:
    """The Set-Cookie headers of the wall on ``host``."""
    return tuple(("Set-Cookie", value) for value in (
        f"{NEEDS}; Path={f.mount}; HttpOnly",
        f"kvsite=1; Domain={host}; Path=/",
        "kvleak=1; Domain=test; Path=/",
        "kvsecure=1; Secure; Path=/",
    ))


def sends(cookie_header: str | None, pair: str) -> bool:
    """Whether a request's Cookie header holds the cookie ``pair`` ("name=value")."""
    return pair in (p.strip() for p in (cookie_header or "").split(";"))


def cookie_wall(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    m = f.mount
    if rest == "":
        return Node(200, links=(site.url(host, m + "page"),), body=link_list(f.kind, [m + "page"]))
    if rest == "page":
        here = site.url(host, m + "page")
        wall = Node(302, location=here, raw_location=m + "page", html=False, body=b"",
                    headers=set_cookies(f, host), fault=f.kind)
        return Node(200, links=(site.url(host, m + "inside"),), fault=f.kind,
                    body=link_list("behind the cookie wall", [m + "inside"]),
                    headers=(("Set-Cookie", f"{SEEN}; Path={m}"),),
                    needs_cookie=NEEDS, wall=wall)
    if rest == "inside":
        return Node(200, body=leaf_page("inside the cookie wall"))
    return NOT_FOUND
