"""The hostile-web fault catalog: what can be switched on, where, with which knobs.

Three groups of faults (the exact behaviour of each is in docs/TESTWEB.md):

- *response* faults change how the URLs under ``prefix`` on ``host`` are
  answered. Without a prefix they get their own leaf pages ``/x/<kind>/1``
  and ``/x/<kind>/2`` on ``host`` (default ``h0.test``), linked from the
  host's ``/x/`` index, so the base graph keeps its shape.
- *feature* faults add a small subtree ``/x/<kind>/`` of hostile pages to
  ``host`` (redirect loops, a spider trap, odd links, links only scripts
  add, pages only sitemaps list, a short and a long path to one page, ...).
  ``sitemaps`` also gives its host a ``/sitemap.xml`` and ``Sitemap:`` lines
  in its robots.txt.
- *host* faults break a whole host: its DNS, its port, its robots.txt or its
  certificate. Without ``host`` they get a dedicated extra host (for example
  ``refused.test``) linked from ``h0.test/x/``; with ``host`` they break that
  host of the site.

Every fault is part of the site, so the oracle knows about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Param = float | int | str | bool | tuple[int, ...]

RESPONSE, FEATURE, HOST = "response", "feature", "host"
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    group: str
    defaults: Mapping[str, Param]
    # Response faults only: whether the crawler can read the page's links (the
    # oracle follows them) or gets an error / a link-free body (a leaf).
    keeps_links: bool = False
    extra_host: str | None = None  # host faults: the dedicated host's name
    tls: bool = False  # the dedicated host is served over HTTPS
    in_all: bool = True  # part of hostile() and ``--fault all`` (False: only by name)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("slow_first_byte", RESPONSE, {"delay": 2.0}, keeps_links=True),
        Kind("slow_drip", RESPONSE, {"interval": 0.05, "size": 200}),
        Kind("reset", RESPONSE, {"after": 512, "size": 10_000}),
        Kind("huge_body", RESPONSE, {"size": 256 * MIB, "chunked": False}),
        Kind("gzip_bomb", RESPONSE, {"size": 128 * MIB}),
        Kind("br_bomb", RESPONSE, {"size": 128 * MIB}, in_all=False),
        Kind("zstd_bomb", RESPONSE, {"size": 128 * MIB}, in_all=False),
        # gzip-encoded, decoding to ``size`` bytes of ``byte`` (255: invalid UTF-8)
        Kind("nul_body", RESPONSE, {"size": 20 * MIB, "byte": 0}, in_all=False),
        Kind("status_429", RESPONSE, {"retry_after": 1, "times": 1}, keeps_links=True),
        Kind("status_503", RESPONSE, {"retry_after": 1, "times": 1}, keeps_links=True),
        Kind("status_500", RESPONSE, {}),
        Kind("wrong_type", RESPONSE, {"content_type": "text/plain"}),
        Kind("redirects", FEATURE, {"hops": 10}),
        Kind("binary", FEATURE, {}),
        Kind("charsets", FEATURE, {}),
        Kind("malformed", FEATURE, {"depth": 20_000}),
        Kind("base_href", FEATURE, {}),
        Kind("link_schemes", FEATURE, {}),
        Kind("long_urls", FEATURE, {"lengths": (2_000, 8_000, 70_000)}),
        Kind("spider_trap", FEATURE, {"start": "2024-01"}),
        Kind("meta_robots", FEATURE, {}),
        Kind("idn", FEATURE, {"name": "bücher.test"}),
        Kind("scripts", FEATURE, {"delay_ms": 300}),
        Kind("sitemaps", FEATURE, {}),
        Kind("shortcut", FEATURE, {"chain": 4, "length": 12}, in_all=False),
        Kind("cookie_wall", FEATURE, {}, in_all=False),
        Kind("refused", HOST, {}, extra_host="refused.test"),
        Kind("nxdomain", HOST, {}, extra_host="nx.test"),
        Kind("dns_servfail", HOST, {}, extra_host="servfail.test"),
        Kind("dns_timeout", HOST, {}, extra_host="dnstimeout.test"),
        Kind("dns_slow", HOST, {"delay": 1.0}, extra_host="dnsslow.test"),
        Kind("robots_5xx", HOST, {"status": 503}, extra_host="robots5xx.test"),
        Kind("robots_huge", HOST, {"size": 2 * MIB}, extra_host="robotshuge.test"),
        Kind("robots_garbage", HOST, {}, extra_host="robotsgarbage.test"),
        Kind("robots_slow", HOST, {"delay": 1.0}, extra_host="robotsslow.test"),
        Kind("bad_cert", HOST, {}, extra_host="badcert.test", tls=True),
    )
}

# A served host outside the h*.test family: the target of the out-of-scope redirect.
OUT_HOST = "out.test"
HUB_HOST = "h0.test"  # where dedicated hosts are linked from and faults go by default


@dataclass(frozen=True, slots=True)
class Fault:
    """One opted-in fault. Build it with :func:`fault`, which checks the knobs."""

    kind: str
    host: str | None = None
    prefix: str | None = None
    params: tuple[tuple[str, Param], ...] = ()

    @property
    def spec(self) -> Kind:
        return KINDS[self.kind]

    def get(self, name: str) -> Param:
        for key, value in self.params:
            if key == name:
                return value
        return self.spec.defaults[name]

    def num(self, name: str) -> float:
        value = self.get(name)
        assert isinstance(value, int | float)
        return float(value)

    @property
    def mount(self) -> str:
        """Where the fault's own pages live (response and feature faults)."""
        return f"/x/{self.kind}/"

    @property
    def dedicated(self) -> bool:
        """Whether the fault brings its own pages or host instead of changing existing ones."""
        if self.spec.group == RESPONSE:
            return self.prefix is None
        if self.spec.group == HOST:
            return self.host is None
        return True

    @property
    def where(self) -> str:
        """The host the fault lives on."""
        if self.host is not None:
            return self.host
        return self.spec.extra_host or HUB_HOST


