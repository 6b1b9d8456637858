"""The system packages the tests use (tools/system-packages.txt), read for the tests.

A test that needs one says so with ``@pytest.mark.system_packages("nftables")`` (or, where
the need shows only inside it, ``pytest.skip(system_packages.missing("tinyproxy"))`` when
that is not None); tests/conftest.py turns the mark into a skip whose reason starts with
``MISSING`` and names the package and the command that installs it. Such a skip fails a
CI run (CI set) even in a test marked ``ci_may_skip``: CI installs every package here.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

LIST = Path(__file__).with_name("system-packages.txt")
INSTALL = "tools/install-system-packages"  # the README's command (from the checkout)
MISSING = "system package missing:"  # the start of every such skip's reason


@dataclass(frozen=True)
class Package:
    name: str  # the Debian package
    probe: str  # a program on PATH, or an absolute path, that is there once it is installed
    why: str

    def installed(self) -> bool:
        if os.path.isabs(self.probe):
            return os.path.exists(self.probe)
        return shutil.which(self.probe) is not None


def packages() -> dict[str, Package]:
    """Every package of the list, by name, in its order."""
    out: dict[str, Package] = {}
    for line in LIST.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, probe, *why = line.split()
        out[name] = Package(name, probe, " ".join(why))
    return out


def missing(*names: str) -> str | None:
    """The skip reason if any of the named packages is not installed, else None. A name
    not in the list is an error (a test may not need what the README's set-up does not
    install)."""
    known = packages()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not in {LIST.name}; add it there "
                         f"(with what shows it is installed) so {INSTALL} installs it")
    absent = [known[n] for n in names if not known[n].installed()]
    if not absent:
        return None
    what = ", ".join(_absent(p) for p in absent)
    return (f"{MISSING} {what}: {INSTALL} installs the tests' system packages "
            "(README: Run the tests)")


def _absent(package: Package) -> str:
    if os.path.isabs(package.probe):
        return f"{package.name} (no {package.probe})"
    sbin = shutil.which(package.probe, path="/usr/local/sbin:/usr/sbin:/sbin")
    if sbin is not None:  # a user's PATH on Debian lacks the sbin directories
        return f"{package.name} ({sbin} is not on PATH: add {os.path.dirname(sbin)} to it)"
    return f"{package.name} (no `{package.probe}` on PATH)"
