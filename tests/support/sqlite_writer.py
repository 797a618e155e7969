"""Where a ``SqliteStore``'s writer thread is: for tests that cut a run while its checkpoint waits for the file."""

from __future__ import annotations

import sys
import threading


def writer_holds_a_write() -> bool:
    """Whether the store's writer thread has taken a write and is in its transaction (waiting for SQLite's lock)."""
    writers = {t.ident for t in threading.enumerate() if t.name.startswith("fsm_agent writer")}
    for ident, frame in sys._current_frames().items():  # where the writer thread is, only read
        if ident in writers:
            while frame is not None:
                if frame.f_code.co_name == "_transaction":
                    return True
                frame = frame.f_back
    return False
