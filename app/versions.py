"""Which version of a model a request reaches, in the device process's repository
(app/repository.py) and in a front end's copy of it (app/frontend/remote.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from app.errors import NotFound, Unavailable

M = TypeVar("M")


def pick(name: str, version: str | None, versions: Mapping[str, M] | None, current: str | None,
         failed: str | None, names: Callable[[], list[str]], loading: bool = False) -> M:
    """The version of ``name`` a request reaches: ``version``, else ``current`` (the default
    traffic's), else the newest of ``versions`` (only versions still loading). ``failed``: why
    the name could not be loaded; ``names``: every name, for the error; ``loading``: the name,
    without a version to show, is on its way (its code being built, or the start-up's)."""
    if not versions:
        if loading:
            raise Unavailable("loading", f"model '{name}' is loading")
        if failed is not None:
            raise Unavailable("unavailable", f"model '{name}' could not be loaded: {failed}")
        raise NotFound(f"unknown model '{name}'; this server serves {names() or 'none'}")
    if version is None:
        version = current if current is not None else max(versions, key=int)
    model = versions.get(version)
    if model is None:
        raise NotFound(f"model '{name}' has no version '{version}'; it has "
                       f"{sorted(versions, key=int)}")
    return model
