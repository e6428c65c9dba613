"""Resolving the model setting: builtins, module:callable, TorchScript and torch.export files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from app.errors import ModelLoadError
from app.models.registry import load_handler
from app.models.tensor import TensorHandler


def _tiny() -> torch.nn.Module:
    m = torch.nn.Linear(3, 2)
    m.input_shape = (3,)  # type: ignore[assignment]
    return m


def test_module_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    h = load_handler("tests.unit.models.test_registry:_tiny")
    assert isinstance(h, TensorHandler) and h.input_shape == (3,) and h.name == "_tiny"
    out = h.load(torch.device("cpu"))(h.collate(h.decode([[1, 2, 3]])))
    assert out.shape == (1, 2)


def test_callable_returning_a_handler() -> None:
    h = load_handler("tests.fakes:EchoHandler", name="renamed")
    assert h.name == "renamed" and h.decode([2]) == [2.0]


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_torchscript_file(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(path))
    h = load_handler(str(path))
    assert h.name == "scripted"
    x = h.collate(h.decode([[1, 2, 3, 4], [4, 3, 2, 1]]))
    assert h.load(torch.device("cpu"))(x).shape == (2, 2)


def test_exported_program_file(tmp_path: Path) -> None:
    module = torch.nn.Linear(4, 2)
    program = torch.export.export(
        module, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    path = tmp_path / "exported.pt2"
    torch.export.save(program, str(path))
    h = load_handler(str(path))
    assert isinstance(h, TensorHandler) and h.input_shape == (4,)
    x = h.collate(h.decode([[1, 2, 3, 4]] * 5))
    assert torch.allclose(h.load(torch.device("cpu"))(x), module(x), atol=1e-6)


def test_exported_program_with_fixed_batch_is_refused(tmp_path: Path) -> None:
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    path = tmp_path / "fixed.pt2"
    torch.export.save(program, str(path))
    with pytest.raises(ModelLoadError, match="dynamic batch"):
        load_handler(str(path))


def test_unknown_models_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown model"):
        load_handler("nonsense")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_handler(str(tmp_path / "missing.pt"))
    with pytest.raises(ModelLoadError, match="cannot import"):
        load_handler("no_such_module_xyz:thing")
    with pytest.raises(ModelLoadError, match="not an nn.Module"):
        load_handler("tests.unit.models.test_registry:_not_model")


def _not_model() -> int:
    return 3


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_a_file_of_another_kind_is_named_for_what_it_holds(tmp_path: Path) -> None:
    """torch's own words for these ("an internal miniz error ... corrupted", "check the
    warnings above") name no cause; the archive's members do."""
    linear = torch.nn.Linear(4, 2)
    torch.save(linear.state_dict(), tmp_path / "weights.pt")
    torch.save(linear.state_dict(), tmp_path / "weights.pt2")
    torch.jit.script(linear).save(str(tmp_path / "scripted.pt2"))
    program = torch.export.export(linear, (torch.zeros(2, 4),),
                                  dynamic_shapes={"input": {0: torch.export.Dim("batch")}})
    torch.export.save(program, tmp_path / "exported.pt")
    said = {
        "weights.pt": "is not a TorchScript file: it holds a torch.save checkpoint",
        "weights.pt2": "is not a torch.export program: it holds a torch.save checkpoint",
        "scripted.pt2": "it holds a TorchScript module: name it .pt",
        "exported.pt": "it holds a torch.export program: name it .pt2",
    }
    for name, message in said.items():
        with pytest.raises(ModelLoadError, match=message):
            load_handler(str(tmp_path / name))
    # The right kind that does not load (here a member cut short) keeps torch's words.
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(tmp_path / "scripted.pt2") as whole, zipfile.ZipFile(broken, "w") as cut:
        for item in whole.infolist():
            data = whole.read(item)
            cut.writestr(item, data[:8] if item.filename.endswith("/data.pkl") else data)
    with pytest.raises(ModelLoadError, match="broken.pt: the TorchScript file did not load: "):
        load_handler(str(broken))
