"""``start``'s options: one table, the parser built from it, and the merge of what was
given with the settings the crawl saved (crawler.state.settings).

Every saved option is parsed with no default (argparse.SUPPRESS), so the CLI
knows which ones the user typed: the merge is defaults, then the saved
settings, then the options given now. The defaults shown by ``--help`` come
from the same table.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from .. import config as cfgmod
from ..config import MAX_SECONDS
from ..exceptions import ConfigError, DataDirError, UsageError
from ..net import proxy as netproxy
from ..net.auth import parse_header
from ._common import SAVED_AS, age, count, number, size, size_in


def nameserver(value: str) -> str:
    """IP[:PORT], checked and written back as IP:PORT."""
    host, _, port = value.partition(":")
    try:
        number = int(port or 53)
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"bad nameserver {value!r}: use IP or IP:PORT")
    return f"{host}:{number}"


def split_nameserver(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def whole(minimum: int, maximum: int = cfgmod.MAX_COUNT) -> Any:
    """A whole number from ``minimum`` to ``maximum`` (docs/BOUNDS.md)."""
    return count(minimum, maximum)


def sitemap_mode(value: str) -> str:
    if value not in cfgmod.SITEMAP_MODES:
        raise argparse.ArgumentTypeError(
            f"not a sitemap mode: {value!r} (give {', '.join(cfgmod.SITEMAP_MODES)})"
        )
    return value


def request_header(value: str) -> str:
    """One --header line, checked (crawler.net.auth) and written back as 'Name: value'."""
    try:
        name, text = parse_header(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{name}: {text}"


def header_value(value: str) -> str:
    """A value sent as an HTTP header (--user-agent): printable ASCII."""
    problem = cfgmod.header_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{value[:200]!r}: {problem}")
    return value


def proxy_value(value: str) -> str:
    """A --proxy value, [TARGET=]URL or [TARGET=]none (crawler.net.proxy), kept as typed."""
    try:
        netproxy.parse_option(value)
    except ConfigError as exc:  # its message never holds the credentials
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _saved_proxy(value: str) -> str:
    """A --proxy value as settings.json keeps it: credentials it had are ``***``."""
    return proxy_value(value.replace(f"://{netproxy.REDACTED}@", "://", 1))


# The type of each item of a repeatable option (str when not here); a saved one's check.
_ITEMS: dict[str, Any] = {"nameserver": nameserver, "proxy": proxy_value,
                          "header": request_header}
_SAVED_ITEMS: dict[str, Any] = {**_ITEMS, "proxy": _saved_proxy}


# Seconds: a wait (0 is none) or a timeout (more than 0), at most a day (config.MAX_SECONDS).
seconds = number(0, MAX_SECONDS)
timeout = number(0, MAX_SECONDS, above=True)
_BYTES = size_in(1, cfgmod.MAX_BODY_BYTES)


@dataclass(frozen=True)
class Opt:
    name: str  # the argparse dest and the key in settings.json
    flag: str
    kind: Any  # the argparse type, "bool" (--x/--no-x) or "list" (repeatable)
    default: Any
    help: str
    metavar: str | None = None
    group: str = "crawl"


# The saved options. Not here (given for one run only): the seeds, --seeds-file,
# --data, --processes (shards.json keeps it), --max-pages, --quiet.
OPTIONS: tuple[Opt, ...] = (
    Opt("threads", "--threads", whole(1), cfgmod.DEFAULT_THREADS,
        "fetch threads in all (split over the processes; at most 10,000 a process)", "N"),
    Opt("delay", "--delay", seconds, cfgmod.DEFAULT_DELAY,
        "seconds between two requests to one host", "S"),
    Opt("per_host", "--per-host", whole(1, cfgmod.MAX_THREADS_PER_SHARD), cfgmod.DEFAULT_PER_HOST,
        "connections to one host at a time", "N"),
    Opt("timeout", "--timeout", timeout, cfgmod.DEFAULT_TOTAL_TIMEOUT,
        "total seconds for one fetch, connect to last byte", "S"),
    Opt("nameserver", "--nameserver", "list", [],
        "DNS server to ask, repeatable (default: the system's resolvers)", "IP[:PORT]"),
    Opt("allow_private_ips", "--allow-private-ips", "bool", False,
        "fetch hosts that resolve to private or loopback addresses "
        "(off by default to protect your network)"),
    Opt("ca_bundle", "--ca-bundle", str, None,
        "CA certificates (PEM) to verify HTTPS against (default: the system's)", "FILE"),
    Opt("proxy", "--proxy", "list", [],
        "fetch through this proxy: http://, https:// (for http targets), socks5:// or "
        "socks5h://HOST:PORT, with USER:PASSWORD@ if it needs them (never saved: give them "
        "again on a resume); http=URL or https=URL for one target scheme, none for none; "
        "repeatable (docs/CRAWLING.md, Proxies)", "[TARGET=]URL"),
    Opt("user_agent", "--user-agent", header_value, cfgmod.DEFAULT_USER_AGENT,
        "the User-Agent sent, and the name robots.txt groups are matched with", "STRING"),
    Opt("header", "--header", "list", [],
        "a header sent with every request, repeatable; one named like ours (Accept) "
        "replaces it; credentials go in --netrc", "'NAME: VALUE'"),
    Opt("netrc", "--netrc", str, None,
        "credentials per host (Basic, or Bearer with 'account bearer'), sent to that host "
        "over https only; the file is read at each start, never copied", "FILE"),
    Opt("http2", "--http2", "bool", False,
        "offer HTTP/2 to https hosts (ALPN; a host that declines gets HTTP/1.1); one "
        "request at a time on a connection, so --per-host still bounds what is in flight"),
    Opt("ignore_robots", "--ignore-robots", "bool", False, "do not fetch or obey robots.txt"),
    Opt("cookies", "--cookies", "bool", cfgmod.DEFAULT_COOKIES,
        "keep the cookies servers set (RFC 6265, per shard, bounded) and send each back "
        "only to the hosts it was set for; --no-cookies sends none (docs/CRAWLING.md)"),
    Opt("broad", "--broad", "bool", False,
        "follow links to any host (default: the seeds' hosts only)", group="scope"),
    Opt("allow_domain", "--allow-domain", "list", [],
        "also follow links to this domain and its subdomains, repeatable", "DOMAIN", "scope"),
    Opt("allow_regex", "--allow-regex", "list", [],
        "only admit URLs matching one of these, repeatable", "REGEX", "scope"),
    Opt("deny_regex", "--deny-regex", "list", [],
        "never admit URLs matching one of these, repeatable", "REGEX", "scope"),
    Opt("store_types", "--store-types", "list", [],
        "keep the bodies of these non-HTML media types too, for an archiving crawl "
        "(application/pdf, image/*, or * for all; repeatable or comma-separated; "
        "default: HTML bodies only)", "TYPE", "scope"),
    Opt("sitemaps", "--sitemaps", sitemap_mode, cfgmod.DEFAULT_SITEMAPS,
        "read sitemaps for URLs no link reaches: all (robots.txt's Sitemap lines and "
        "/sitemap.xml), robots (the lines only) or off; their URLs enter at depth 1 "
        "(docs/SITEMAPS.md)", "MODE", "scope"),
    Opt("max_depth", "--max-depth", whole(0, cfgmod.MAX_DEPTH), None,
        "seeds are depth 0, each link adds 1 (default: no limit)", "N", "scope"),
    Opt("max_pages_per_host", "--max-pages-per-host", whole(0), None,
        "fetches per host (default: no limit)", "N", "scope"),
    Opt("revisit_after", "--revisit-after", age, None,
        "keep crawling: a fetched page is fetched again (a conditional GET) AGE after, "
        "sooner when it changed, later when not, within AGE/4 .. 8 AGE; the crawl runs "
        "until stopped (90s, 30m, 12h, 7d; 0: off; docs/RETRY.md)", "AGE", "run"),
    Opt("sync_interval", "--sync-interval", seconds, cfgmod.DEFAULT_SYNC_INTERVAL,
        "seconds between fsyncs (what a power loss can cost)", "S", "run"),
    Opt("status_interval", "--status-interval", seconds, cfgmod.DEFAULT_STATUS_INTERVAL,
        "seconds between status lines and status.json writes", "S", "run"),
    Opt("render_js", "--render-js", "list", [],
        "render the HTML pages of hosts matching this regex in headless Chromium, for the "
        "links scripts make (repeatable; docs/RENDER.md)", "REGEX", "render"),
    Opt("render_all", "--render-js-all", "bool", False,
        "render every HTML page in headless Chromium", group="render"),
    Opt("render_tabs", "--render-tabs", whole(1, cfgmod.MAX_RENDER_TABS),
        cfgmod.DEFAULT_RENDER_TABS, "pages rendered at a time", "N", "render"),
    Opt("render_timeout", "--render-timeout", timeout, cfgmod.DEFAULT_RENDER_TIMEOUT,
        "seconds a page may take to settle; longer renders are cut", "S", "render"),
    Opt("render_memory", "--render-memory",
        whole(cfgmod.MIN_RENDER_MEMORY, cfgmod.MAX_RENDER_MEMORY), cfgmod.DEFAULT_RENDER_MEMORY,
        "MiB of JavaScript heap a tab may use; past it the render is cut", "MIB", "render"),
    Opt("render_browser", "--render-browser", str, cfgmod.DEFAULT_RENDER_BROWSER,
        "the Chromium executable (a name on PATH or a path)", "PATH", "render"),
) + tuple(
    Opt(field, flag, kind, getattr(cfgmod, "DEFAULT_" + field.upper()), text,
        "BYTES" if kind in (_BYTES, size) else "N" if getattr(kind, SAVED_AS) == (int,) else "S",
        "limits")
    for flag, kind, field, text in (
        ("--connect-timeout", timeout, "connect_timeout", "seconds for a TCP connect plus TLS"),
        ("--read-timeout", timeout, "read_timeout", "seconds one socket read may wait"),
        ("--dns-timeout", timeout, "dns_timeout", "seconds for one host lookup, retries included"),
        ("--max-retries", whole(0, cfgmod.MAX_RETRIES), "max_retries",
         "further tries after a transient failure"),
        ("--backoff", seconds, "backoff", "seconds a host waits after a failure (doubles)"),
        ("--max-retry-after", seconds, "max_retry_after", "cap on Retry-After and backoff"),
        ("--max-crawl-delay", seconds, "max_crawl_delay", "cap on a robots.txt Crawl-delay"),
        ("--bad-host-retry", seconds, "bad_host_retry", "seconds before a dead host is retried"),
        ("--max-redirects", whole(0, cfgmod.MAX_REDIRECTS), "max_redirects",
         "redirect hops followed from one URL"),
        ("--max-url-length", whole(cfgmod.MIN_URL_LENGTH, cfgmod.MAX_URL_LENGTH),
         "max_url_length", "longer links are dropped"),
        ("--max-body-bytes", _BYTES, "max_body_bytes", "body bytes read off the wire"),
        ("--max-decoded-bytes", _BYTES, "max_decoded_bytes", "body after gzip/deflate"),
        ("--memory-budget", size, "memory_budget",
         "bytes of bodies and parse buffers a process holds at once; fetches wait "
         "beyond it (default: twice what one page may hold with its parse, from "
         "--max-decoded-bytes: 165M with the defaults)"),
    )
)
BY_NAME = {o.name: o for o in OPTIONS}
DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS}

_GROUPS = {
    "scope": "what to crawl",
    "run": "running",
    "render": "JavaScript rendering (docs/RENDER.md)",
    "limits": "limits (docs/HOSTILE.md says what each bounds)",
}


def _shown(opt: Opt) -> str:
    if opt.kind == "bool":
        return f"{opt.help} (default: {'on' if opt.default else 'off'})"
    if opt.default is None or opt.default == [] or "(default" in opt.help:
        return opt.help
    return f"{opt.help} (default: {opt.default})"


def add_options(parser: argparse.ArgumentParser) -> None:
    """The saved options, in their groups, each with no default (see the module doc)."""
    groups: dict[str, Any] = {"crawl": parser}
    for key, title in _GROUPS.items():
        groups[key] = parser.add_argument_group(title)
    for opt in OPTIONS:
        target = groups[opt.group]
        common: dict[str, Any] = dict(dest=opt.name, default=argparse.SUPPRESS, help=_shown(opt))
        if opt.kind == "bool":
            target.add_argument(opt.flag, action=argparse.BooleanOptionalAction, **common)
        elif opt.kind == "list":
            kind = _ITEMS.get(opt.name, str)
            target.add_argument(opt.flag, action="append", type=kind, metavar=opt.metavar, **common)
        else:
            target.add_argument(opt.flag, type=opt.kind, metavar=opt.metavar, **common)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The saved options typed on this command line (absolute paths for files)."""
    given = {o.name: getattr(args, o.name) for o in OPTIONS if hasattr(args, o.name)}
    for name in ("ca_bundle", "netrc"):
        if given.get(name):
            given[name] = os.path.abspath(given[name])
    return given


