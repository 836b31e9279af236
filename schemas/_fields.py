"""Helpers to declare documented pyarrow fields once (field docs live in field metadata)."""
from __future__ import annotations

import pyarrow as pa


def field(name: str, type_: pa.DataType, doc: str, nullable: bool = False) -> pa.Field:
    """A pyarrow field whose metadata carries its documentation under the key ``doc``."""
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


def schema(name: str, doc: str, *fields: pa.Field) -> pa.Schema:
    """A pyarrow schema whose metadata names the table and documents it."""
    return pa.schema(list(fields), metadata={"table": name, "doc": doc})

