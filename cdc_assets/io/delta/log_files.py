"""A Delta table's log read from its files, for a table on a disk this process shares with the engine: what a
look at the table's history tells (each commit's version and commit info, newest first) without a Spark query,
which costs a warm local server 0.3-0.4 s, and every batch looks twice (its progress, then its commit's version)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from cdc_assets.io.storage import store_of

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


def local_log_dir(path: str) -> Path | None:
    """The ``_delta_log`` folder of a table ``path`` on local disk; None for a table on another store."""
    if store_of(path) != "local":
        return None
    return Path(path.removeprefix("file://")) / "_delta_log"


def logged_history(log_dir: Path, limit: int | None) -> list[dict[str, object]] | None:
    """The commit infos of the newest ``limit`` commits in ``log_dir`` (every commit's where None), newest first,
    each with its ``version``, as ``DESCRIBE HISTORY`` gives them; None where the folder holds no commit (no
    table there). Commit files appear whole (each engine writes one elsewhere and renames it)."""
    try:
        names = os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    versions = sorted((int(found.group(1)) for name in names if (found := _COMMIT_FILE.match(name))), reverse=True)
    if not versions:
        return None
    history: list[dict[str, object]] = []
    for version in versions[:limit] if limit else versions:
        try:
            info = _commit_info(log_dir / f"{version:020d}.json")
        except FileNotFoundError:  # an old commit the log's clean-up removed meanwhile
            continue
        history.append({**info, "version": version})
    return history


def _commit_info(commit_file: Path) -> dict[str, object]:
    """The ``commitInfo`` action of a commit file; empty where it has none (the protocol makes it optional)."""
    with commit_file.open(encoding="utf-8") as actions:
        for line in actions:
            action = json.loads(line) if '"commitInfo"' in line else {}
            if "commitInfo" in action:
                return dict(action["commitInfo"])
    return {}
