"""What a user adds to every request: header lines (``--header``) and per-host credentials
from a netrc file (``--netrc``).

Headers are checked once, when given: a name is an HTTP token, a value printable ASCII
(a CR or LF would start another header). Some names are refused, each for a reason the
error gives: the ones the fetcher owns (Host, Accept-Encoding, Connection, framing), the
User-Agent (``--user-agent``: robots.txt groups are matched with it), and credentials
(Authorization, Proxy-Authorization, Cookie): a secret on the command line is seen by
``ps`` and kept in shell history and in the crawl's saved settings. Credentials come
from a netrc file instead, read by each shard when the crawl starts; the file's *path*
is saved, never its content.

A netrc entry (``machine HOST login USER password SECRET``) sends Basic credentials to
that host; with ``account bearer`` it sends ``Authorization: Bearer SECRET``. They go
to that exact host name only (not its subdomains, never to a host it redirects to), and
over https only: over plain http the secret would cross the network in clear. The
``default`` entry is ignored: in a crawl it would hand one secret to every site on the
web. :class:`Credentials` never shows a secret in its ``repr``.
"""

from __future__ import annotations

import base64
import logging
import netrc
import re

from ..config import header_problem
from ..exceptions import ConfigError

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 5.6.2

# Lowercase name -> why --header may not set it.
_REFUSED = {
    "host": "the URL's host is sent",
    "accept-encoding": "the crawler asks for the codings it can decode",
    "connection": "the crawler keeps its connections itself",
    "content-length": "a GET has no body",
    "transfer-encoding": "a GET has no body",
    "te": "the crawler reads what it asks for",
    "upgrade": "the crawler speaks HTTP/1.1",
    "user-agent": "give it with --user-agent (robots.txt groups are matched with it)",
    "authorization": "credentials go in a --netrc file, never on the command line",
    "proxy-authorization": "credentials go in a --netrc file, never on the command line",
    "cookie": "credentials go in a --netrc file, never on the command line",
}


def parse_header(text: str) -> tuple[str, str]:
    """("Name", "value") from "Name: value"; ValueError saying why it cannot be sent."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _TOKEN.fullmatch(name):
        raise ValueError(f"{text[:200]!r}: give a header as 'Name: value' (the name a "
                         "token: letters, digits and !#$%&'*+.^_`|~-)")
    why = _REFUSED.get(name.lower())
    if why:
        raise ValueError(f"{name}: not a header --header sets: {why}")
    problem = header_problem(value)
    if problem:
        raise ValueError(f"{name}: {problem}")
    return name, value


def merge_headers(ours: tuple[tuple[str, str], ...],
                  added: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """``ours`` with the user's ``added`` lines: one of the same name (Accept) replaces
    ours, the rest follow in the order given."""
    names = {n.lower() for n, _ in added}
    return tuple((n, v) for n, v in ours if n.lower() not in names) + added


class Credentials:
    """Host -> the Authorization value to send it over https (see the module docstring)."""

    __slots__ = ("_by_host",)

    def __init__(self, by_host: dict[str, str]) -> None:
        self._by_host = {h.lower().rstrip("."): v for h, v in by_host.items()}

    def __repr__(self) -> str:  # never a secret, in a log line or a traceback
        return f"Credentials({len(self._by_host)} hosts)"

    def __len__(self) -> int:
        return len(self._by_host)

    def header_for(self, scheme: str, host: str) -> str | None:
        """The Authorization value for a request to ``host`` (as in the URL, lowercase),
        or None: an unknown host, or plain http."""
        if scheme != "https" or not self._by_host:
            return None
        return self._by_host.get(host)


def load_netrc(path: str) -> Credentials:
    """The credentials of a netrc file; ConfigError (one line, no secret in it) when the
    file cannot be read or parsed, or an entry cannot be sent."""
    try:
        parsed = netrc.netrc(path)
    except netrc.NetrcParseError as exc:  # its message quotes the bad token: a secret, maybe
        raise ConfigError(f"--netrc {path}: cannot be parsed near line {exc.lineno}: write "
                          "'machine HOST login NAME password SECRET' (a value with a space "
                          "in quotes)") from None
    except OSError as exc:
        raise ConfigError(f"--netrc {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--netrc {path}: not UTF-8 text") from None
    by_host: dict[str, str] = {}
    for host, (login, account, password) in parsed.hosts.items():
        if host == "default":  # netrc keeps `default` under this name
            log.warning("--netrc %s: the default entry is ignored: a crawl would send it "
                        "to every host", path)
            continue
        if (account or "").lower() == "bearer":
            if not password:
                raise ConfigError(f"--netrc {path}: machine {host}: a bearer entry needs "
                                  "its token as the password")
            value = f"Bearer {password}"
        else:
            if not login or ":" in login:
                raise ConfigError(f"--netrc {path}: machine {host}: Basic credentials need a "
                                  "login without ':'")
            token = base64.b64encode(f"{login}:{password}".encode()).decode("ascii")
            value = f"Basic {token}"
        if header_problem(value):
            raise ConfigError(f"--netrc {path}: machine {host}: the secret holds a character "
                              "a header cannot carry (a control character or non-ASCII)")
        by_host[host] = value
    return Credentials(by_host)
