"""events.parquet, one row per invitation, written as the run goes with bounded memory.

`[run] events` says which invitations it keeps: all, those whose outcome is not arrived
(nor answered: "failures"), or none (no file). Rows gather in memory up to `ROWS_PER_PART`, then go to a
closed Parquet part file in ``<run>/.events/``; a checkpoint flushes the rows gathered so far and records how many rows
the log holds, so that a resume drops whatever a crash left beyond that count and the log of a
resumed run equals that of an uninterrupted one. At the end of the run the parts are joined
into ``events.parquet`` (row group by row group, never the whole log in memory).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedsim.files import atomic_write
from fedsim.sim.events import OUTCOMES, PHASES, event_columns, failed

ROWS_PER_PART = 1 << 17
SCHEMA = pa.schema([
    ("round", pa.int64()), ("device_id", pa.int64()), ("invited_at", pa.float64()),
    ("started", pa.float64()), ("finished", pa.float64()), ("outcome", pa.string()),
    ("download_s", pa.float64()), ("compute_s", pa.float64()), ("upload_s", pa.float64()),
    ("staleness", pa.int64()), ("steps", pa.int64()), ("samples", pa.int64()),
    ("phase", pa.string()), ("work_s", pa.float64()),
])
NAMED = {"outcome": OUTCOMES, "phase": PHASES}  # columns written as names, kept as codes
# Proportionate on disk (benchmarks/bench_events_log.py): zstd; rows sorted by (round,
# device_id) and device ids delta-encoded; every column dictionary-encoded (a round's times,
# a device's phase seconds, outcomes and phases repeat) but `started` and `finished`, unique
# sums stored byte-stream-split. The logical types stay what readers have always read.
SPLIT = ("started", "finished")
WRITE_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": [f.name for f in SCHEMA if f.name not in (*SPLIT, "device_id")],
    "column_encoding": {"device_id": "DELTA_BINARY_PACKED", **{name: "BYTE_STREAM_SPLIT" for name in SPLIT}},
    "sorting_columns": [pq.SortingColumn(0), pq.SortingColumn(1)],
}


def _table(batches: list[dict], failures_only: bool) -> pa.Table:
    """One Arrow table of several rounds' invitations, each round's by device id (only those
    whose outcome is neither arrived nor answered: `failures_only`); NaN times and staleness -1 become null,
    outcome and phase codes their names."""
    columns = event_columns(batches)
    order = np.lexsort((columns["device_id"], columns["round"]))
    if failures_only:
        order = order[failed(columns["outcome"][order])]
    columns = {name: values[order] for name, values in columns.items()}
    arrays = []
    for field in SCHEMA:
        values = columns[field.name]
        if field.name in NAMED:  # codes -> their names, in Arrow
            codes = pa.DictionaryArray.from_arrays(pa.array(values, pa.int8()), pa.array(NAMED[field.name]))
            arrays.append(codes.cast(pa.string()))
        elif field.name == "staleness":
            arrays.append(pa.array(values, pa.int64(), mask=values < 0))
        elif pa.types.is_floating(field.type):
            arrays.append(pa.array(values, pa.float64(), mask=np.isnan(values)))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of a log written by an earlier fedsim, with the columns it lacks as nulls."""
    if batch.schema.names == SCHEMA.names:
        return batch
    columns = [batch.column(f.name) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
               for f in SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


class EventLog:
    def __init__(self, run_dir: Path, kept: str = "all"):
        """`kept`: `[run] events`, the invitations the log keeps: "all", "failures" (those
        whose outcome is neither arrived nor answered) or "none" (no events.parquet)."""
        self.path = Path(run_dir) / "events.parquet"
        self.spool = Path(run_dir) / ".events"
        self.kept = kept
        self.pending: list[dict] = []
        self.pending_rows = 0
        self.parts = 0
        self.rows = 0  # rows in closed parts

    def add(self, events: dict) -> None:
        """A round's invitations (sim/events.py `task_events`)."""
        n = events.get("n", 0)
        if n and self.kept == "failures":
            n = int(np.count_nonzero(failed(events["outcome"])))
        if not n or self.kept == "none":
            return
        self.pending.append(events)
        self.pending_rows += n
        if self.pending_rows >= ROWS_PER_PART:
            self.flush()

    def flush(self) -> int:
        """Close the gathered rows into a part file; returns the rows the log holds."""
        if self.pending_rows:
            self.spool.mkdir(exist_ok=True)
            table = _table(self.pending, self.kept == "failures")
            atomic_write(self._part(self.parts), lambda tmp: pq.write_table(table, tmp, **WRITE_OPTIONS))
            self.parts += 1
            self.rows += self.pending_rows
            self.pending, self.pending_rows = [], 0
        return self.rows

    def _part(self, k: int) -> Path:
        return self.spool / f"part-{k:06d}.parquet"

    def finish(self) -> None:
        """Join the parts (after any earlier events.parquet of a resumed run) into events.parquet."""
        if self.kept == "none":
            return
        self.flush()
        sources = [self._part(k) for k in range(self.parts)]

        def write(tmp: Path) -> None:
            with pq.ParquetWriter(tmp, SCHEMA, **WRITE_OPTIONS) as writer:
                for source in sources:  # a row group per part: its dictionaries serve 131,072 rows
                    for batch in pq.ParquetFile(source).iter_batches(batch_size=ROWS_PER_PART):
                        writer.write_batch(batch)

        atomic_write(self.path, write)
        shutil.rmtree(self.spool, ignore_errors=True)

    def resume(self, rows: int) -> int:
        """Keep the first `rows` rows of what an earlier run logged as this log's first part,
        streamed batch by batch. The newest log is read: the parts of a run cut short (also of
        a resumed run, whose events.parquet is older), else the rows an earlier resume kept
        (cut before they became a part), else the events.parquet of a run that finished.
        Returns how many of the `rows` were not there (a folder copied while its run wrote
        them: the log then lacks them for good)."""
        if self.kept == "none":
            return 0
        kept = self.spool.with_name(".events-kept.parquet")
        sources = sorted(self.spool.glob("part-*.parquet")) or [p for p in (kept, self.path) if p.exists()][:1]
        left = rows

        def write(tmp) -> None:
            nonlocal left
            left = rows
            with pq.ParquetWriter(tmp, SCHEMA, **WRITE_OPTIONS) as writer:
                for source in sources:
                    for batch in pq.ParquetFile(source).iter_batches():
                        if left > 0:
                            writer.write_batch(_conform(batch.slice(0, left)))
                            left -= min(left, batch.num_rows)

        atomic_write(kept, write)  # a full disk named by its file, as every other write
        shutil.rmtree(self.spool, ignore_errors=True)
        self.spool.mkdir()
        kept.replace(self._part(0))
        self.parts, self.rows = 1, rows - left
        return left
