"""The Makefile's two set-up commands take whatever Python 3 >= 3.11 the machine has."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, WAIT_S

pytestmark = pytest.mark.slow


def version_of(python: str) -> tuple[int, int] | None:
    """(major, minor) of an interpreter that runs, else None."""
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=WAIT_S)
    except OSError:
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def interpreters() -> list[str]:
    """Every Python 3 this machine can run: on PATH, and pyenv's versions if it has them."""
    names = [shutil.which(n) for n in ("python3", "python3.11", "python3.12", "python3.13")]
    found = {n for n in names if n}
    found |= {str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3")}
    return sorted(p for p in found if (version_of(p) or (2, 0))[0] == 3)


def make_venv(tmp_path: Path, python: str) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    return subprocess.run(["make", f"VENV={venv}", f"PYTHON={python}", f"{venv}/bin/python"],
                          cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)


@pytest.mark.parametrize("python", interpreters())
def test_a_python_3_11_or_newer_is_taken_an_older_one_refused(tmp_path: Path, python: str) -> None:
    proc = make_venv(tmp_path, python)
    if version_of(python) >= (3, 11):  # type: ignore[operator]
        assert proc.returncode == 0, proc.stderr
        assert version_of(str(tmp_path / "venv" / "bin" / "python")) == version_of(python)
    else:
        assert proc.returncode != 0 and not (tmp_path / "venv").exists()
        assert "batchserve needs Python 3.11 or newer" in proc.stderr


def test_an_interpreter_that_does_not_run_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = make_venv(tmp_path, str(tmp_path / "no-such-python"))
    assert proc.returncode != 0 and "batchserve needs Python 3.11 or newer" in proc.stderr
