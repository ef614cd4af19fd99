"""Compiling an untrusted OpenAPI document into operations: effect classes, omissions, bounds."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.egress import Egress, EgressPolicy
from kaizen_server_extension.tools.openapi_compiler import (
    MAX_OPERATIONS,
    CompiledDocument,
    DocumentRejected,
    compile_document,
)
from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
from kaizen_server_extension.tools.openapi_sources import build_request
from tests.support.egress_policy import allowing
from tests.support.openapi_server import (
    OpenApiService,
    items_document,
    many_operations_document,
    oversized_document,
)


def _compiled(document: dict[str, Any]) -> CompiledDocument:
    return compile_document(json.dumps(document).encode())


def _one(method: str, operation: dict[str, Any]) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "x"},
            "paths": {"/thing": {method: {"operationId": "op", **operation}}}}


@pytest.mark.rule("R-340")
@pytest.mark.parametrize(("method", "effect"), [
    ("get", Capability.READ), ("head", Capability.READ), ("options", Capability.READ),
    ("delete", Capability.SENSITIVE), ("post", Capability.WRITE), ("put", Capability.WRITE),
    ("patch", Capability.WRITE)])
def test_without_an_annotation_the_method_decides_the_effect(method: str,
                                                             effect: Capability) -> None:
    [operation] = _compiled(_one(method, {})).operations
    assert operation.effect is effect


@pytest.mark.rule("R-341", "R-338")
def test_an_explicit_x_effect_decides_and_nothing_else_makes_an_operation_safer() -> None:
    document = _compiled(items_document())
    effects = {op.operation_id: op.effect for op in document.operations}
    assert effects["searchItems"] is Capability.READ          # POST declared read
    assert effects["lookupItems"] is Capability.WRITE         # read-sounding, undeclared
    assert effects["deleteItem"] is Capability.SENSITIVE
    assert effects["createItem"] is Capability.WRITE
    # An x-effect that is not read/write/sensitive is not guessed at: the operation is omitted.
    assert "badEffect" not in effects
    assert ("GET /api/bad-effect", "x-effect is not read, write or sensitive") \
        in document.omitted
    [declared_write] = _compiled(_one("get", {"x-effect": "write"})).operations
    assert declared_write.effect is Capability.WRITE


@pytest.mark.rule("R-347", "R-330", "R-331", "R-328")
def test_operations_that_cannot_be_compiled_exactly_are_omitted_alone() -> None:
    document = _compiled(items_document())
    names = {op.operation_id for op in document.operations}
    reasons = dict(document.omitted)
    assert names == {"getItem", "deleteItem", "createItem", "searchItems", "lookupItems",
                     "followMe", "showHeaders", "hugeText", "brokenRead", "dropRead",
                     "dropWrite", "privateThing"}
    assert "credential" in reasons["POST /api/login"]
    # Authentication compiles into a value-free plan (docs/credentials.md), not an omission.
    assert document.by_id["privateThing"].auth is not None
    assert "header parameter" in reasons["GET /api/needs-header"]     # never model-supplied
    assert "2020-12 meta-schema" in reasons["GET /api/bad-schema"]    # R-328, not repaired
    assert "operationId" in reasons["GET /api/no-id"]
    assert document.omitted_count == len(document.omitted) == 5


@pytest.mark.rule("R-343")
def test_a_header_parameter_never_becomes_an_argument_and_servers_are_ignored() -> None:
    get_item = _compiled(items_document()).by_id["getItem"]
    assert set(get_item.input_schema["properties"]) == {"id", "verbose"}
    assert get_item.input_schema["additionalProperties"] is False
    request = build_request("/base", get_item, {"id": "a/../b?x#y", "verbose": True})
    # The path value is encoded whole: it cannot add a segment, a query or leave the path.
    assert request.path == "/base/api/items/a%2F..%2Fb%3Fx%23y"
    assert request.query == [("verbose", "true")]
    assert not request.has_body


@pytest.mark.rule("R-330")
def test_a_recursive_schema_is_omitted_and_its_siblings_stay() -> None:
    document = {"openapi": "3.0.3", "info": {"title": "x"},
                "paths": {"/a": {"post": {"operationId": "recursive", "requestBody": {
                    "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/Node"}}}}}},
                          "/b": {"get": {"operationId": "fine"}}},
                "components": {"schemas": {"Node": {"type": "object", "properties": {
                    "next": {"$ref": "#/components/schemas/Node"}}}}}}
    compiled = _compiled(document)
    assert [op.operation_id for op in compiled.operations] == ["fine"]
    assert dict(compiled.omitted)["POST /a"] == "input schema: input schema is recursive"


@pytest.mark.rule("R-332")
async def test_parsing_and_compiling_run_off_the_event_loop(tmp_path: Path) -> None:
    """The cache compiles a fetched document in a worker thread: the loop's own thread never
    runs the compiler (observed with a profile hook on every thread, not by replacing it)."""
    threads: set[int] = set()
    code = compile_document.__code__

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            threads.add(threading.get_ident())

    with OpenApiService(tmp_path) as service:
        service.serve("/openapi.json", items_document())
        signer, policy = allowing(tmp_path, [service.origin])
        egress = Egress(EgressPolicy.build(("127.0.0.1/32",), (service.port,),
                                           ca_file=str(service.ca_file)),
                        signer.ceiling(policy))
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            document = await SchemaCache(egress, fresh_s=60, stale_s=0).get(
                service.url("/openapi.json"))
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            await egress.aclose()
    assert document.operations
    assert threads and threading.get_ident() not in threads


@pytest.mark.rule("R-401", "R-329")
def test_at_most_2000_operations_are_admitted() -> None:
    compiled = _compiled(many_operations_document(MAX_OPERATIONS + 5))
    assert len(compiled.operations) == MAX_OPERATIONS
    assert compiled.omitted_count == 5


@pytest.mark.rule("R-401")
def test_a_document_over_16_mib_is_rejected_whole() -> None:
    with pytest.raises(DocumentRejected) as rejected:
        compile_document(oversized_document(16 * 1024 * 1024 + 1))
    assert rejected.value.code == "schema_too_large"


def test_yaml_is_read_but_its_aliases_are_not() -> None:
    yaml_doc = (b"openapi: 3.1.0\ninfo: {title: y}\npaths:\n  /a:\n    get:\n"
                b"      operationId: readA\n")
    assert [op.operation_id for op in compile_document(yaml_doc).operations] == ["readA"]
    bomb = b"openapi: 3.1.0\nx: &a [1, 2]\ny: [*a, *a]\npaths: {}\n"
    with pytest.raises(DocumentRejected) as rejected:
        compile_document(bomb)
    assert rejected.value.code == "schema_unreadable"


@pytest.mark.parametrize("raw", [b"[]", b"{\"openapi\": \"2.0\"}", b"\xff\xfe", b"{not json",
                                 b"{\"swagger\": \"2.0\", \"paths\": {}}"])
def test_a_document_that_is_not_openapi_3_is_rejected(raw: bytes) -> None:
    with pytest.raises(DocumentRejected):
        compile_document(raw)
