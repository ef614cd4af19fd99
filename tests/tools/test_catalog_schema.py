"""Descriptor admission, the advertised projection and execution-time argument validation."""

from __future__ import annotations

import copy
import json
import logging

import pytest

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.tools.schema import (
    InvalidArguments,
    admit_descriptors,
    project_schema,
    schema_problem,
    validate_arguments,
)
from kaizen_server_extension.tools.types import ToolDescriptor


def d(name: str, schema: object, description: str = "A tool.") -> ToolDescriptor:
    return ToolDescriptor(name=name, description=description, input_schema=schema)  # type: ignore[arg-type]


GOOD = {"type": "object", "properties": {"q": {"type": "string"}}}


@pytest.mark.rule("R-328", "R-330")
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "strin"}}},  # not a JSON type
        {"type": "object", "properties": {"a": {"maxLength": -1}}},
        {"type": "object", "required": "a"},
        {"type": "object", "properties": []},
    ],
)
def test_schema_failing_the_2020_12_meta_schema_is_omitted_alone(schema):
    admitted, omitted = admit_descriptors([d("good", GOOD), d("bad", schema), d("also", GOOD)])
    assert [x.name for x in admitted] == ["good", "also"]
    assert [o.name for o in omitted] == ["bad"]
    assert "meta-schema" in omitted[0].reason


@pytest.mark.rule("R-329", "R-330")
@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "properties": {"n": {"$ref": "#"}}}, "recursive"),
        ({"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
          "properties": {"x": {"$ref": "#/$defs/a"}}}, "recursive"),
        ({"type": "object", "$defs": {"node": {"type": "object", "properties": {
            "child": {"$ref": "#/$defs/node"}}}}, "properties": {"x": {"$ref": "#/$defs/node"}}},
         "recursive"),
        ({"type": "object", "properties": {"x": {"$ref": "https://evil.example/s.json"}}},
         "non-local"),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "resolve"),
        ({"type": "object", "properties": {"x": {"$dynamicRef": "#meta"}}}, "dynamicRef"),
        ({"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200}
                                           for i in range(400)}}, "bytes"),
        ({"type": "object", "properties": {"a": json.loads('{"items":' * 40 + "{}" + "}" * 40)}},
         "deeper"),
        ({"type": "string"}, "top level"),
        ([], "not an object"),
    ],
)
def test_recursive_oversized_deep_or_foreign_schemas_are_omitted(schema, reason):
    assert reason in (schema_problem(schema) or "")
    admitted, omitted = admit_descriptors([d("x", schema), d("ok", GOOD)])
    assert [a.name for a in admitted] == ["ok"] and omitted[0].name == "x"


def test_acyclic_local_references_are_admitted():
    schema = {"type": "object", "$defs": {"s": {"type": "string"}},
              "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#/$defs/s"}}}
    assert schema_problem(schema) is None


@pytest.mark.rule("R-330")
def test_a_malformed_descriptor_is_logged_once(caplog):
    bad = d("bad", {"type": "object", "properties": {"a": {"type": 1}}})
    with caplog.at_level(logging.WARNING):
        admit_descriptors([bad])
        admit_descriptors([bad])
    assert sum("bad" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.rule("R-331")
def test_an_invalid_descriptor_is_never_repaired():
    schema = {"type": "object", "properties": {"a": {"type": "strin", "maxLength": 5}}}
    bad = d("bad", schema)
    snapshot = copy.deepcopy(schema)
    admitted, _ = admit_descriptors([bad])
    assert admitted == [] and schema == snapshot  # dropped as is, not rewritten into something


def test_invalid_name_or_description_is_omitted():
    _, omitted = admit_descriptors([d("has space", GOOD), d("empty_description", GOOD, "")])
    assert [o.name for o in omitted] == ["has space", "empty_description"]


# --- projection --------------------------------------------------------------------------

BIG = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "maxLength": 20000, "minLength": 2000},
        "short": {"type": "string", "maxLength": 1999},
        "edge": {"type": "string", "maxLength": 2000},
        "rows": {"type": "array", "maxItems": 5000, "minItems": 1,
                 "items": {"type": "object", "maxProperties": 2500,
                           "properties": {"v": {"type": "string", "maxLength": 4000}}}},
        "either": {"anyOf": [{"type": "string", "maxLength": 9999}, {"type": "null"}]},
        "maxLength": {"type": "integer", "maximum": 100000, "minimum": 0},
        "c": {"const": {"maxLength": 5000}, "default": {"maxItems": 9000}},
        "tags": {"type": "array", "contains": {"type": "string"}, "maxContains": 3000},
    },
    "$defs": {"s": {"type": "string", "maxLength": 3000}},
}


