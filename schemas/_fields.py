"""Helpers to declare documented pyarrow fields once (field docs live in field metadata)."""
from __future__ import annotations

import pyarrow as pa


def field(name: str, type_: pa.DataType, doc: str, nullable: bool = False) -> pa.Field:
    """A pyarrow field whose metadata carries its documentation under the key ``doc``."""
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


def schema(name: str, doc: str, *fields: pa.Field) -> pa.Schema:
    """A pyarrow schema whose metadata names the table and documents it."""
    return pa.schema(list(fields), metadata={"table": name, "doc": doc})


def describe(s: pa.Schema) -> str:
    """Markdown table of a schema's fields (used by the README and `replaylake schema`)."""
    lines = [f"### `{s.metadata[b'table'].decode()}` — {s.metadata[b'doc'].decode()}", "",
             "| column | type | nullable | meaning |", "| --- | --- | --- | --- |"]
    for f in s:
        doc = (f.metadata or {}).get(b"doc", b"").decode()
        lines.append(f"| `{f.name}` | `{f.type}` | {'yes' if f.nullable else 'no'} | {doc} |")
    return "\n".join(lines)
