"""The SDK against the checked-in OpenAPI document (``docs/openapi.json``).

These fail when the daemon gains an operation or a schema that the SDK does
not cover: every ``operationId`` must be a method of :class:`forkvm.Client`
and a coroutine of :class:`forkvm.AsyncClient`, taking the path parameters;
every schema must be a model in :mod:`forkvm.models` with the same fields.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import forkvm
from forkvm import models

from .conftest import OPENAPI

HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}

# operationIds whose Python name differs (none today; `exec` is a valid method name).
METHOD_FOR_OPERATION: Dict[str, str] = {}


@pytest.fixture(scope="module")
def spec() -> dict:
    if not OPENAPI.exists():
        pytest.fail(f"{OPENAPI} not found (set FORKVM_OPENAPI)")
    return json.loads(OPENAPI.read_text())


def operations(spec: dict) -> Iterator[Tuple[str, str, str, dict]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                yield op["operationId"], method.upper(), path, op


def test_spec_has_operations(spec: dict) -> None:
    assert len(list(operations(spec))) >= 17


def test_every_operation_has_a_client_method(spec: dict) -> None:
    missing: List[str] = []
    for op_id, method, path, _ in operations(spec):
        name = METHOD_FOR_OPERATION.get(op_id, op_id)
        sync = getattr(forkvm.Client, name, None)
        if not callable(sync):
            missing.append(f"Client.{name} ({method} {path})")
        if not inspect.iscoroutinefunction(getattr(forkvm.AsyncClient, name, None)):
            missing.append(f"AsyncClient.{name} ({method} {path})")
    assert not missing, "operations without an SDK method: " + ", ".join(missing)


def test_methods_take_the_path_parameters(spec: dict) -> None:
    for op_id, _, path, _ in operations(spec):
        name = METHOD_FOR_OPERATION.get(op_id, op_id)
        for cls in (forkvm.Client, forkvm.AsyncClient):
            params = inspect.signature(getattr(cls, name)).parameters
            for templated in re.findall(r"\{(\w+)\}", path):
                assert templated in params, f"{cls.__name__}.{name} lacks the path parameter {templated!r}"


def test_methods_take_the_request_body_fields(spec: dict) -> None:
    """Each field of a JSON request body is a keyword of the method (``stream`` has its own method)."""
    schemas = spec["components"]["schemas"]
    for op_id, _, _, op in operations(spec):
        content = op.get("requestBody", {}).get("content", {})
        ref = content.get("application/json", {}).get("schema", {}).get("$ref")
        if not ref:
            continue
        fields = set(schemas[ref.rsplit("/", 1)[1]].get("properties", {})) - {"stream"}
        name = METHOD_FOR_OPERATION.get(op_id, op_id)
        for cls in (forkvm.Client, forkvm.AsyncClient):
            params = set(inspect.signature(getattr(cls, name)).parameters)
            assert fields <= params, f"{cls.__name__}.{name} lacks {sorted(fields - params)}"


def _fields_of(schema: dict, schemas: Dict[str, dict]) -> Tuple[Set[str], Set[str]]:
    """The properties of an object schema, of the union of a oneOf, or of the parts of an allOf
    (``#[serde(flatten)]``: ``MountedVolume``), and those always required."""
    if "allOf" in schema:
        props: Set[str] = set()
        required: Set[str] = set()
        for part in schema["allOf"]:
            ref = part.get("$ref")
            part_props, part_required = _fields_of(schemas[ref.rsplit("/", 1)[1]] if ref else part, schemas)
            props |= part_props
            required |= part_required
        return props, required
    if "oneOf" in schema:
        variants = [v for v in schema["oneOf"] if v.get("type") == "object"]
        props = set().union(*(set(v.get("properties", {})) for v in variants))
        required = set.intersection(*(set(v.get("required", [])) for v in variants))
        return props, required
    return set(schema.get("properties", {})), set(schema.get("required", []))


def test_every_schema_has_a_model(spec: dict) -> None:
    import dataclasses
    import enum

    problems: List[str] = []
    for name, schema in spec["components"]["schemas"].items():
        cls = getattr(models, name, None)
        if cls is None:
            problems.append(f"no forkvm.models.{name}")
            continue
        if "enum" in schema:
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                problems.append(f"models.{name} should be an Enum")
            elif {m.value for m in cls} != set(schema["enum"]):
                problems.append(f"models.{name} values {sorted(m.value for m in cls)} != {sorted(schema['enum'])}")
            continue
        props, required = _fields_of(schema, spec["components"]["schemas"])
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for prop in sorted(props - set(fields)):
            problems.append(f"models.{name} lacks field {prop!r}")
        for prop in sorted(props & set(fields)):
            f = fields[prop]
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if prop in required and has_default:
                problems.append(f"models.{name}.{prop} is required by the schema but has a default")
            if prop not in required and not has_default:
                problems.append(f"models.{name}.{prop} is optional in the schema but required in the model")
    assert not problems, "\n".join(problems)


def test_every_error_status_has_an_exception(spec: dict) -> None:
    from forkvm.errors import error_from_detail

    for _, method, path, op in operations(spec):
        for status in op.get("responses", {}):
            if int(status) >= 400:
                err = error_from_detail("x", "y", int(status))
                assert type(err) is not forkvm.ForkvmError, f"HTTP {status} of {method} {path} has no exception class"
