"""A throwaway CA (trustme) and the server's TLS contexts, chosen by SNI.

Three certificates, all from one CA made for this run:
- the good one names every HTTPS host of the site that is not broken;
- the bad one names only ``wrong.test``: ``bad_cert`` hosts get it, so a
  crawler that checks certificates must refuse them;
- the default one (``testweb.invalid``) is what a client gets when it sends
  no SNI (or an unknown name): connecting to an IP without SNI fails
  verification, as on the real web.
The server records the SNI name each client sent.
"""

from __future__ import annotations

import shutil
import ssl
import tempfile
from collections.abc import Iterable
from pathlib import Path

import trustme

DEFAULT_NAME = "testweb.invalid"
WRONG_NAME = "wrong.test"
SNI_ATTR = "testweb_sni"  # set on the SSLObject by the SNI callback


class TLS:
    """The CA and the contexts; ``ca_file`` is a PEM path for clients' ``verify=``."""

    def __init__(self, good: Iterable[str], bad: Iterable[str] = ()) -> None:
        self.good = sorted(set(good))
        self.bad = frozenset(bad)
        self.ca = trustme.CA(organization_name="testweb throwaway CA")
        self._dir = Path(tempfile.mkdtemp(prefix="testweb-tls-"))
        self.ca_file = self._dir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.good_cert = self.ca.issue_cert(*(self.good or [DEFAULT_NAME]))
        self.bad_cert = self.ca.issue_cert(WRONG_NAME)
        self.default_cert = self.ca.issue_cert(DEFAULT_NAME)

    def server_context(self) -> ssl.SSLContext:
        """The context to listen with; it switches certificate by SNI."""
        by_kind = {}
        for kind, cert in (("good", self.good_cert), ("bad", self.bad_cert),
                           ("default", self.default_cert)):
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            cert.configure_cert(ctx)
            by_kind[kind] = ctx
        good = set(self.good) - self.bad
        bad = self.bad

        def pick(obj: ssl.SSLObject | ssl.SSLSocket, name: str | None,
                 _ctx: ssl.SSLContext) -> None:
            setattr(obj, SNI_ATTR, name)  # read back by the server for the log
            if name in good:
                obj.context = by_kind["good"]
            elif name in bad:
                obj.context = by_kind["bad"]

        default = by_kind["default"]
        default.sni_callback = pick
        return default

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts only the throwaway CA."""
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        return ctx

    def write(self, directory: Path) -> dict[str, Path]:
        """Write CA, good cert chain and key as PEM files (for nginx); returns their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {
            "ca": directory / "ca.pem",
            "cert": directory / "server-chain.pem",
            "key": directory / "server-key.pem",
        }
        self.ca.cert_pem.write_to_path(str(paths["ca"]))
        with open(paths["cert"], "wb") as fh:
            for blob in self.good_cert.cert_chain_pems:
                fh.write(blob.bytes())
        self.good_cert.private_key_pem.write_to_path(str(paths["key"]))
        return paths

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
