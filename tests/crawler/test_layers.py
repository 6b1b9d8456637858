"""The crawler's layers (see crawler/__init__.py and DESIGN §2): imports only point downward.

Every module of crawler/ is parsed (ast, nothing is imported) and each import
of a crawler module, wherever it is (top level, inside a function, under
TYPE_CHECKING), is checked: a module of a layer may import its own layer, the
layers below it, and the shared top-level ``config``, ``exceptions`` and
``outcomes`` (the vocabulary), which import nothing above them. ``read`` and
``run`` are siblings on ``state``: neither imports the other. The web layer is
pure: it imports nothing that does I/O.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import crawler

# Lowest first: a layer may import the ones before it.
LAYERS = ("web", "net", "state", "run", "read", "search", "cli")
SHARED = ("config", "exceptions", "outcomes")
# Siblings: layers that stand on the same ones and must not import each other.
SIBLINGS = {"read": "run", "search": "run"}
TOP = ("__init__", "__main__")  # the package itself; __main__ sits on top of everything
# What the pure web layer must not import: sockets, files, threads, stores.
IMPURE = ("socket", "ssl", "http", "urllib.request", "threading", "os", "kvstore", "dns",
          "requests", "numpy")

PACKAGE = Path(crawler.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, name: str, *, is_package: bool) -> list[str]:
    """Absolute names of the modules ``source`` (module ``name``) imports; for ``from X
    import a`` where X is the package or a layer, ``X.a`` too (``a`` is a submodule)."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append(target)
            if target.count(".") < 2:
                out.extend(f"{target}.{alias.name}" for alias in node.names)
    return out


def place(name: str) -> str | None:
    """The layer (or "shared", "top") of a crawler module name; None if it has no place."""
    parts = name.split(".")
    if parts[0] != "crawler":
        return None
    if len(parts) == 1:
        return "top"
    if parts[1] in LAYERS:
        return parts[1]
    if parts[1] in SHARED:
        return "shared"
    if parts[1] in TOP:
        return "top"
    return None


def allowed(layer: str) -> set[str]:
    if layer == "shared":
        return {"shared"}
    if layer == "top":
        return {*LAYERS, "shared", "top"}
    below = {*LAYERS[: LAYERS.index(layer) + 1], "shared"}
    return below - {SIBLINGS[layer]} if layer in SIBLINGS else below


def violations(source: str, name: str, *, is_package: bool = False) -> list[str]:
    """What is wrong with the imports of module ``name`` (empty: nothing)."""
    layer = place(name)
    if layer is None:
        return [f"{name} is in no layer: put it in one of {', '.join(LAYERS)}"]
    found = []
    for target in imports(source, name, is_package=is_package):
        if layer == "web" and any(target == m or target.startswith(m + ".") for m in IMPURE):
            found.append(f"{name} (pure web layer) imports {target}")
        if not target.startswith("crawler"):
            continue
        if target == "crawler":
            continue  # "from crawler import x": x is checked as crawler.x
        where = place(target)
        if where is None:
            found.append(f"{name} imports {target}, which is in no layer")
        elif where not in allowed(layer):
            found.append(f"{name} ({layer}) imports {target} ({where}): an upward import")
    return found


def crawler_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer() -> None:
    modules = crawler_modules()
    assert len(modules) > 20  # the walk found the package
    stray = [m for m in modules if place(module_name(m)) is None]
    assert not stray
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)


@pytest.mark.parametrize("path", crawler_modules(), ids=lambda p: module_name(p))
def test_imports_point_downward(path: Path) -> None:
    name = module_name(path)
    assert violations(path.read_text(encoding="utf-8"), name,
                      is_package=path.name == "__init__.py") == []


class TestTheCheckItself:
    """The checker finds what it is meant to find (on made-up sources)."""

    def test_an_upward_relative_import_is_found(self) -> None:
        found = violations("from ..run.engine import Engine\n", "crawler.web.urls")
        assert found == [
            "crawler.web.urls (web) imports crawler.run.engine (run): an upward import"
        ]

    def test_an_upward_import_inside_a_function_is_found(self) -> None:
        source = "def f():\n    from crawler.run.engine import Engine\n    return Engine\n"
        assert len(violations(source, "crawler.state.pages")) == 1

    def test_a_sibling_module_of_a_higher_layer_is_found(self) -> None:
        found = violations("from .. import run\n", "crawler.state.frontier")
        assert found == [
            "crawler.state.frontier (state) imports crawler.run (run): an upward import"
        ]

    def test_read_and_run_are_siblings(self) -> None:
        assert violations("from ..run.status import read_status\n", "crawler.read.report")
        assert violations("from ..read.listing import CrawlReader\n", "crawler.run.engine")
        assert violations("from ..state.statusfile import read_status\n",
                          "crawler.read.report") == []

    def test_shared_modules_import_no_layer(self) -> None:
        assert violations("from .web.urls import normalize\n", "crawler.config")

    def test_the_web_layer_does_no_io(self) -> None:
        assert violations("import socket\n", "crawler.web.links")
        assert violations("from kvstore import md5_key\n", "crawler.web.urls")

    def test_downward_and_same_layer_imports_pass(self) -> None:
        source = ("from ..exceptions import URLError\nfrom ..web.urls import parse\n"
                  "from .politeness import Scheduler\nfrom . import status\nimport kvstore\n")
        assert violations(source, "crawler.run.engine") == []
        assert violations("from . import crawl, export\n", "crawler.cli", is_package=True) == []

    def test_a_module_outside_the_layers_is_found(self) -> None:
        assert violations("", "crawler.shards")
        assert violations("from crawler.shards import x\n", "crawler.run.engine")
