"""The custom resources in deploy/kubernetes, checked against their projects' own API types, as
strictly as kubernetes-validate checks the built-in kinds: a field the type lacks, a value of the
wrong type, or a field the models mark as required missing is an error.

- KEDA (``keda.sh``): cloudcoil's pydantic models, generated from KEDA's CRDs. A field they do not
  know is dropped by pydantic, and a value of the wrong type may be coerced ("0" to 0), so a
  resource passes only if it survives validation and comes back unchanged.
- KServe (``serving.kserve.io``): the KServe SDK's models, generated from KServe's API, with the
  Kubernetes types they embed (containers, metadata) from the kubernetes client. Their
  deserialiser ignores unknown fields, so ``_build`` walks the resource by the models' own type
  tables and constructs every model, which checks its required fields.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from typing import Any

import kubernetes.client.models
import pydantic
from cloudcoil.models.keda import v1alpha1 as keda


def _kserve_models() -> types.ModuleType:
    """``kserve.models`` without running the ``kserve`` package's own ``__init__``, which also
    registers KServe's gRPC messages (proto package ``inference``) in protobuf's default pool:
    tritonclient.grpc registers the same names there, and the second to come fails. The models
    need nothing from that ``__init__``."""
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")
        assert spec is not None and spec.submodule_search_locations is not None
        package = types.ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


KSERVE_MODELS = _kserve_models()
KSERVE_KINDS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
}
KEDA_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("keda.sh/v1alpha1", "ScaledJob"),
              ("keda.sh/v1alpha1", "TriggerAuthentication")}
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
    "datetime": (str,), "date": (str,), "bytes": (str,),
}
_LIST = re.compile(r"(?:list|List)\[(.*)\]")
_MAP = re.compile(r"dict\(str, (.*)\)|Dict\[str, (.*)\]")


class SchemaError(Exception):
    """The resource is not what its kind's API accepts; the message says where."""


def check(doc: dict[str, Any]) -> None:
    """Raise SchemaError unless ``doc`` is a valid resource of a kind known here."""
    kind = (doc.get("apiVersion", ""), doc.get("kind", ""))
    name = f"{kind[1]} {doc.get('metadata', {}).get('name', '?')}"
    if kind in KSERVE_KINDS:
        _build(doc, KSERVE_KINDS[kind], name)
    elif kind in KEDA_KINDS:
        _check_keda(doc, kind[1], name)
    else:
        raise SchemaError(f"{name}: no schema known here for {kind[0]} {kind[1]}")


def _check_keda(doc: dict[str, Any], kind: str, name: str) -> None:
    model = getattr(keda, kind)
    try:
        back = model.model_validate(doc).model_dump(mode="json", by_alias=True,
                                                    exclude_unset=True)
    except pydantic.ValidationError as exc:
        raise SchemaError(f"{name}: {exc}") from None
    _same(doc, back, name)


def _same(sent: Any, back: Any, where: str) -> None:
    """``back`` (validated and dumped again) is ``sent``: nothing dropped, nothing coerced."""
    if isinstance(sent, dict) and isinstance(back, dict):
        for key, value in sent.items():
            if key not in back:
                raise SchemaError(f"{where}: unknown field {key!r}")
            _same(value, back[key], f"{where}.{key}")
    elif isinstance(sent, list) and isinstance(back, list) and len(sent) == len(back):
        for i, (a, b) in enumerate(zip(sent, back, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif type(sent) is not type(back) or sent != back:
        raise SchemaError(f"{where}: {sent!r} is not of the type the schema wants ({back!r})")


def _build(value: Any, type_name: str, where: str) -> Any:
    """``value`` as an SDK object of ``type_name`` (an openapi type: a model's name, ``str``,
    ``list[...]`` or ``List[...]``, ``dict(str, ...)`` or ``Dict[str, ...]``, ``object``);
    SchemaError where it does not fit."""
    if listed := _LIST.fullmatch(type_name):
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list, got {value!r}")
        return [_build(v, listed[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if mapped := _MAP.fullmatch(type_name):
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected a map, got {value!r}")
        inner = mapped[1] or mapped[2]
        return {k: _build(v, inner, f"{where}.{k}") for k, v in value.items()}
    if type_name == "object":  # free-form (int-or-string, raw extensions)
        return value
    if type_name in _PRIMITIVES:
        wanted = _PRIMITIVES[type_name]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            raise SchemaError(f"{where}: expected {type_name}, got {value!r}")
        return value
    cls = getattr(KSERVE_MODELS, type_name, None) or getattr(kubernetes.client.models,
                                                             type_name, None)
    if cls is None:
        raise SchemaError(f"{where}: the type {type_name} is unknown to this check")
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected a {type_name} object, got {value!r}")
    fields = {json: attr for attr, json in cls.attribute_map.items()}
    unknown = [key for key in value if key not in fields]
    if unknown:
        raise SchemaError(f"{where}: {type_name} has no field {unknown[0]!r}")
    kwargs = {fields[key]: _build(v, cls.openapi_types[fields[key]], f"{where}.{key}")
              for key, v in value.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a required field missing, a value outside its enum
        raise SchemaError(f"{where}: {exc}") from None