def check_saved(saved: dict[str, Any], path: str) -> None:
    """Refuse a saved value this command line would refuse (a wrong type, out of its
    range, a header value with a control character): DataDirError naming ``path`` (the
    settings file) and the setting. Names of other versions are left alone."""
    for name, value in saved.items():
        opt = BY_NAME.get(name)
        problem = _saved_problem(opt, value) if opt is not None else None
        if problem:
            raise DataDirError(f"{path}: setting {name!r}: {problem}: fix or delete it")


def _saved_problem(opt: Opt, value: Any) -> str | None:
    brief = repr(value)[:100]
    if value is None:
        return None if opt.default is None else f"null, where {opt.flag} needs a value"
    if opt.kind == "bool":
        return None if isinstance(value, bool) else f"{brief} is not true or false"
    if opt.kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"{brief} is not a list of strings"
        try:
            for item in value:
                _SAVED_ITEMS.get(opt.name, str)(item)
        except argparse.ArgumentTypeError as exc:
            return str(exc)
        return None
    types = getattr(opt.kind, SAVED_AS, (str,))
    if isinstance(value, bool) or not isinstance(value, types):
        kind = "a whole number" if types == (int,) else "a number" if int in types else "a string"
        return f"{brief} is not {kind}"
    try:
        opt.kind(value if isinstance(value, str) else repr(value))
    except argparse.ArgumentTypeError as exc:
        return str(exc)
    return None


