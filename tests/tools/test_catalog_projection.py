"""Property: the projection removes exactly the length bounds ≥ 2000, and execution still
enforces them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kaizen_server_extension.tools.schema import (
    InvalidArguments,
    project_schema,
    schema_problem,
    validate_arguments,
)
from kaizen_server_extension.tools.types import ToolDescriptor

BOUNDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
          "maxContains", "minContains")
# Values on both sides of the threshold, and the threshold itself.
bound_value = st.one_of(st.integers(0, 1999), st.integers(1995, 2005), st.integers(2000, 100000))
# Property names that look like keywords: they are data and must survive.
prop_name = st.sampled_from(["a", "b", "maxLength", "maxItems", "title", "items", "anyOf"])


def with_bounds(base: dict[str, Any], keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {k: st.just(v) for k, v in base.items()},
        optional={k: bound_value for k in keys},
    )


def strings() -> st.SearchStrategy[dict[str, Any]]:
    return with_bounds({"type": "string"}, ("maxLength", "minLength"))


def composite(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    arrays = st.builds(
        lambda base, items: {**base, "items": items, "contains": items},
        with_bounds({"type": "array"}, ("maxItems", "minItems", "maxContains", "minContains")),
        children,
    )
    objects = st.builds(
        lambda base, props: {**base, "properties": props},
        with_bounds({"type": "object"}, ("maxProperties", "minProperties")),
        st.dictionaries(prop_name, children, max_size=3),
    )
    any_of = st.builds(lambda xs: {"anyOf": xs}, st.lists(children, min_size=1, max_size=3))
    constant = st.builds(lambda v: {"const": {"maxLength": v}, "default": {"maxItems": v}},
                         bound_value)
    return st.one_of(arrays, objects, any_of, constant)


schemas = st.builds(
    lambda base, props, defs: {**base, "properties": props, "$defs": defs},
    with_bounds({"type": "object"}, ("maxProperties", "minProperties")),
    st.dictionaries(prop_name, st.recursive(strings(), composite, max_leaves=8), max_size=4),
    st.dictionaries(st.sampled_from(["d1", "d2"]), strings(), max_size=2),
)


def expected(schema: Any) -> Any:
    """The oracle, written independently of the implementation for the shapes generated."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in BOUNDS and value >= 2000:
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: expected(sub) for name, sub in value.items()}
        elif key in ("items", "contains"):
            out[key] = expected(value)
        elif key == "anyOf":
            out[key] = [expected(sub) for sub in value]
        else:
            out[key] = value  # const/default/type and bounds < 2000: untouched
    return out


def bounds_in(schema: Any) -> list[int]:
    found: list[int] = []
    if isinstance(schema, dict):
        found += [v for k, v in schema.items() if k in BOUNDS]
        for key in ("properties", "$defs"):
            for sub in schema.get(key, {}).values():
                found += bounds_in(sub)
        for key in ("items", "contains"):
            if key in schema:
                found += bounds_in(schema[key])
        for sub in schema.get("anyOf", []):
            found += bounds_in(sub)
    return found


@pytest.mark.rule("R-335")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas)
def test_projection_removes_exactly_the_bounds_at_or_above_2000(schema):
    assert schema_problem(schema) is None  # the generator only makes valid 2020-12 schemas
    original = copy.deepcopy(schema)
    projected = project_schema(schema)
    assert all(v < 2000 for v in bounds_in(projected))  # never leaves one ≥ 2000
    assert projected == expected(schema)  # never removes one < 2000, never changes anything else
    assert schema == original  # the original (execution) schema is untouched


@pytest.mark.rule("R-335", "R-336")
@settings(max_examples=40, deadline=None)
@given(st.integers(2000, 30000), st.sampled_from(["maxLength", "maxItems"]))
def test_a_stripped_bound_is_still_enforced_at_execution(limit, keyword):
    prop = ({"type": "string", "maxLength": limit} if keyword == "maxLength"
            else {"type": "array", "maxItems": limit})
    schema = {"type": "object", "properties": {"v": prop}}
    assert keyword not in project_schema(schema)["properties"]["v"]
    descriptor = ToolDescriptor(name="t", description="t", input_schema=schema)

    def value(n: int) -> Any:
        return "x" * n if keyword == "maxLength" else [0] * n

    assert validate_arguments(descriptor, json.dumps({"v": value(limit)}))["v"] == value(limit)
    with pytest.raises(InvalidArguments):
        validate_arguments(descriptor, json.dumps({"v": value(limit + 1)}))
