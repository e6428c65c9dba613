"""The package's face (app/__init__.py): what it exports, and what importing pieces of it costs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import app

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves() -> None:
    for name in app.__all__:
        assert getattr(app, name) is not None, name
    assert issubclass(app.ServeError, app.BatchServeError)
    assert issubclass(app.ConfigError, app.BatchServeError)
    assert issubclass(app.ModelLoadError, app.BatchServeError)
    with pytest.raises(AttributeError):
        app.nothing_here  # noqa: B018


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" in project["dynamic"] and "version" not in project
    grep = ["git", "grep", "-n", "-F", "--untracked", app.__version__, "--", "app",
            "pyproject.toml"]
    hits = subprocess.run(grep, cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert [h.split(":")[0] for h in hits] == ["app/version.py"], hits


@pytest.mark.parametrize("statement", [
    "from app.jobs.client import submit",
    "import app; app.submit",
    "from app.sources import load_settings",
    "import app.cli",
])
def test_light_imports_do_not_load_torch(statement: str) -> None:
    code = f"{statement}; import sys; print('torch' in sys.modules, 'fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("command", [
    ["serve", "--frontends", "x"],
    ["serve", "--config", "missing.toml"],
    ["check-model", "linear", "--max-batch-size", "0"],
])
def test_a_wrong_setting_is_said_before_torch_loads(command: list[str]) -> None:
    """The one line comes in a moment, not after the seconds torch's import takes."""
    code = (f"import sys; from app.cli import main; code = main({command!r}); "
            "print(code, 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert run.stdout.split() == ["2", "False"], run.stderr
    assert run.stderr.startswith("batchserve: ") and len(run.stderr.splitlines()) == 1


def test_typed_marker_ships() -> None:
    assert (ROOT / "app" / "py.typed").is_file()
