"""Stamps rows with arrival sequence numbers and time, and writes them to the lake (if any)."""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from pipeline.lake import LakeWriter
from schemas import LAKE_TABLES

_HISTORY_ONLY = ("metrics",)


class Journal:
    """The single source of `seq`: every accepted row and decision gets the next number."""

    def __init__(self, lake: LakeWriter | None, next_seq: int = 0):
        self.lake = lake
        self.next_seq = next_seq

    def record(self, table: str, rows: pa.Table) -> pa.Table:
        """Stamp ``rows`` (the lake schema minus seq/ts), write them durably, return them stamped.

        A failed write raises and changes nothing in memory; its seq numbers are burnt, so rows a
        failed write may have left on disk can never be mistaken for later ones."""
        n = rows.num_rows
        schema = LAKE_TABLES[table]
        now_us = int(time.time() * 1e6)
        # typed straight from numpy (no cast kernel): this runs once per producer call
        now = pa.array(np.full(n, now_us, dtype=np.int64), type=schema.field("ts").type)
        seq = pa.array(np.arange(self.next_seq, self.next_seq + n, dtype=np.int64))
        stamped = pa.Table.from_arrays(
            [seq if f.name == "seq" else now if f.name == "ts" else rows.column(f.name)
             for f in schema], schema=schema)
        try:
            if self.lake is not None:
                self.lake.append(table, stamped)
        finally:
            self.next_seq += n   # even when the write failed: a seq number is never reused
        return stamped

    def record_rows(self, table: str, rows: list[dict]) -> pa.Table | None:
        """`record` for a few python rows (decisions, metrics, events). Without a lake, history
        rows (metrics) only take their seq numbers: nothing in memory reads them."""
        if self.lake is None and table in _HISTORY_ONLY:
            self.next_seq += len(rows)
            return None
        schema = LAKE_TABLES[table]
        fields = [f for f in schema if f.name not in ("seq", "ts")]
        data = {f.name: pa.array([r.get(f.name) for r in rows], type=f.type) for f in fields}
        return self.record(table, pa.table(data))
