"""Installations of the project of a test's own, for what a user's installation does differently from the venv the
tests run in (extras fetched or not)."""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def venv_of_this_ones_packages(venv: Path) -> Path:
    """A venv whose python sees this venv's packages, with the stamp that tells scripts/setup they are installed."""
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = venv / purelib.relative_to(sys.prefix)
    site.mkdir(parents=True)
    (site / "this_venv.pth").write_text(f"import site; site.addsitedir({str(purelib)!r})\n")
    (venv / ".cdc-assets-installed").write_text(hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
                                                + "\n")
    return venv / "bin" / "python"