def merge(saved: dict[str, Any] | None, given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The settings to run with, and one line per saved value that ``given`` changes.
    Names the saved file does not know (from another version) are ignored."""
    saved = {k: v for k, v in (saved or {}).items() if k in BY_NAME}
    merged = {**DEFAULTS, **saved, **given}
    changes = [
        f"{BY_NAME[k].flag} {_text(saved.get(k, DEFAULTS[k]))} -> {_text(v)}"
        for k, v in saved_form(given).items()
        if saved and v != saved.get(k, DEFAULTS[k])
    ]
    return merged, changes


def saved_form(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` as they may be written and logged: --proxy's credentials as ``***``."""
    if not settings.get("proxy"):
        return settings
    return {**settings, "proxy": [netproxy.redact(v) for v in settings["proxy"]]}


def check_proxies(settings: dict[str, Any]) -> None:
    """UsageError when the merged --proxy values cannot be used: a saved one whose
    credentials were left out of settings.json, and no --proxy given now."""
    try:
        netproxy.proxy_map(settings["proxy"])
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    return "(none)" if value is None else str(value)


def config_fields(settings: dict[str, Any]) -> dict[str, Any]:
    """CrawlerConfig's keyword arguments for the merged settings."""
    s = dict(settings)
    out: dict[str, Any] = {
        "nameservers": tuple(split_nameserver(n) for n in s.pop("nameserver")),
        "obey_robots": not s.pop("ignore_robots"),
        "total_timeout": s.pop("timeout"),
        "allow_domains": tuple(s.pop("allow_domain")),
        "allow_regex": tuple(s.pop("allow_regex")),
        "deny_regex": tuple(s.pop("deny_regex")),
        "render_js": tuple(s.pop("render_js")),
        "headers": tuple(parse_header(h) for h in s.pop("header")),
        "proxy": tuple(s.pop("proxy")),
        "store_types": tuple(
            t.strip().lower() for item in s.pop("store_types") for t in item.split(",") if t.strip()
        ),
    }
    out.update(s)
    return out
