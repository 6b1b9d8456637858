"""RFC 9309 robots.txt parsing and matching for one product token (pure, no I/O).

Theory of operation. :func:`parse` reads a decoded robots.txt once, keeps
only the rules of the groups that apply to our product token (or of the
``*`` groups), and returns a :class:`Group`; :meth:`Group.allowed` answers
for a path+query. The rules followed, and why, are the numbered list in
:mod:`crawler.web.robots`' docstring (rules 1-7); this module is their code.

Both a rule and a URL are brought to one percent-encoding form by
:func:`canon` before they meet, so comparison is plain string work. Matching
is cheap for big files: rules without ``*`` or ``$`` are found by dict
lookups of the target's prefixes at the lengths such rules have (a handful),
and only rules with ``*`` or ``$`` are tried one by one, longest first. A
glob is matched by finding its literal parts left to right (leftmost
placement is optimal when ``*`` is the only operator), so no pattern can make
matching backtrack.

Thread-safety: everything is pure; a Group is immutable once built.
"""

from __future__ import annotations

import math
import re

__all__ = ["TOKEN", "Group", "canon", "parse", "target"]

#: RFC 9309 §2.2.1 product token characters.
TOKEN = re.compile(r"[A-Za-z_-]+")

_EOL = re.compile(r"\r\n|\r|\n")
# Field names after lowercasing and squeezing blanks; the disallow typos are
# ones Google accepts: reading more Disallows is the polite mistake.
_FIELDS = {
    **dict.fromkeys(("user-agent", "useragent", "user agent"), "user-agent"),
    **dict.fromkeys(("crawl-delay", "crawldelay", "crawl delay"), "crawl-delay"),
    **dict.fromkeys(("disallow", "dissallow", "dissalow", "disalow", "diasllow"), "disallow"),
    "allow": "allow",
}
# Characters that stand for themselves in both a rule and a URL: RFC 3986
# unreserved and sub-delims except "*" and "$" (special in rules), ":@/?".
_PLAIN = r"A-Za-z0-9\-._~!&'()+,;=:@/?"
_IS_PLAIN = re.compile(f"[{_PLAIN}]*").fullmatch
_FIX = re.compile(f"%([0-9A-Fa-f]{{2}})?|[^{_PLAIN}]")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# In a query ":", "/", "?" and "@" delimit nothing, so their escapes are decoded.
_QUERY_ESCAPE = re.compile("%(?:3A|2F|3F|40)")
_QUERY_DECODED = {"%3A": ":", "%2F": "/", "%3F": "?", "%40": "@"}
_STARS = re.compile(r"\*+")

Rule = tuple[str, bool, bool]  # (canonical pattern with "*" kept, anchored by "$", allow)
_Special = tuple[int, bool, list[str], bool]  # (length, allow, parts split at "*", anchored)


