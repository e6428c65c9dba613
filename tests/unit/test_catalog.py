"""The catalog: reading a model folder, and how a model's settings layer over the server's."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Catalog, model_settings
from app.errors import ConfigError
from app.sources import load_settings


def test_a_models_settings_take_what_the_user_set_for_the_server() -> None:
    server = load_settings(None, {"queue_capacity": 4, "model_repository": "/tmp"})
    assert model_settings(server, {}).queue_capacity == 4
    assert model_settings(server, {}).max_instances == 4  # derived from it, as for the server
    own = model_settings(server, {"queue_capacity": 100})
    assert (own.queue_capacity, own.max_instances) == (100, 100)  # derived anew, not inherited
    assert model_settings(server, {}).model == "minilm"  # a model setting is never inherited
    with pytest.raises(ValueError, match="max_wait_ms.*request_timeout_s"):
        model_settings(server, {"max_wait_ms": 900, "request_timeout_s": 0.5})


def test_a_models_large_batch_gets_a_queue_that_holds_it() -> None:
    """A batch never holds more than the queue: a model's max_batch_size past the default
    capacity raises that model's default capacity, not one the user set for the server."""
    server = load_settings(None, {"model_repository": "/tmp"})
    assert model_settings(server, {"max_batch_size": 4096}).queue_capacity == 4096
    assert model_settings(server, {}).queue_capacity == 1024
    capped = load_settings(None, {"queue_capacity": 512, "model_repository": "/tmp"})
    assert model_settings(capped, {"max_batch_size": 4096}).queue_capacity == 512


def test_versions_are_numbered_folders_and_the_newest_serves(tmp_path: Path) -> None:
    for version in ("1", "3", "10"):
        (tmp_path / "m" / version).mkdir(parents=True)
        (tmp_path / "m" / version / "model.pt2").write_bytes(b"")
    (tmp_path / "m" / "notes").mkdir()
    catalog = Catalog(load_settings(None, {"model_repository": str(tmp_path)}))
    source = catalog.read("m")
    assert sorted(source.versions, key=int) == ["1", "3", "10"] and source.wanted() == ["10"]
    (tmp_path / "m" / "config.toml").write_text("versions = [1, 3]\n")
    assert catalog.read("m").wanted() == ["1", "3"]
    (tmp_path / "m" / "config.toml").write_text("versions = [2]\n")
    assert "versions 2 are not in the repository" in catalog.read("m").reason


@pytest.mark.parametrize(("files", "config", "reason"), [
    ({"1/model.pt": b""}, 'model = "linear"\n', "both a model setting"),
    ({"1/model.pt": b"", "1/model.pt2": b""}, "", "holds both model.pt and model.pt2"),
    ({"01/model.pt": b"", "1/model.pt": b""}, "", "folders 01 and 1 are both version 1"),
    ({}, "", "no model: there is no config.toml, and there is no version folder "
             "(1/model.pt or 1/model.pt2)"),
    ({}, "max_batch_size = 8\n", "no model: config.toml sets none, and there is no version"),
    ({"1/weights.pt": b""}, "", "no model: there is no config.toml, and version folder 1 holds "
                               "no model.pt or model.pt2"),
    ({}, "max_batch_size = [", "cannot be read"),
    ({}, "colour = 3\n", "unknown settings colour"),
    ({}, "max_batch_sise = 8\n", "unknown settings max_batch_sise (did you mean max_batch_size?)"),
])
def test_layout_mistakes_are_explained(tmp_path: Path, files: dict[str, bytes], config: str,
                                       reason: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    if config:
        (folder / "config.toml").write_text(config)
    source = Catalog(load_settings(None, {"model_repository": str(tmp_path)})).read("m")
    assert reason in source.reason


def test_a_repository_that_is_not_a_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a folder"):
        Catalog(load_settings(None, {"model_repository": str(tmp_path / "nope")}))


def test_the_shipped_example_repository_is_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "config" / "repository"
    sources = Catalog(load_settings(None, {"model_repository": str(root)})).sources()
    assert sorted(sources) == ["classify", "embed"]
    assert all(not s.reason for s in sources.values()), {n: s.reason for n, s in sources.items()}


def test_a_start_up_model_not_in_the_repository_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "echo").mkdir()
    catalog = Catalog(load_settings(None, {"model_repository": str(tmp_path)}))
    assert catalog.startup(["echo"]) == ["echo"] and catalog.startup(None) is None
    with pytest.raises(ConfigError, match=f"load_model names nope, .hidden: not in the model "
                       f"repository {tmp_path} \\(it has echo\\)"):
        catalog.startup(["echo", "nope", ".hidden"])
    assert catalog.startup(["echo"], "echo") == ["echo"]  # a default may wait for its load
    with pytest.raises(ConfigError, match="default_model names nope: not in the model"):
        catalog.startup(None, "nope")


@pytest.mark.parametrize("name", ["x" * 5000, "a\0b", "echo/..", "echo/", ".", ""])
def test_a_name_no_folder_can_have_is_missing_not_an_error(tmp_path: Path, name: str) -> None:
    (tmp_path / "echo").mkdir()
    assert Catalog(load_settings(None, {"model_repository": str(tmp_path)})).read(name).missing