@pytest.mark.rule("R-335")
def test_projection_strips_length_bounds_at_or_above_2000_everywhere():
    p = project_schema(BIG)["properties"]
    assert "maxLength" not in p["text"] and "minLength" not in p["text"]
    assert "maxLength" not in p["edge"]
    assert p["short"]["maxLength"] == 1999  # below the threshold: kept
    assert "maxItems" not in p["rows"] and p["rows"]["minItems"] == 1
    assert "maxProperties" not in p["rows"]["items"]
    assert "maxLength" not in p["rows"]["items"]["properties"]["v"]
    assert "maxLength" not in p["either"]["anyOf"][0]
    assert "maxContains" not in p["tags"]
    assert "maxLength" not in project_schema(BIG)["$defs"]["s"]


@pytest.mark.rule("R-335")
def test_projection_leaves_data_and_numeric_bounds_alone():
    p = project_schema(BIG)["properties"]
    # A *property* named maxLength, and values inside const/default, are data, not bounds.
    assert p["maxLength"] == {"type": "integer", "maximum": 100000, "minimum": 0}
    assert p["c"] == {"const": {"maxLength": 5000}, "default": {"maxItems": 9000}}


@pytest.mark.rule("R-336")
def test_projection_does_not_touch_the_original():
    before = copy.deepcopy(BIG)
    project_schema(BIG)
    assert before == BIG


# --- execution-time validation ------------------------------------------------------------


@pytest.mark.rule("R-336")
def test_stripped_bound_is_still_enforced_when_the_tool_runs():
    desc = d("big", BIG)
    assert validate_arguments(desc, json.dumps({"text": "x" * 20000})) == {"text": "x" * 20000}
    with pytest.raises(InvalidArguments, match=r"\$\.text is longer than 20000") as info:
        validate_arguments(desc, json.dumps({"text": "x" * 20001}))
    assert "xxxx" not in str(info.value)  # the value is not echoed back
    with pytest.raises(InvalidArguments, match=r"\$\.rows has more than 5000 items"):
        validate_arguments(desc, json.dumps({"rows": [{}] * 5001}))


def test_errors_name_each_failing_path_and_are_member_safe():
    schema = {"type": "object", "required": ["a"], "additionalProperties": False,
              "properties": {"a": {"type": "integer", "maximum": 3},
                             "list": {"type": "array", "items": {"type": "string"}}}}
    with pytest.raises(MemberSafeError) as info:
        validate_arguments(d("t", schema), '{"list": ["ok", 7], "zzz": 1}')
    err = info.value
    assert err.code == "invalid_arguments"
    assert "'a' is a required property" in str(err)
    assert "$.list[1] is not of type" in str(err)
    assert "zzz" in str(err)  # names the unexpected key


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"q": "a", "q": "b"}', "repeat the key"),
        ('["q"]', "must be a JSON object"),
        ("42", "must be a JSON object"),
        ('{"q": NaN}', "non-JSON number"),
        ('{"q": ', "not valid JSON"),
        ('{"a": {"b": 1, "b": 2}}', "repeat the key"),
    ],
)
def test_duplicate_keys_non_objects_and_bad_json_are_refused(raw, message):
    with pytest.raises(InvalidArguments, match=message):
        validate_arguments(d("t", {"type": "object"}), raw)


def test_an_empty_argument_text_means_no_arguments():
    assert validate_arguments(d("t", {"type": "object"}), "  ") == {}
    with pytest.raises(InvalidArguments, match="required"):
        validate_arguments(d("t", {"type": "object", "required": ["q"]}), "")
