"""tools.testweb: a deterministic synthetic web on loopback (HTTP, HTTPS, DNS)
with the hostile parts of the real web, an oracle and a request log.

See docs/TESTWEB.md. The names below are the public API.
"""

from .faults import KINDS, Fault, fault, hostile
from .graph import Graph, SiteConfig
from .harness import TestWeb
from .oracle import CrawlResult, InfiniteSiteError, Oracle
from .requestlog import Request, RequestLog
from .site import Site
from .urls import normalize

__all__ = [
    "KINDS",
    "CrawlResult",
    "Fault",
    "Graph",
    "InfiniteSiteError",
    "Oracle",
    "Request",
    "RequestLog",
    "Site",
    "SiteConfig",
    "TestWeb",
    "fault",
    "hostile",
    "normalize",
]
