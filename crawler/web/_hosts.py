"""Host names and IP literals of URLs: rules 6 and 7 of :mod:`crawler.web.urls` (pure, no I/O).

:func:`parse_host` takes the host part of an authority (userinfo and port
already cut off) and returns its canonical form: lowercase ASCII with IDNA
A-labels, one trailing dot dropped, an IPv4 address in dotted decimal;
:func:`parse_ipv6` does the same for the text between ``[`` and ``]``. Both
raise :class:`Bad` with the reason ``host``, which :mod:`crawler.web.urls`
turns into a URLError carrying the caller's URL.

Thread safety: every function is pure.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote

import idna

_LABEL = re.compile(r"[a-z0-9_\-]{1,63}")
_HEX_NUMBER = re.compile(r"0x[0-9a-f]*")  # WHATWG: a last label like this makes an IPv4 host
_MAX_HOST = 253  # DNS: 255 octets on the wire, 253 characters written


class Bad(Exception):
    """Internal: a rejection reason, turned into URLError with the caller's URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_ipv6(text: str) -> str:
    if "%" in text or not text.isascii():  # zone ids have no meaning in a shared URL
        raise Bad("host")
    try:
        return f"[{ipaddress.IPv6Address(text).compressed}]"
    except ValueError:
        raise Bad("host") from None


def parse_host(raw: str) -> str:
    if "%" in raw:
        try:
            raw = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise Bad("host") from None
    if raw.isascii():
        host = raw.lower()
        if "xn--" in host:
            for label in host.split("."):
                if label.startswith("xn--"):
                    _check_alabel(label)
    else:
        host = _idna(raw)
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > _MAX_HOST:
        raise Bad("host")
    labels = host.split(".")
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise Bad("host")
    last = labels[-1]
    if last.isdigit() or _HEX_NUMBER.fullmatch(last):
        return _ipv4(labels)
    return host


def _idna(raw: str) -> str:
    """UTS #46 mapping (non-transitional), then A-labels for the non-ASCII labels."""
    try:
        mapped = idna.uts46_remap(raw, std3_rules=False, transitional=False)
    except (idna.IDNAError, UnicodeError, ValueError):
        raise Bad("host") from None
    labels = []
    for label in mapped.split("."):
        if not label.isascii():
            label = _alabel(label)
        elif label.startswith("xn--"):
            _check_alabel(label)
        labels.append(label)
    return ".".join(labels)


def _alabel(label: str) -> str:
    """The A-label of a mapped non-ASCII label: IDNA 2008, or plain Punycode for
    code points UTS #46 allows and IDNA 2008 does not (what browsers do)."""
    try:
        return idna.alabel(label).decode("ascii")
    except idna.InvalidCodepoint:
        pass
    except (idna.IDNAError, UnicodeError, ValueError):
        raise Bad("host") from None
    try:
        if idna.uts46_remap(label, std3_rules=False, transitional=False) != label:
            raise Bad("host")  # not in mapped form (reached from an xn-- label)
        return "xn--" + label.encode("punycode").decode("ascii")
    except (idna.IDNAError, UnicodeError, ValueError):
        raise Bad("host") from None


def _check_alabel(label: str) -> None:
    """An ``xn--`` label must decode to a valid non-ASCII label that encodes back to it."""
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except UnicodeError:
        raise Bad("host") from None
    if not decoded or decoded.isascii() or _alabel(decoded) != label:
        raise Bad("host")


def _ipv4(labels: list[str]) -> str:
    """WHATWG IPv4 parsing of a host that ends in a number (decimal, 0x hex, 0 octal)."""
    if len(labels) > 4:
        raise Bad("host")
    nums = []
    for part in labels:
        try:
            if part.startswith("0x"):
                n = int(part[2:] or "0", 16)
            elif len(part) > 1 and part.startswith("0"):
                n = int(part[1:], 8)
            else:
                n = int(part, 10)
        except ValueError:
            raise Bad("host") from None
        nums.append(n)
    last = nums.pop()
    if any(n > 255 for n in nums) or last >= 256 ** (4 - len(nums)):
        raise Bad("host")
    value = last
    for i, n in enumerate(nums):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))