def _fix(m: re.Match[str]) -> str:
    text = m.group(0)
    if text[0] != "%":  # a character that is encoded, as UTF-8 (a lone surrogate too)
        return "".join(f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass"))
    hexits = m.group(1)
    if hexits is None:
        return "%25"  # a "%" that starts no escape
    char = chr(int(hexits, 16))
    return char if char in _UNRESERVED else "%" + hexits.upper()


def _query_decoded(m: re.Match[str]) -> str:
    return _QUERY_DECODED[m.group()]


def canon(text: str) -> str:
    """``text`` (a path, ``?`` and a query) in the form rules and URLs are compared in."""
    path, sep, query = text.partition("?")
    if not _IS_PLAIN(path):
        path = _FIX.sub(_fix, path)
    if not sep:
        return path
    if not _IS_PLAIN(query):
        query = _FIX.sub(_fix, query)
        if "%" in query:
            query = _QUERY_ESCAPE.sub(_query_decoded, query)
    return f"{path}?{query}"


def target(url: str) -> str:
    """The canonical path+query of an absolute URL, or of a path given alone."""
    if not url.startswith("/"):
        start = url.find("://")
        if start >= 0:
            end = len(url)
            for sep in "/?#":
                i = url.find(sep, start + 3)
                if 0 <= i < end:
                    end = i
            url = url[end:]
    url = url.partition("#")[0]
    if not url.startswith("/"):
        url = "/" + url
    return canon(url)


def _pattern(value: str) -> tuple[str, bool] | None:
    """(canonical pattern, anchored) of a rule value, or None: not a path-pattern."""
    if not value.startswith(("/", "*")):
        return None
    anchored = value.endswith("$")
    if anchored:
        value = value[:-1]
    return "*".join(canon(part) for part in value.split("*")), anchored


def _agent_kind(value: str, token: str) -> str | None:
    """ "ours", "star" or None (another robot) for a User-agent value."""
    if value == "*" or (value.startswith("*") and value[1:2].isspace()):
        return "star"
    match = TOKEN.match(value)
    return "ours" if match is not None and match.group().lower() == token else None


def _field(line: str) -> tuple[str, str] | None:
    """(field name, value) of a non-blank line, or None for unknown fields."""
    key, colon, value = line.partition(":")
    if not colon:
        words = line.split()
        if len(words) != 2:
            return None
        key, value = words
    name = _FIELDS.get(" ".join(key.lower().split()))
    return None if name is None else (name, value.strip())


def sitemap_values(text: str, limit: int) -> tuple[str, ...]:
    """The values of ``text``'s first ``limit`` Sitemap lines, in file order. They
    belong to no group (RFC 9309 §2.2.4), so they count wherever they are."""
    out: list[str] = []
    for raw in _EOL.split(text):
        key, colon, value = raw.partition("#")[0].partition(":")
        value = value.strip()
        if colon and value and key.strip().lower() == "sitemap":
            out.append(value)
            if len(out) >= limit:
                break
    return tuple(out)


def _delay(value: str) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if math.isfinite(delay) and delay >= 0 else None


def parse(text: str, token: str) -> Group:
    """The merged groups of ``text`` that apply to ``token`` (lowercase), else the ``*`` ones.

    A group is a run of User-agent lines and the rules after it; only a rule
    (Allow, Disallow) ends the run, so the next User-agent line starts a new
    group. Crawl-delay is not a rule (RFC 9309 defines none): like Sitemap and
    unknown lines it ends nothing, and it belongs to the group it is in, which
    may still be growing (``User-agent: a / Crawl-delay: 5 / User-agent: b``):
    so a group's delays are handed to its agents when the group ends.
    """
    rules: dict[str, list[Rule]] = {"ours": [], "star": []}
    delays: dict[str, list[float]] = {"ours": [], "star": []}
    named = {"ours": False, "star": False}
    kinds: set[str] = set()  # whom the current group applies to, among us and "*"
    group_delays: list[float] = []  # the current group's valid Crawl-delays, in file order
    in_agents = False
    for raw in _EOL.split(text):
        line = raw.partition("#")[0].strip()
        parsed = _field(line) if line else None
        if parsed is None:
            continue  # blank, comment, Sitemap or unknown: none of them ends a group
        name, value = parsed
        if name == "user-agent":
            if not in_agents:  # after a rule (or at the start): a new group
                for kind in kinds:
                    delays[kind].extend(group_delays)
                kinds, group_delays, in_agents = set(), [], True
            agent = _agent_kind(value, token)
            if agent is not None:
                kinds.add(agent)
                named[agent] = True
        elif name == "crawl-delay":
            delay = _delay(value)
            if delay is not None:
                group_delays.append(delay)
        else:
            in_agents = False  # rules before any User-agent line have no kinds: dropped
            pattern = _pattern(value) if kinds else None
            if pattern is not None:
                for kind in kinds:
                    rules[kind].append((pattern[0], pattern[1], name == "allow"))
    for kind in kinds:
        delays[kind].extend(group_delays)
    kind = "ours" if named["ours"] else "star"
    return Group(rules[kind], delays[kind][0] if delays[kind] else None)


def _glob(parts: list[str], anchored: bool, text: str) -> bool:
    """Whether ``parts`` (a pattern split at ``*``) matches a prefix of ``text``,
    or all of it when ``anchored``."""
    first = parts[0]
    if len(parts) == 1:  # no "*": anchored means the whole text
        return text == first if anchored else text.startswith(first)
    if not text.startswith(first):
        return False
    pos = len(first)
    for part in parts[1:-1]:
        i = text.find(part, pos)
        if i < 0:
            return False
        pos = i + len(part)
    last = parts[-1]
    if anchored:
        return len(text) - len(last) >= pos and text.endswith(last)
    return text.find(last, pos) >= 0


class Group:
    """The rules that apply to us, indexed for longest-match lookups. Immutable."""

    __slots__ = (
        "crawl_delay",
        "rule_count",
        "_plain",
        "_plain_lengths",
        "_special",
        "_special_lengths",
    )

    def __init__(self, rules: list[Rule], crawl_delay: float | None = None) -> None:
        #: Crawl-delay of the selected groups (the first valid one), None if absent.
        self.crawl_delay = crawl_delay
        self.rule_count = len(rules)
        # Plain rules by pattern; rules with "*" or "$" by their literal head
        # (the text before the first "*"), which a target must start with.
        self._plain: dict[str, bool] = {}
        self._special: dict[str, list[_Special]] = {}
        for pattern, anchored, allow in rules:
            if "*" in pattern or anchored:
                parts = _STARS.sub("*", pattern).split("*")
                # A "*" and a final "$" count one octet each in the rule's length.
                rule = (len(pattern) + anchored, allow, parts, anchored)
                self._special.setdefault(parts[0], []).append(rule)
            else:
                self._plain[pattern] = self._plain.get(pattern, False) or allow
        self._plain_lengths = sorted({len(p) for p in self._plain}, reverse=True)
        self._special_lengths = sorted({len(p) for p in self._special}, reverse=True)

    def allowed(self, text: str) -> bool:
        """Whether the canonical path+query ``text`` (see :func:`target`) may be fetched."""
        best, allow = -1, True
        size = len(text)
        for length in self._plain_lengths:
            if length <= size:
                found = self._plain.get(text[:length])
                if found is not None:
                    best, allow = length, found
                    break
        candidates: list[_Special] = []
        for length in self._special_lengths:
            if length <= size:
                candidates.extend(self._special.get(text[:length], ()))
        candidates.sort(key=_longest_allow_first)
        for length, rule_allow, parts, anchored in candidates:
            if length < best or (length == best and (allow or not rule_allow)):
                break  # no rule left can be longer, or win the tie
            if _glob(parts, anchored, text):
                return rule_allow
        return allow


def _longest_allow_first(rule: _Special) -> tuple[int, bool]:
    return -rule[0], not rule[1]
