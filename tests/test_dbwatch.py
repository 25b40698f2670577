"""The SQLite watcher: a commit on another connection kicks, even after the file is replaced.

On Linux it sleeps on inotify until the database's files change; elsewhere (or
without inotify) it polls ``data_version``. Both must deliver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from approvals import dbwatch, inotify

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")

_WRITER = """import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
conn.execute("INSERT INTO t VALUES (2)")
conn.close()
"""


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


def _write_in_another_process(path: str) -> None:
    subprocess.run([sys.executable, "-c", _WRITER, path], check=True, timeout=60)


def _wait_for(kicks: threading.Event, timeout: float = 10.0) -> None:
    assert kicks.wait(timeout)
    kicks.clear()


def _settled(watcher: _FileWatcher, timeout: float = 20.0) -> None:
    """Wait until the watcher sleeps on the file events and stays asleep a while
    (the events of its own opening read and done with)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watcher.parked.wait(1.0):
            events = watcher.events
            time.sleep(0.5)
            if watcher.parked.is_set() and watcher.events == events:
                return
    raise AssertionError("the watcher never settled on the file events")


@contextlib.contextmanager
def _running(tmp_path):
    """A watcher on a fresh database file in ``tmp_path``: ``(path, kicks, watcher)``,
    stopped on the way out."""
    path = str(tmp_path / "db.sqlite3")
    _write(path)
    kicks = threading.Event()
    watcher = _FileWatcher(path, kicks.set)
    watcher.start()
    try:
        yield path, kicks, watcher
    finally:
        watcher.stop()


@pytest.fixture
def no_inotify(monkeypatch):
    monkeypatch.setattr(dbwatch.inotify, "watch_directory", lambda directory, names: None)


@linux_only
def test_on_linux_a_commit_in_another_process_wakes_it_through_inotify(tmp_path, monkeypatch):
    monkeypatch.setattr(dbwatch, "FALLBACK", 3600.0)  # only a file event can end its sleep
    with _running(tmp_path) as (path, kicks, watcher):
        _wait_for(kicks)  # the first look after opening
        _settled(watcher)
        assert watcher.mode == "inotify"
        kicks.clear()
        events = watcher.events
        _write_in_another_process(path)
        _wait_for(kicks, 30.0)
        assert watcher.events > events
        _settled(watcher)  # and again: it sleeps between commits, and wakes for the next
        _write_in_another_process(path)
        _wait_for(kicks, 30.0)
    assert not watcher._thread.is_alive()  # stop ends the sleep (an hour long here)


@linux_only
def test_after_an_event_it_keeps_looking_until_data_version_moves(tmp_path, monkeypatch):
    """A WAL commit writes the -wal file (an event), then the -shm (none): the first
    look after the event may see nothing yet, so it must look again without events."""
    monkeypatch.setattr(dbwatch, "FALLBACK", 3600.0)
    real, last, frozen, stale_reads = dbwatch.data_version, [0], threading.Event(), []

    def lagging(conn: sqlite3.Connection) -> int:
        if threading.current_thread() is not watcher._thread:  # this process's listener's
            return real(conn)
        if frozen.is_set():
            stale_reads.append(1)
            return last[0]
        last[0] = real(conn)
        return last[0]

    monkeypatch.setattr(dbwatch, "data_version", lagging)
    with _running(tmp_path) as (path, kicks, watcher):
        _wait_for(kicks)
        _settled(watcher)
        monkeypatch.setattr(dbwatch, "BURST", 60.0)  # a slow machine still looks 3 times
        frozen.set()  # as if the -shm lagged behind every write to the -wal
        _write_in_another_process(path)
        deadline = time.monotonic() + 20
        while len(stale_reads) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(stale_reads) >= 3 and not kicks.is_set()
        frozen.clear()  # the wal-index caught up, with no event of its own
        _wait_for(kicks)


@linux_only
def test_once_the_change_is_seen_it_sleeps_on_the_events_again(tmp_path, monkeypatch):
    """An idle process's watcher wakes for each heartbeat written elsewhere: once
    the change an event announced is seen it polls only ``SETTLED`` more (not a
    whole ``BURST``), and the next commit still wakes it through its own event."""
    with _running(tmp_path) as (path, kicks, watcher):
        _wait_for(kicks)
        if watcher.mode != "inotify":
            pytest.skip("no inotify here (the limits reached?)")
        _settled(watcher)
        monkeypatch.setattr(dbwatch, "BURST", 60.0)  # an unexplained event: a minute of polls
        for _ in range(2):
            _write_in_another_process(path)
            _wait_for(kicks)
            watcher.parked.clear()
            assert watcher.parked.wait(10), "still polling after the change was seen"


