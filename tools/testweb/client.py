"""A requests adapter that connects to a resolved loopback IP, the way the
crawler must: the URL keeps its host name, which goes into the Host header
and the TLS SNI and certificate check, while the TCP connection goes to the
address our resolver gave. Used by the tests and the load tool."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import dns.exception
import dns.resolver
import requests
from requests.adapters import HTTPAdapter

Resolve = Callable[[str], str]


class LoopbackAdapter(HTTPAdapter):
    """Sends each request to ``resolve(host)``, keeping Host, SNI and hostname checks."""

    def __init__(self, resolve: Resolve, **kwargs: Any) -> None:
        self._resolve = resolve
        super().__init__(**kwargs)

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: bool | str, cert: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        name = host_params["host"]
        host_params["host"] = self._resolve(name)
        if host_params["scheme"] == "https":
            pool_kwargs["server_hostname"] = name
            pool_kwargs["assert_hostname"] = name
        return host_params, pool_kwargs

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        # Always from the URL: requests copies headers into redirected requests.
        request.headers["Host"] = urlsplit(request.url or "").netloc
        return super().send(request, stream, timeout, verify, cert, proxies)


def static_resolver(records: Mapping[str, str]) -> Resolve:
    """Resolve from a mapping (no DNS traffic); unknown names fail like NXDOMAIN."""

    def resolve(name: str) -> str:
        try:
            return records[name.lower()]
        except KeyError:
            raise requests.ConnectionError(f"no address for {name} (NXDOMAIN)") from None

    return resolve


def dns_resolver(address: tuple[str, int], lifetime: float = 2.0) -> Resolve:
    """Resolve A records through our DNS server at ``address`` with dnspython."""
    res = dns.resolver.Resolver(configure=False)
    res.nameservers = [address[0]]
    res.port = address[1]
    res.lifetime = lifetime
    res.cache = dns.resolver.Cache()

    def resolve(name: str) -> str:
        try:
            answer = res.resolve(name, "A")
        except dns.exception.DNSException as exc:
            raise requests.ConnectionError(f"cannot resolve {name}: {exc!r}") from exc
        return str(answer[0])

    return resolve


def session(resolve: Resolve, ca_file: str | None = None) -> requests.Session:
    """A requests Session that goes through :class:`LoopbackAdapter`."""
    s = requests.Session()
    s.trust_env = False  # never a proxy or a netrc from the environment
    adapter = LoopbackAdapter(resolve)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    if ca_file is not None:
        s.verify = ca_file
    return s
