"""The crawl's settings, kept in the data directory (``settings.json``).

The first ``start`` writes the options the crawl runs with; a resume with no
options runs with them again, and an option given on a resume replaces the
saved value (the CLI logs each change) and is saved in turn. Readers of a
finished crawl (export, show) take what the crawl really used from here: the
User-Agent that was sent, for one.

The file is JSON: ``{"format": 1, "settings": {name: value}}``, names being the
``start`` options' long names with ``_`` for ``-`` (``per_host``, ``nameserver``).
It is replaced atomically (a reader sees the old file or the new one, never
half of one) and fsynced, so a kill -9 during a start leaves one of the two.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..exceptions import DataDirError
from .jsonfile import read_json

SETTINGS_NAME = "settings.json"
SETTINGS_FORMAT = 1


def settings_path(data_dir: str) -> str:
    return os.path.join(data_dir, SETTINGS_NAME)


def load_settings(data_dir: str) -> dict[str, Any] | None:
    """The saved settings, or None for a crawl that has none yet.

    Raises DataDirError, naming the file, when it is unreadable or not ours. The values
    are the caller's to check (crawler.cli.startopts.check_saved)."""
    path = settings_path(data_dir)
    try:
        doc = read_json(path, "a crawl settings file", "fix or delete it")
    except FileNotFoundError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("settings"), dict):
        raise DataDirError(f"{path}: not a crawl settings file: fix or delete it")
    if type(doc.get("format")) is not int or doc["format"] != SETTINGS_FORMAT:
        raise DataDirError(
            f"{path}: settings format {doc.get('format')!r}, this version reads "
            f"{SETTINGS_FORMAT}: written by another version of the crawler"
        )
    settings: dict[str, Any] = doc["settings"]
    return settings


def save_settings(data_dir: str, settings: dict[str, Any]) -> None:
    """Write ``settings`` (JSON values) as the crawl's, atomically and durably."""
    path = settings_path(data_dir)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": SETTINGS_FORMAT, "settings": settings}, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
