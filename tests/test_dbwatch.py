"""The SQLite watcher: a commit on another connection kicks, even after the file is replaced."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from approvals import dbwatch


class _FileWatcher(dbwatch.SqliteWatcher):
    def __init__(self, path: str, on_change) -> None:
        super().__init__("default", on_change, lambda: True)
        self.path = path

    def _path(self) -> str:
        return self.path


def _write(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.close()


def _wait_for(kicks: threading.Event, timeout: float = 5.0) -> None:
    assert kicks.wait(timeout)
    kicks.clear()


def test_a_commit_elsewhere_kicks_and_a_replaced_file_is_reopened(tmp_path, monkeypatch):
    monkeypatch.setattr(dbwatch, "_STAT_EVERY", 0.05)
    path = str(tmp_path / "db.sqlite3")
    _write(path)
    kicks = threading.Event()
    watcher = _FileWatcher(path, kicks.set)
    watcher.start()
    try:
        _wait_for(kicks)  # the first look after opening
        time.sleep(0.1)
        kicks.clear()
        _write(path)
        _wait_for(kicks)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        _write(path)  # a new file at the same path
        _wait_for(kicks)  # reopened: it looks once
        time.sleep(0.1)
        kicks.clear()
        _write(path)
        _wait_for(kicks)
    finally:
        watcher.stop()
