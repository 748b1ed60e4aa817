"""An OpenAPI 3.1 description of the HTTP surface (Connect's unary protocol, JSON codec),
generated from the proto's descriptors and comments, never written by hand.

`make proto` runs this module on proto/memsvc/v1/memory.proto (protoc with source info, so
the comments become descriptions) and writes memsvc/v1/openapi.json beside the stubs; a test
regenerates it and fails on drift; the HTTP listener serves it at /openapi.json. Schemas
follow the proto3 JSON mapping: lowerCamelCase names (the proto names are accepted too),
int64 as a string or a number, enums by name.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

FDP = descriptor_pb2.FieldDescriptorProto
# proto3 JSON of each scalar type
SCALARS: dict[int, dict[str, Any]] = {
    FDP.TYPE_STRING: {"type": "string"},
    FDP.TYPE_BOOL: {"type": "boolean"},
    FDP.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
    FDP.TYPE_DOUBLE: {"type": "number"},
    FDP.TYPE_FLOAT: {"type": "number", "format": "float"},
    FDP.TYPE_INT32: {"type": "integer", "format": "int32"},
    FDP.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FDP.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FDP.TYPE_UINT32: {"type": "integer", "format": "int32", "minimum": 0},
    FDP.TYPE_FIXED32: {"type": "integer", "format": "int32", "minimum": 0},
    # 64-bit integers: strings in replies (JSON numbers lose precision past 2^53)
    FDP.TYPE_INT64: {"type": ["string", "integer"], "format": "int64"},
    FDP.TYPE_SINT64: {"type": ["string", "integer"], "format": "int64"},
    FDP.TYPE_SFIXED64: {"type": ["string", "integer"], "format": "int64"},
    FDP.TYPE_UINT64: {"type": ["string", "integer"], "format": "uint64"},
    FDP.TYPE_FIXED64: {"type": ["string", "integer"], "format": "uint64"},
}
CONNECT_ERROR = {
    "type": "object",
    "description": "Connect's error JSON: the gRPC status as a lower-case code, its message,"
    " and google.rpc details (BadRequest field violations, ErrorInfo reason, RetryInfo).",
    "properties": {
        "code": {"type": "string", "description": "e.g. invalid_argument, unavailable"},
        "message": {"type": "string"},
        "details": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "description": "e.g. google.rpc.BadRequest"},
                    "value": {"type": "string", "description": "the message, base64"},
                },
            },
        },
    },
    "required": ["code"],
}


def comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    """Leading comments by descriptor path (message 4,i; field 4,i,2,j; enum 5,i; ...),
    without paragraphs addressed to the proto's maintainers."""
    out = {}
    for loc in file.source_code_info.location:
        paragraphs = [" ".join(p.split()) for p in loc.leading_comments.split("\n\n")]
        text = " ".join(p for p in paragraphs if p and "make proto" not in p)
        if text:
            out[tuple(loc.path)] = text
    return out


def _field_schema(
    field: descriptor_pb2.FieldDescriptorProto,
    maps: dict[str, descriptor_pb2.DescriptorProto] | None = None,
) -> dict[str, Any]:
    entry = (maps or {}).get(field.type_name.split(".")[-1])
    if entry is not None:  # map<K, V>: a JSON object of V by key
        value = next(f for f in entry.field if f.name == "value")
        return {"type": "object", "additionalProperties": _field_schema(value)}
    if field.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM):
        schema: dict[str, Any] = {"$ref": f"#/components/schemas/{field.type_name.split('.')[-1]}"}
    else:
        schema = dict(SCALARS[field.type])
    if field.label == FDP.LABEL_REPEATED:
        return {"type": "array", "items": schema}
    return schema


def document(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """The OpenAPI document of `file`'s one service (its version: the package's, v1)."""
    described_at = comments(file)
    schemas: dict[str, Any] = {"ConnectError": CONNECT_ERROR}
    for i, message in enumerate(file.message_type):
        properties = {}
        maps = {n.name: n for n in message.nested_type if n.options.map_entry}
        for j, field in enumerate(message.field):
            schema = _field_schema(field, maps)
            described = described_at.get((4, i, 2, j), "")
            if described:
                # a $ref takes no siblings in older tools: wrap it
                schema = (
                    {"allOf": [schema], "description": described}
                    if "$ref" in schema
                    else {**schema, "description": described}
                )
            properties[field.json_name] = schema
        schemas[message.name] = {
            "type": "object",
            "description": described_at.get((4, i), ""),
            "properties": properties,
        }
    for i, enum in enumerate(file.enum_type):
        names = [v.name for v in enum.value]
        values = "; ".join(
            f"{v.name}: {described_at[(5, i, 2, k)]}"
            for k, v in enumerate(enum.value)
            if (5, i, 2, k) in described_at
        )
        schemas[enum.name] = {
            "type": "string",
            "enum": names,
            "description": " ".join(x for x in (described_at.get((5, i), ""), values) if x),
        }
    [service] = file.service
    package = f"{file.package}.{service.name}"
    paths: dict[str, Any] = {}
    for k, method in enumerate(service.method):
        request, response = method.input_type.split(".")[-1], method.output_type.split(".")[-1]
        paths[f"/{package}/{method.name}"] = {
            "post": {
                "operationId": method.name,
                "summary": described_at.get((6, 0, 2, k), method.name),
                "tags": [service.name],
                "parameters": [
                    {
                        "name": "Connect-Timeout-Ms",
                        "in": "header",
                        "required": False,
                        "description": "the call's deadline in milliseconds (1 to 10 digits)",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                    },
                },
                "responses": {
                    "200": {
                        "description": response,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{response}"}
                            }
                        },
                    },
                    "default": {
                        "description": "an error, with the HTTP status Connect assigns to it",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ConnectError"}
                            }
                        },
                    },
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "memsvc HTTP API (Connect protocol, JSON)",
            "version": file.package.rpartition(".")[2],
            "description": described_at.get((12,), "")
            or "Every memsvc.v1.MemoryService RPC as POST /memsvc.v1.MemoryService/<Method>.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # with authentication on; a server without a tokens file takes calls without it
        "security": [{"bearer": []}, {}],
    }


def descriptor(proto: Path, include: Path) -> descriptor_pb2.FileDescriptorProto:
    """protoc's descriptor of `proto`, with source info (its comments)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "fds.binpb"
        argv = [
            "protoc",
            f"-I{include}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            str(proto),
        ]
        if protoc.main(argv) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    [file] = files.file
    return file


def generate(proto: Path, include: Path) -> str:
    """The document as JSON text."""
    return json.dumps(document(descriptor(proto, include)), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    """python -m memsvc.transports.http.openapi PROTO INCLUDE_DIR > openapi.json"""
    proto, include = sys.argv[1:3]
    sys.stdout.write(generate(Path(proto), Path(include)))


if __name__ == "__main__":
    main()