def fault(kind: str, host: str | None = None, prefix: str | None = None, **params: Param) -> Fault:
    """An opted-in fault: ``fault("slow_first_byte", host="h1.test", prefix="/s0/", delay=0.5)``."""
    return _build(kind, host, prefix, params)


def _build(kind: str, host: str | None, prefix: str | None, params: Mapping[str, Param]) -> Fault:
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(sorted(KINDS))}")
    spec = KINDS[kind]
    unknown = set(params) - set(spec.defaults)
    if unknown:
        raise ValueError(f"fault {kind!r} has no parameter(s) {sorted(unknown)}")
    if prefix is not None:
        if spec.group != RESPONSE:
            raise ValueError(f"fault {kind!r} is a {spec.group} fault and takes no prefix")
        if not prefix.startswith("/"):
            raise ValueError(f"prefix must start with '/', got {prefix!r}")
    if host is not None:
        host = host.lower()
    return Fault(kind, host, prefix, tuple(sorted(params.items())))


def hostile(exclude: Iterable[str] = (), **params: Mapping[str, Param]) -> tuple[Fault, ...]:
    """Every fault in its dedicated form, except ``exclude``; ``params`` maps kind -> knobs."""
    skip = set(exclude)
    return tuple(
        _build(k, None, None, params.get(k, {}))
        for k, kind in KINDS.items() if kind.in_all and k not in skip
    )


def parse_cli(specs: Iterable[str]) -> tuple[Fault, ...]:
    """Faults from command-line words ``kind[@host][/prefix][:knob=value,...]`` or ``all``."""
    out: list[Fault] = []
    for spec in specs:
        if spec == "all":
            out.extend(hostile())
            continue
        head, _, knobs = spec.partition(":")
        where, slash, prefix = head.partition("/")
        kind, _, host = where.partition("@")
        params: dict[str, Param] = {}
        for item in filter(None, knobs.split(",")):
            key, _, raw = item.partition("=")
            params[key] = _parse_value(raw)
        out.append(_build(kind, host or None, slash + prefix if slash else None, params))
    return tuple(out)


def _parse_value(raw: str) -> Param:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw
