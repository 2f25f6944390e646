"""A participant's event log: one JSON object per line in `<data-dir>/events.jsonl`, appended as things happen.

Invariant: each line is a complete JSON object with `t` (unix seconds), `cpu` (the process's CPU seconds so
far, `time.process_time()`, so a run can tell what each role spent) and `kind`, written with a single
`write` of the whole line and flushed, so a reader tailing the file (the devnet's live view and report)
sees whole events only, and a process killed at any moment leaves every earlier event intact.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

EVENTS_FILE = "events.jsonl"


class EventLog:
    def __init__(self, folder: Path | None):
        self.path = folder / EVENTS_FILE if folder is not None else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, kind: str, **fields: object) -> None:
        if self.path is None:
            return
        line = json.dumps({"t": round(time.time(), 4), "cpu": round(time.process_time(), 3), "kind": kind,
                           **fields}, default=str) + "\n"
        with self._lock, self.path.open("a") as handle:
            handle.write(line)


def read_events(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """Whole events from byte `offset` on, and the offset after the last whole line."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn line can only come from a foreign writer; skip it
    return events, offset + end


def iter_events(path: Path) -> Iterator[dict]:
    yield from read_events(path)[0]
