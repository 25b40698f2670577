"""WAL checkpoints beside the listener: commits that fill the WAL are copied back by
the thread, not by the commit that crosses ``wal_autocheckpoint``.

The writers here turn SQLite's own checkpoints off (``wal_autocheckpoint=0``), so
only the thread can copy the WAL back: the WAL then starts over from its
beginning instead of growing. Each test runs with inotify (on Linux) and without.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

import pytest
from django.db import connection
from django.test import override_settings

from approvals import dbwatch, gate, listenhooks, walcheck
from approvals import listener as listener_module
from approvals.listener import get_listener

ROW = "x" * 2000  # about half a page: every commit writes a page or two


@pytest.fixture(autouse=True, params=["inotify", "poll"])
def mode(request, monkeypatch):
    """Copy back from 10 frames on (a few commits here); with and without inotify."""
    monkeypatch.setattr(walcheck, "MIN_FRAMES", 10)
    if request.param == "poll":
        monkeypatch.setattr(walcheck.inotify, "watch_directory", lambda directory, names: None)
    elif not walcheck.inotify.watch_directory(str(os.getcwd()), []):
        pytest.skip("no inotify here")
    return request.param


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


def _copied_back(checkpointer: walcheck.Checkpointer, path: str, at_least: int):
    """Wait until the thread copied back a WAL of ``at_least`` frames, leaving fewer
    than ``MIN_FRAMES`` behind; the last checkpoint's result."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        last = checkpointer.last
        behind = walcheck.frames_behind(path)
        whole = last and last[0] == 0 and last[1] == last[2] >= at_least
        if whole and behind is not None and behind < walcheck.MIN_FRAMES:
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
        busy, frames, done = _copied_back(checkpointer, path, 100)
        assert busy == 0 and frames == done >= 100
        first = _wal_size(path)
        _commit(conn, 100)  # the WAL starts over from its beginning
        assert _wal_size(path) < first * 1.2
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (200,)
    conn.close()
    other = sqlite3.connect(path)  # everything is in the database, and readable
    assert other.execute("SELECT count(*) FROM t").fetchone() == (200,)
    other.close()


def test_it_looks_often_while_commits_come_and_seldom_when_they_stop(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(walcheck, "SLOW", 0.5)
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        deadline = time.monotonic() + 1.0
        looks = checkpointer.looks
        while time.monotonic() < deadline:
            _commit(conn, 1)
            time.sleep(0.005)
        busy_looks = checkpointer.looks - looks
        time.sleep(1.0)  # backing off from the last commit
        looks = checkpointer.looks
        time.sleep(2.0)
        quiet_looks = checkpointer.looks - looks
        assert checkpointer.mode == mode
    conn.close()
    assert busy_looks >= 15  # up to one every FAST (20 ms) while the WAL grows
    # Then none with inotify (nothing writes the -wal); polling, one every SLOW at most.
    assert quiet_looks <= (0 if mode == "inotify" else 5)


def test_a_few_pages_are_left_for_later(tmp_path, monkeypatch):
    """A WAL of a few pages (a heartbeat) is not copied back: that would write the
    database file, which wakes every process's watcher. Enough pages are."""
    monkeypatch.setattr(walcheck, "MIN_FRAMES", 100)
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        _commit(conn, 5)
        deadline = time.monotonic() + 5.0
        while checkpointer.looks < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert checkpointer.looks >= 1 and checkpointer.runs == 0
        assert walcheck.frames_behind(path) >= 5
        _commit(conn, 100)
        _copied_back(checkpointer, path, 100)
    conn.close()


def test_frames_behind_reads_what_sqlite_counts(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    assert walcheck.frames_behind(path) is None  # no database yet
    conn = _writer(path)
    _commit(conn, 30)
    behind = walcheck.frames_behind(path)
    other = sqlite3.connect(path, isolation_level=None)
    assert other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone() == (0, behind, behind)
    assert walcheck.frames_behind(path) == 0
    _commit(conn, 3)  # the WAL starts over: three commits, three frames or more behind
    assert 3 <= walcheck.frames_behind(path) < behind
    other.close()
    conn.close()
    rollback = str(tmp_path / "rollback.sqlite3")
    _commit(_writer(rollback, journal="DELETE"), 3)
    assert walcheck.frames_behind(rollback) is None  # no wal-index at all
    with open(tmp_path / "odd.sqlite3-shm", "wb") as odd:
        odd.write(bytes(200))  # not a wal-index SQLite wrote
    assert walcheck.frames_behind(str(tmp_path / "odd.sqlite3")) is None


def test_a_database_without_wal_is_left_as_it_is(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path, journal="DELETE")
    with _running(lambda: path) as checkpointer:
        _commit(conn, 50)
        time.sleep(0.5)
        assert checkpointer.runs == 0
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not os.path.exists(path + "-wal")
    conn.close()


def test_another_file_named_is_opened_afresh(tmp_path, monkeypatch):
    monkeypatch.setattr(walcheck, "FALLBACK", 0.2)  # a name set in settings is not a file event
    first, second = str(tmp_path / "one.sqlite3"), str(tmp_path / "two.sqlite3")
    named = [first]
    one, two = _writer(first), _writer(second)
    with _running(lambda: named[0]) as checkpointer:
        _commit(one, 20)
        _copied_back(checkpointer, first, 20)
        named[0] = second
        _commit(two, 300)  # far more frames than the first file ever held
        _copied_back(checkpointer, second, 300)
        size = _wal_size(second)
        _commit(two, 300)
        assert _wal_size(second) < size * 1.2
    one.close()
    two.close()


def test_a_file_replaced_under_it_is_opened_afresh(tmp_path, mode):
    """A restored backup: another database file renamed onto the name."""
    path = str(tmp_path / "db.sqlite3")
    old = _writer(path)
    _commit(old, 20)
    old.close()  # the last connection: SQLite copies the WAL back and removes it
    with _running(lambda: path) as checkpointer:
        deadline = time.monotonic() + 5.0
        while checkpointer.mode == "" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.mode == mode
        restored = str(tmp_path / "restored.sqlite3")
        _writer(restored).close()
        os.replace(restored, path)
        conn = _writer(path)
        _commit(conn, 100)
        _copied_back(checkpointer, path, 100)
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (100,)
    conn.close()


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
        _copied_back(checkpointer, path, 50)
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
    listener = get_listener()
    runs = running[0].runs
    try:
        for _ in range(20):  # a few hundred pages: the WAL is copied back
            listener.unregister(gate.begin_tool_decision("walcheck", gate.new_approval_id()))
        deadline = time.monotonic() + 10.0
        while running[0].runs == runs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert running[0].runs > runs
    finally:
        listener_module.shutdown()  # its threads must not outlive this test's database
    assert not running[0]._thread.is_alive()


def test_a_missing_file_is_not_created_and_is_taken_up_once_it_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(walcheck, "_BACKOFF_MAX", 0.05)
    path = str(tmp_path / "later.sqlite3")
    with _running(lambda: path) as checkpointer:
        time.sleep(0.3)
        assert not os.path.exists(path)
        assert checkpointer.runs == 0
        conn = _writer(path)
        _commit(conn, 30)
        assert _copied_back(checkpointer, path, 30)[0] == 0
    conn.close()