@pytest.mark.usefixtures("no_inotify")
def test_without_inotify_it_polls_and_a_commit_elsewhere_still_kicks(tmp_path):
    with _running(tmp_path) as (path, kicks, watcher):
        _wait_for(kicks)
        assert watcher.mode == "poll"
        time.sleep(0.3)
        kicks.clear()
        _write_in_another_process(path)
        _wait_for(kicks)
        assert watcher.events == 0


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_a_commit_elsewhere_kicks_and_a_replaced_file_is_reopened(tmp_path, monkeypatch, mode):
    if mode == "poll":
        monkeypatch.setattr(dbwatch.inotify, "watch_directory", lambda directory, names: None)
    elif not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux's")
    monkeypatch.setattr(dbwatch, "_STAT_EVERY", 0.05)
    monkeypatch.setattr(dbwatch, "FALLBACK", 3600.0)
    with _running(tmp_path) as (path, kicks, watcher):
        _wait_for(kicks)  # the first look after opening
        assert watcher.mode == mode
        time.sleep(0.3)
        kicks.clear()
        _write(path)
        _wait_for(kicks)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        _write(path)  # a new file at the same path
        _wait_for(kicks)  # reopened: it looks once
        time.sleep(0.3)
        kicks.clear()
        _write(path)
        _wait_for(kicks)


class _FakeLibc:
    def __init__(self, init: int = 1000, add: int = 1) -> None:
        self.init, self.add = init, add

    def inotify_init1(self, flags: int) -> int:
        return self.init

    def inotify_add_watch(self, fd: int, path: bytes, mask: int) -> int:
        return self.add


def test_no_inotify_means_none_said_once(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(inotify, "_told", False)
    caplog.set_level(logging.DEBUG, logger="approvals.listener")
    monkeypatch.setattr(inotify, "_libc", lambda: _FakeLibc(init=-1))  # EMFILE, say
    assert inotify.watch_directory(str(tmp_path), ["db"]) is None
    read_end, write_end = os.pipe()
    os.close(write_end)
    monkeypatch.setattr(inotify, "_libc", lambda: _FakeLibc(init=read_end, add=-1))  # ENOSPC
    assert inotify.watch_directory(str(tmp_path), ["db"]) is None
    with pytest.raises(OSError):
        os.fstat(read_end)  # the instance closed
    said = [r for r in caplog.records if "no inotify" in r.getMessage()]
    assert len(said) == 1


def test_not_linux_means_none(monkeypatch, tmp_path):
    monkeypatch.setattr(inotify.sys, "platform", "darwin")
    try:
        found = inotify.watch_directory(str(tmp_path), ["db"])
    finally:
        monkeypatch.undo()
    assert found is None


@linux_only
def test_only_the_named_files_count(tmp_path):
    files = inotify.watch_directory(str(tmp_path), ["db", "db-wal"])
    assert files is not None
    try:
        (tmp_path / "other").write_bytes(b"x")
        (tmp_path / "db-shm").write_bytes(b"x")
        started = time.monotonic()
        assert files.wait(0.3) is False
        assert time.monotonic() - started >= 0.29  # other names do not end the wait
        (tmp_path / "db-wal").write_bytes(b"x")
        assert files.wait(10.0) is True
        assert files.wait(0.0) is False  # all read
        files.interrupt()
        assert files.wait(3600.0) is False  # interrupted, not a change
    finally:
        files.close()
    files.interrupt()  # closed: nothing happens


@linux_only
def test_a_busy_neighbour_costs_one_look_per_pause(tmp_path):
    files = inotify.watch_directory(str(tmp_path), ["db", "db-wal"])
    assert files is not None
    done = threading.Event()

    def neighbour() -> None:
        with open(tmp_path / "app.log", "ab", buffering=0) as log:
            while not done.is_set():
                log.write(b"x")
                time.sleep(0.0005)

    writer = threading.Thread(target=neighbour)
    writer.start()
    try:
        assert files.wait(1.0, pause=0.1) is False
        assert files.looks <= 20  # about 10; without the pause, one per write
        threading.Timer(0.3, (tmp_path / "db-wal").write_bytes, [b"x"]).start()
        assert files.wait(30.0, pause=0.1) is True  # a watched name still counts
    finally:
        done.set()
        writer.join()
        files.close()
