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

from approvals import daemon, dbwatch, gate, listenhooks, walcheck
from approvals import listener as listener_module
from approvals.listener import get_listener

ROW = "x" * 2000  # about half a page: every commit writes a page or two


@pytest.fixture(autouse=True, params=["inotify", "poll"])
def mode(request, monkeypatch):
    """With and without inotify."""
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


def _copied_back(checkpointer: walcheck.Checkpointer, at_least: int):
    """Wait until the thread's checkpoints copied back a whole WAL of ``at_least``
    frames and it stays so (no commit left for a later look); the result."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        last = checkpointer.last
        if last and last[0] == 0 and last[1] == last[2] >= at_least:
            time.sleep(0.3)  # a look still due (FAST after the last -wal write)
            if checkpointer.last[1] == checkpointer.last[2]:
                return checkpointer.last
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


def test_a_trickle_of_commits_gets_a_few_large_checkpoints_and_quiet_gets_none(
    tmp_path, monkeypatch, mode
):
    """Each checkpoint syncs two files: commits every 5 ms get a checkpoint every
    second or so (not one per look), all of them copied back in the end."""
    monkeypatch.setattr(walcheck, "SLOW", 0.5)
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        deadline, commits = time.monotonic() + 2.0, 0
        while time.monotonic() < deadline:
            _commit(conn, 1)
            commits += 1
            time.sleep(0.005)
        busy_runs = checkpointer.runs
        _copied_back(checkpointer, 1)
        time.sleep(1.0)  # its spacing and the last look over
        looks = checkpointer.looks
        time.sleep(2.0)
        quiet_looks = checkpointer.looks - looks
        assert checkpointer.mode == mode
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (commits,)
    conn.close()
    assert commits > 150
    assert 2 <= busy_runs <= 15  # one per look (20 ms) would be ~100
    # Then none with inotify (nothing writes the -wal); polling, one every SLOW at most.
    assert quiet_looks <= (0 if mode == "inotify" else 5)


def test_checkpoints_are_spaced_to_copy_about_target_frames_each():
    fast, slow = walcheck.FAST, walcheck.SLOW
    assert walcheck._spacing(fast, 1) == 2 * fast  # small: at most doubled
    spacing = fast
    for _ in range(20):
        spacing = walcheck._spacing(spacing, 1)
    assert spacing == slow
    assert walcheck._spacing(slow, 100_000) == slow / 2  # large: at most halved
    assert walcheck._spacing(fast, 100_000) == fast
    assert walcheck._spacing(0.1, walcheck.TARGET_FRAMES) == pytest.approx(0.1)
    assert walcheck._pause(0.1, 1) == 0.1
    assert walcheck._pause(slow, walcheck.TARGET_FRAMES) == slow
    assert walcheck._pause(slow, 3) == walcheck.QUIET_GAP  # a heartbeat now and then
    assert walcheck._copied(None, (0, 30, 30)) == 30
    assert walcheck._copied((0, 30, 30), (0, 80, 80)) == 50
    assert walcheck._copied((0, 300, 300), (0, 20, 20)) == 20  # the WAL started over
    assert walcheck._copied((0, 30, 30), (1, -1, -1)) == 0  # busy: another checkpoint ran


def test_a_wake_with_no_commit_copies_nothing(tmp_path, monkeypatch, mode):
    """Its own checkpoint writes the database file (which wakes it with inotify),
    and polling wakes it anyway: neither is a commit, so neither copies."""
    monkeypatch.setattr(walcheck, "SLOW", 0.05)
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path)
    with _running(lambda: path) as checkpointer:
        _commit(conn, 50)
        _copied_back(checkpointer, 50)
        runs, looks = checkpointer.runs, checkpointer.looks
        time.sleep(1.0)
        assert checkpointer.runs == runs
        if mode == "poll":
            assert checkpointer.looks > looks  # it looked, and found no commit
        _commit(conn, 1)
        deadline = time.monotonic() + 5.0
        while checkpointer.runs == runs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.runs == runs + 1
    conn.close()


def test_a_database_without_wal_is_left_as_it_is(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    conn = _writer(path, journal="DELETE")
    with _running(lambda: path) as checkpointer:
        _commit(conn, 50)
        deadline = time.monotonic() + 5.0
        while checkpointer.last is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpointer.last == (0, -1, -1)  # no WAL: nothing to copy back
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
        _copied_back(checkpointer, 20)
        named[0] = second
        _commit(two, 300)  # far more frames than the first file ever held
        _copied_back(checkpointer, 300)
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
        _copied_back(checkpointer, 100)
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
    # A listener of its own: one that earlier tests kept busy with a few small
    # commits may be in its 30-second quiet gap.
    listener_module.shutdown()
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
    monkeypatch.setattr(daemon, "_BACKOFF_MAX", 0.05)
    path = str(tmp_path / "later.sqlite3")
    with _running(lambda: path) as checkpointer:
        time.sleep(0.3)
        assert not os.path.exists(path)
        assert checkpointer.runs == 0
        conn = _writer(path)
        _commit(conn, 30)
        assert _copied_back(checkpointer, 30)[0] == 0
    conn.close()
