"""A run folder's logged metrics, from either logger ``cdlm-train`` writes: the CSV logger's
``csv/version_*/metrics.csv`` or a W&B run file (``wandb/*run-*/run-*.wandb``, offline or
synced). Studies read their curves through here, so a study may log to W&B alone.

The W&B reader walks the run file's records itself: since wandb 0.19 the Python package no
longer ships a reader (the Go core writes the file). The file is LevelDB's log format (32 KiB
blocks of CRC-checked records, a record split across blocks as FIRST/MIDDLE/LAST) after a
7-byte ``:W&B`` header; each record is a ``wandb_internal_pb2.Record``, of which the ``history``
ones carry the logged rows.
"""

from __future__ import annotations

import csv
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

STEP = "step"  # Lightning's step column (CSV) and ``trainer/global_step`` (W&B)
_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class LogError(ValueError):
    """A log file that cannot be read (truncated or not a W&B run file)."""


def csv_rows(folder: Path) -> list[dict[str, float]]:
    """Every row of the folder's CSV logs, oldest version first (later versions: resumed)."""
    files = sorted(folder.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:]))
    rows = []
    for path in files:
        with path.open(newline="", encoding="utf-8") as f:
            rows += [
                {k: float(v) for k, v in r.items() if v not in ("", None)}
                for r in csv.DictReader(f)
            ]
    return rows


def wandb_files(folder: Path) -> list[Path]:
    """The W&B run files under ``folder`` (``wandb/offline-run-*`` or ``wandb/run-*``), oldest
    first (a resumed run writes a second one)."""
    return sorted(folder.glob("wandb/*run-*/run-*.wandb"), key=lambda p: p.parent.name)


def _records(data: bytes) -> Iterator[bytes]:
    """The payloads of a LevelDB-format log after its header, reassembled across blocks."""
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, part = struct.unpack("<IHB", data[pos : pos + 7])
        if part == 0 and length == 0:  # zero padding to the block's end
            pos += _BLOCK - pos % _BLOCK
            continue
        payload = data[pos + 7 : pos + 7 + length]
        if len(payload) < length or zlib.crc32(bytes([part]) + payload) != crc:
            return  # the run is still being written, or was cut: what came before stands
        pos += 7 + length
        if part == _FULL:
            yield payload
        elif part == _FIRST:
            pending = payload
        elif part == _MIDDLE:
            pending += payload
        elif part == _LAST:
            yield pending + payload


def wandb_rows(path: Path) -> list[dict[str, float]]:
    """The numeric rows a W&B run file logged (``run.log``), ``trainer/global_step`` as
    ``step``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if not data.startswith(b":W&B"):
        raise LogError(f"{path}: not a W&B run file")
    rows = []
    for payload in _records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            value = json.loads(item.value_json)
            if isinstance(value, int | float) and not key.startswith("_"):
                row["step" if key == "trainer/global_step" else key] = float(value)
        rows.append(row)
    return rows


def rows(folder: Path) -> list[dict[str, float]]:
    """The folder's logged rows: its CSV log where there is one, else its W&B run files."""
    found = csv_rows(folder)
    if found:
        return found
    return [row for path in wandb_files(folder) for row in wandb_rows(path)]


def last_values(logged: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's last logged value."""
    out: dict[str, float] = {}
    for row in logged:
        out |= row
    return out


def curve(logged: list[dict[str, float]], name: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every row that logged ``name``."""
    return [(int(r.get(STEP, -1)), r[name]) for r in logged if name in r]
