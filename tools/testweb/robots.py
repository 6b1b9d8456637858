"""robots.txt files of the site and an RFC 9309 matcher for the oracle.

Base host ``hi.test`` gets one of four robots.txt styles, by ``i % 4``:

0. ``Disallow: /s2/`` with a longer ``Allow: /s2/p1`` exception (so
   /s2/p1.html and /s2/p17.html are allowed, /s2/p2.html is not) and
   ``Disallow: /s3/*?v=2$`` (a wildcard and an end anchor);
1. ``Crawl-delay`` (the site's ``crawl_delay``) and ``Disallow: /s1/*?v=``,
   which blocks the query variants in /s1/;
2. none at all (404);
3. an empty Disallow for everyone and a group for another robot (``badbot``)
   that disallows everything, which must not apply to us.

The matcher implements RFC 9309: the group whose product token matches the
user agent (case-insensitively) or else ``*``; rules match the path+query as
prefixes with ``*`` and a trailing ``$``; the longest match wins and Allow
wins a tie; no match means allowed. ``Sitemap`` lines belong to no group
(RFC 9309 §2.2.4): ``sitemap_values`` reads them wherever they are, with a
case-insensitive field name; the site adds its ``sitemaps`` feature's lines
after the rules (so a host whose robots.txt would be a 404 serves one then).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from .urls import upper_pct

STYLE_SUBTREE, STYLE_DELAY, STYLE_NONE, STYLE_OPEN = range(4)


def base_robots(index: int, crawl_delay: float) -> str | None:
    """robots.txt text of base host ``index`` (None: the host answers 404)."""
    style = index % 4
    if style == STYLE_SUBTREE:
        return (
            "# testweb: a subtree closed, with an exception\n"
            "User-agent: *\n"
            "Disallow: /s2/\n"
            "Allow: /s2/p1\n"
            "Disallow: /s3/*?v=2$\n"
        )
    if style == STYLE_DELAY:
        delay = int(crawl_delay) if float(crawl_delay).is_integer() else crawl_delay
        return (
            "User-agent: *\n"
            f"Crawl-delay: {delay}\n"
            "Disallow: /s1/*?v=\n"
            "\n"
            "Sitemap: /sitemap.xml\n"
        )
    if style == STYLE_NONE:
        return None
    return "User-agent: badbot\nDisallow: /\n\nUser-agent: *\nDisallow:\n"


@dataclass(slots=True)
class RobotsRules:
    """The parsed group that applies to one user agent."""

    rules: list[tuple[int, bool, re.Pattern[str]]] = field(default_factory=list)
    crawl_delay: float | None = None

    def allowed(self, target: str) -> bool:
        """Whether ``target`` (path plus ``?query``) may be fetched."""
        best_len, best_allow = -1, True
        for length, allow, pattern in self.rules:
            if length < best_len or (length == best_len and not allow):
                continue
            if pattern.match(target):
                if length > best_len or allow:
                    best_len, best_allow = length, allow
        return best_allow


ALLOW_ALL = RobotsRules()
DISALLOW_ALL = RobotsRules([(1, False, re.compile("/"))])


def _compile(value: str) -> re.Pattern[str]:
    value = upper_pct(value)
    anchored = value.endswith("$")
    if anchored:
        value = value[:-1]
    regex = ".*".join(re.escape(part) for part in value.split("*"))
    return re.compile(regex + ("$" if anchored else ""), re.DOTALL)


def sitemap_values(text: str) -> tuple[str, ...]:
    """The values of ``text``'s ``Sitemap:`` lines, as written, in file order."""
    out = []
    for raw in text.splitlines():
        key, colon, value = raw.split("#", 1)[0].partition(":")
        if colon and key.strip().lower() == "sitemap" and value.strip():
            out.append(value.strip())
    return tuple(out)


@lru_cache(maxsize=256)
def parse(text: str, user_agent: str = "*") -> RobotsRules:
    """The rules of ``text`` that apply to ``user_agent`` (RFC 9309 group selection)."""
    ua = user_agent.lower()
    groups: dict[str, RobotsRules] = {}
    current: list[str] = []
    in_agents = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" not in line:
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        key = key.lower()
        if key == "user-agent":
            if not in_agents:
                current = []
            in_agents = True
            current.append(value.lower())
            for agent in current:
                groups.setdefault(agent, RobotsRules())
            continue
        in_agents = False
        if not current:
            continue
        for agent in current:
            rules = groups[agent]
            if key in ("allow", "disallow") and value:
                rules.rules.append((len(value), key == "allow", _compile(value)))
            elif key == "crawl-delay":
                try:
                    rules.crawl_delay = float(value)
                except ValueError:
                    pass
    if ua != "*" and ua in groups:
        return groups[ua]
    return groups.get("*", ALLOW_ALL)
