"""WAL checkpoints beside the listener: commits that fill the WAL are copied back by
the thread, not by the commit that crosses ``wal_autocheckpoint``.

The writers here turn SQLite's own checkpoints off (``wal_autocheckpoint=0``), so
only the thread can copy the WAL back: the WAL then starts over from its
beginning instead of growing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

import pytest
from django.db import connection
from django.test import override_settings

from approvals import dbwatch, listenhooks, walcheck
from approvals.listener import get_listener

ROW = "x" * 2000  # about half a page: every commit writes a page or two


def _writer(path: str, journal: str = "WAL") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # SQLite itself never checkpoints
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    return conn


def _commit(conn: sqlite3.Connection, n: int) -> None:
    for _ in range(n):
        conn.execute("INSERT INTO t VALUES (?)", (ROW,))


def _wal_size(path: str) -> int:
    return os.path.getsize(path + "-wal")


def _copied_back(checkpointer: walcheck.Checkpointer, at_least: int, timeout: float = 10.0):
    """Wait for a checkpoint begun after the caller's last commit (the second look
    from now) that copied back a whole WAL of ``at_least`` frames; its result."""
    runs = checkpointer.runs
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = checkpointer.last
        if checkpointer.runs >= runs + 2 and last[0] == 0 and last[1] == last[2] >= at_least:
            return last
        time.sleep(0.01)
    raise AssertionError(f"the WAL was not copied back: last checkpoint {checkpointer.last}")


@contextlib.contextmanager
def _running(path_of):
    checkpointer = walcheck.Checkpointer(path_of)
    checkpointer.start()
    try:
        yield checkpointer
    finally:
        checkpointer.stop()
    assert not checkpointer._thread.is_alive()


def test_without_the_thread_the_wal_grows_with_every_commit(tmp_path):
    """The control for the next test: nothing else copies this WAL back."""
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    _commit(conn, 100)
    first = _wal_size(path)
    time.sleep(0.3)
    _commit(conn, 100)
    assert _wal_size(path) > first * 1.8
    conn.close()


def test_the_thread_copies_the_wal_back_and_the_next_commits_reuse_it(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        _commit(conn, 100)
        busy, frames, done = _copied_back(checkpointer, 100)
        assert busy == 0 and frames == done >= 100
        first = _wal_size(path)
        _commit(conn, 100)  # the WAL starts over from its beginning
        assert _wal_size(path) < first * 1.2
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (200,)
    conn.close()
    other = sqlite3.connect(path)  # everything is in the database, and readable
    assert other.execute("SELECT count(*) FROM t").fetchone() == (200,)
    other.close()


def test_it_looks_often_while_commits_come_and_seldom_when_they_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(walcheck, "SLOW", 0.5)
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        deadline = time.monotonic() + 1.0
        runs = checkpointer.runs
        while time.monotonic() < deadline:
            _commit(conn, 1)
            time.sleep(0.005)
        busy_looks = checkpointer.runs - runs
        time.sleep(1.0)  # backing off from the last commit
        runs = checkpointer.runs
        time.sleep(2.0)
        quiet_looks = checkpointer.runs - runs
    conn.close()
    assert busy_looks >= 15  # every FAST (20 ms) while the WAL changes
    assert quiet_looks <= 5  # at most one every SLOW (0.5 s here) once it does not


def test_a_database_without_wal_is_left_as_it_is(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path, journal="DELETE")
    _commit(conn, 10)
    with _running(lambda: path) as checkpointer:
        deadline = time.monotonic() + 5.0
        while checkpointer.runs < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.runs >= 2
        assert checkpointer.last == (0, -1, -1)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not os.path.exists(path + "-wal")
    conn.close()


def test_another_file_named_is_opened_afresh(tmp_path, monkeypatch):
    monkeypatch.setattr(walcheck, "STAT_EVERY", 0.05)
    first, second = str(tmp_path / "one.sqlite3"), str(tmp_path / "two.sqlite3")
    named = [first]
    one, two = _writer(first), _writer(second)
    with _running(lambda: named[0]) as checkpointer:
        _commit(one, 20)
        _copied_back(checkpointer, 20)
        named[0] = second
        _commit(two, 300)  # far more frames than the first file ever held
        _copied_back(checkpointer, 300)
        size = _wal_size(second)
        _commit(two, 300)
        assert _wal_size(second) < size * 1.2
    one.close()
    two.close()


def test_a_failing_look_is_logged_and_the_thread_goes_on(tmp_path, monkeypatch, caplog):
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    real = walcheck.Checkpointer.checkpoint
    failed = []

    def flaky(self, c):
        if not failed:
            failed.append(1)
            raise sqlite3.OperationalError("disk I/O error")
        return real(self, c)

    monkeypatch.setattr(walcheck.Checkpointer, "checkpoint", flaky)
    logged = caplog.at_level("WARNING", logger="approvals.listener")
    with logged, _running(lambda: path) as checkpointer:
        _commit(conn, 50)
        _copied_back(checkpointer, 50)
    assert failed
    assert "WAL checkpoints failed: disk I/O error" in caplog.text
    conn.close()


class _Connection:
    def __init__(self, vendor: str, name: str) -> None:
        self.vendor = vendor
        self.settings_dict = {"NAME": name}


@pytest.mark.parametrize(
    "vendor, name",
    [
        ("sqlite", ":memory:"),
        ("sqlite", "file:memorydb_default?mode=memory&cache=shared"),
        ("sqlite", ""),
        ("postgresql", "toolgate"),
    ],
)
def test_only_an_sqlite_file_gets_one(monkeypatch, vendor, name):
    monkeypatch.setattr(dbwatch, "connections", {"default": _Connection(vendor, name)})
    assert dbwatch.sqlite_path("default") is None
    assert walcheck.start() is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's WAL only")
def test_the_listener_runs_it_on_the_database_and_the_setting_turns_it_off():
    assert listenhooks._starters["checkpoints"] is walcheck.start
    running = [c for c in get_listener()._companions if isinstance(c, walcheck.Checkpointer)]
    assert len(running) == 1
    assert running[0].path() == str(connection.settings_dict["NAME"])
    assert running[0]._thread.is_alive()
    with override_settings(APPROVALS={"SQLITE_CHECKPOINTS": False}):
        assert walcheck.start() is None
    started = walcheck.start()
    try:
        assert isinstance(started, walcheck.Checkpointer)
        deadline = time.monotonic() + 10.0
        # (busy, -1, -1) while another checkpoint runs: the listener's own, say
        while (started.last is None or started.last[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.last is not None and started.last[1] >= 0  # the test database is WAL
    finally:
        started.stop()


def test_a_missing_file_is_not_created_and_is_taken_up_once_it_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(walcheck, "_BACKOFF_MAX", 0.05)
    path = str(tmp_path / "later.sqlite3")
    with _running(lambda: path) as checkpointer:
        time.sleep(0.3)
        assert not os.path.exists(path)
        assert checkpointer.runs == 0
        conn = _writer(path)
        _commit(conn, 30)
        assert _copied_back(checkpointer, 30)[0] == 0
    conn.close()
