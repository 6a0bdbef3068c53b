"""A damaged or read-only cache degrades, it never breaks a selection (issue 11, items 5, 6 and 14).

Damage is real: SQLite files are truncated, have a page overwritten, or get a bad row through raw
sqlite3; a read-only cache is a real read-only bind mount (as root, where permission bits do not stop
writes) or ``chmod -R a-w`` (as anyone else), used by a fresh process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tuneforge
from tuneforge.store.artifacts import ArtifactStore
from tuneforge.store.records import Record, RecordDB, RecordError

from .conftest import run_python

# ------------------------------------------------------------------------------------------ helpers


def _record(i: int, key: str = "") -> Record:
    return Record(key=key or f"key{i // 4:05d}", choice=f"choice{i % 4}", op="gemm" if i % 2 else "conv",
                  choice_name=f"c{i % 4}", status="ok", median_ms=1.0 + i, min_ms=1.0, mean_ms=1.0 + i,
                  count=3, error="x" * 300, params={"i": i}, info={"note": "y" * 100})


def _filled(path: Path, n: int = 600) -> Path:
    with RecordDB(path) as db:
        db.put_many(_record(i) for i in range(n))
    return path


def _full_scan_fails(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        conn.execute('SELECT * FROM records ORDER BY "key", "choice"').fetchall()
        conn.execute('SELECT * FROM records WHERE "op" = \'gemm\' ORDER BY "key", "choice"').fetchall()
        return False
    except sqlite3.DatabaseError:
        return True
    finally:
        conn.close()


def _garble_a_middle_page(path: Path) -> None:
    """Overwrite one page near the middle with garbage, choosing one that the table scan reads."""
    data = path.read_bytes()
    page = 4096
    pages = len(data) // page
    for index in sorted(range(1, pages), key=lambda i: abs(i - pages // 2)):
        damaged = bytearray(data)
        damaged[index * page:(index + 1) * page] = (b"\xde\xad\xbe\xef garbage " * 300)[:page]
        path.write_bytes(bytes(damaged))
        if _full_scan_fails(path):
            return
    raise AssertionError("no page of the test database breaks a table scan")


def _truncate_to_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)
    assert _full_scan_fails(path)


def _not_a_database(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"this is no longer an SQLite file" * 4)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tuneforge")]


DAMAGE: dict[str, Callable[[Path], None]] = {"truncated": _truncate_to_half, "garbled page": _garble_a_middle_page,
                                              "not a database": _not_a_database}

# ------------------------------------------------------------------------------ a damaged database


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_is_moved_aside_and_a_fresh_one_serves(tmp_path: Path, damage: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = _filled(tmp_path / "records.sqlite")
    DAMAGE[damage](path)
    damaged_bytes = path.read_bytes()
    caplog.set_level(logging.WARNING, logger="tuneforge")
    with RecordDB(path) as db:
        assert db.records() == []  # answered from a fresh database, not an exception
        db.put(_record(1))
        assert [r.choice for r in db.get("key00000")] == ["choice1"]
    aside = list(tmp_path.glob("records.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damaged_bytes  # kept for inspection
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and str(path) in warnings[0] and str(aside[0]) in warnings[0], warnings
    with RecordDB(path) as db:  # the fresh file is a good database
        assert len(db.records()) == 1


def test_clear_repairs_a_damaged_file(tmp_path: Path) -> None:
    path = _filled(tmp_path / "records.sqlite")
    _garble_a_middle_page(path)
    with RecordDB(path) as db:
        db.clear()
        assert db.count() == 0
    assert not _full_scan_fails(path)
    assert len(list(tmp_path.glob("records.sqlite.corrupt-*"))) == 1


def test_the_wal_of_a_damaged_file_never_sits_beside_a_free_name(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Between moving a damaged file aside and moving its WAL, a process opening the name would make a
    fresh database beside the old WAL, which SQLite may take for its own: the WAL must go first."""
    path = _filled(tmp_path / "records.sqlite")
    _garble_a_middle_page(path)
    other = sqlite3.connect(path)  # another user of the damaged file: its WAL stays while it is open
    try:
        other.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
        assert Path(f"{path}-wal").exists()
        states: list[tuple[bool, bool]] = []  # (the name is taken, its -wal exists) after each rename
        rename = os.rename

        def watched_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
            rename(src, dst)
            states.append((os.path.exists(path), os.path.exists(f"{path}-wal")))

        monkeypatch.setattr(os, "rename", watched_rename)
        with RecordDB(path) as db:
            assert db.records() == []
            db.put(_record(1))
        monkeypatch.undo()
        assert states and (False, True) not in states, states
        aside = [p for p in tmp_path.glob("records.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
        assert len(aside) == 1 and Path(f"{aside[0]}-wal").exists()  # kept with its file, for inspection
        with RecordDB(path) as db:
            assert [r.choice for r in db.records()] == ["choice1"]
    finally:
        other.close()


def test_no_process_opens_the_database_while_another_moves_it_aside(tmp_path: Path) -> None:
    path = _filled(tmp_path / "records.sqlite", n=8)
    lock = tmp_path / "records.sqlite.quarantine.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.read()  # until the test closes stdin
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RecordError, match="quarantine.lock"):
            RecordDB(path, timeout_s=0.5).records()
        waiting = RecordDB(path, timeout_s=120)
        done: list[int] = []
        opener = threading.Thread(target=lambda: done.append(len(waiting.records())))
        opener.start()
        opener.join(0.5)
        assert not done, "opened the database while another process held its quarantine lock"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    opener.join(120)
    assert done == [8]
    waiting.close()


@pytest.mark.parametrize(("column", "value"), [("info", "{not json"), ("params", "[1, 2"), ("status", "bogus"),
                                               ("median_ms", "fast")])
def test_a_bad_row_is_skipped_with_one_warning(tmp_path: Path, column: str, value: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    path = _filled(tmp_path / "records.sqlite", n=40)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f'UPDATE records SET "{column}" = ? WHERE "key" = ? AND "choice" = ?',
                     (value, "key00002", "choice1"))
    conn.close()
    caplog.set_level(logging.WARNING, logger="tuneforge")
    with RecordDB(path) as db:
        for _ in range(3):  # `records list` and selections read again and again: one warning
            assert len(db.records()) == 39
            assert [r.choice for r in db.get("key00002")] == ["choice0", "choice2", "choice3"]
        assert db.get_choice("key00002", "choice1") is None
        best = db.best("key00002")
        assert best is not None and best.choice == "choice0"
        assert db.import_bundle({"format": "tuneforge-records", "version": 1,
                                 "records": [_record(9, "key00002").to_json()]}) == 1  # replaces the bad row
        assert len(db.get("key00002")) == 4
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "key00002" in warnings[0] and "choice1" in warnings[0], warnings
    assert list(tmp_path.glob("*.corrupt-*")) == []  # a bad row is not a damaged file


def _gemm_operands(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((24, 40)).astype(dtype), rng.standard_normal((40, 16)).astype(dtype)


@pytest.mark.parametrize("damage", ["truncated", "not a database", "bad row"])
def test_gemm_answers_with_a_damaged_records_db(gemm_tuning: Path, damage: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    from tuneforge.kernels.gemm import clear_dispatch
    from tuneforge.store.default import default_records, records_path
    from tuneforge.tune.select import clear_memo

    a, b = _gemm_operands("float32")
    np.testing.assert_allclose(tuneforge.gemm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    path = records_path()
    default_records().close()
    if damage == "bad row":
        conn = sqlite3.connect(path)
        with conn:
            changed = conn.execute("UPDATE records SET info = '{oops' WHERE choice = (SELECT MIN(choice) FROM records)")
            assert changed.rowcount == 1
        conn.close()
    elif damage == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    else:
        _not_a_database(path)
    clear_memo()
    clear_dispatch()
    caplog.set_level(logging.WARNING, logger="tuneforge")
    np.testing.assert_allclose(tuneforge.gemm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0]
    if damage != "bad row":
        assert "moved it to" in warnings[0] and len(list(path.parent.glob("records.db.corrupt-*"))) == 1
    assert default_records().records()  # a good database again, with the records of this selection


# ------------------------------------------------------------------------------ a read-only cache


@functools.cache
def _read_only_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = Path(tempfile.mkdtemp(prefix="tuneforge-ro-probe-"))
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && ! touch "$1/x"',
                               "sh", str(probe)], capture_output=True, timeout=30)
        return proc.returncode == 0 and not (probe / "x").exists()
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_read_only(root: Path, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh process that sees ``root`` read-only."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
        try:
            return run_python(code, env=env)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)
    if not _read_only_mount_works():
        pytest.skip("running as root, where chmod does not stop writes, and a read-only bind mount "
                    "(unshare --mount) is not permitted here: cannot make a read-only cache")
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root),
                           sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


_COLLECT_WARNINGS = """
import json, logging
warnings = []
class _Collect(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("tuneforge").addHandler(_Collect(level=logging.WARNING))
"""


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_read_only_cache_serves_the_tuned_answer_and_builds_misses_elsewhere(gemm_tuning: Path,
                                                                              tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    tune = f"""
        import numpy as np, tuneforge
        from tuneforge import config
        rng = np.random.default_rng(7)
        def gemm(dtype):
            a, b = rng.standard_normal((24, 40)).astype(dtype), rng.standard_normal((40, 16)).astype(dtype)
            with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2,
                              autotune_log={str(log)!r}):
                c = tuneforge.gemm(a, b)
            assert np.allclose(c, a @ b, rtol=1e-4, atol=1e-4), "wrong result"
    """
    tune = textwrap.dedent(tune)
    run_python(tune + "gemm('float32')\n")
    before = _snapshot(gemm_tuning)
    assert "records.db" in before
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = run_read_only(gemm_tuning, _COLLECT_WARNINGS + tune + textwrap.dedent("""
        gemm('float32')  # tuned before: answered from the read-only cache
        gemm('float64')  # never tuned: built and measured, kept in the overlay
        from tuneforge.store.default import default_records
        print(json.dumps({"warnings": warnings, "records": default_records().count()}))
    """), env={"TMPDIR": str(tmp)})
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(out["warnings"]) == 1, out["warnings"]
    assert str(gemm_tuning) in out["warnings"][0] and "read-only" in out["warnings"][0]
    assert "Traceback" not in child.stderr and "WARNING" not in child.stderr.replace(out["warnings"][0], "")
    sources = [json.loads(line)["source"] for line in log.read_text().splitlines()]
    assert sources == ["tuned", "records", "tuned"]
    assert _snapshot(gemm_tuning) == before  # nothing written into the shared cache
    overlay = tmp / f"tuneforge-overlay-{os.geteuid()}"
    assert list(overlay.glob("*/artifacts/entries/*/*/manifest.json")), "the miss was not built in the overlay"
    assert list(overlay.glob("*/records.db"))
    assert out["records"] > RecordDB(gemm_tuning / "records.db").count()  # the overlay's rows are merged in


def test_read_only_record_db_and_store_read_and_keep_writes_elsewhere(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    db_path = _filled(cache / "records.db", n=20)
    store = ArtifactStore(cache / "artifacts")
    store.put("ab12cd34ef56", {"lib.so": b"library bytes"})
    del store
    before = _snapshot(cache)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = _COLLECT_WARNINGS + textwrap.dedent(f"""
        import sys
        from tuneforge.store.artifacts import ArtifactStore, StoreError
        from tuneforge.store.records import Record, RecordDB, RecordError
        db = RecordDB({str(db_path)!r})
        assert len(db.records()) == 20 and db.count() == 20
        db.put(Record(key="key00000", choice="new", op="gemm", choice_name="n", status="ok", median_ms=0.5))
        assert [r.choice for r in db.get("key00000")] == ["choice0", "choice1", "choice2", "choice3", "new"]
        assert db.best("key00000").choice == "new" and db.count() == 21 and "key00000" in db.keys()
        try:
            db.clear()
            raise SystemExit("clear() on a read-only database did not refuse")
        except RecordError as exc:
            assert "read-only" in str(exc) and {str(db_path)!r} in str(exc), exc
        store = ArtifactStore({str(cache / "artifacts")!r})
        assert store.get("ab12cd34ef56").file("lib.so").read_bytes() == b"library bytes"
        built = store.get_or_build("cd34ef56ab12", lambda d: (d / "x.so").write_bytes(b"new") and None)
        assert store.get("cd34ef56ab12").path == built.path and store.contains("cd34ef56ab12")
        assert store.put("ef56ab12cd34", {{"y": b"put"}}).file("y").read_bytes() == b"put"
        assert store.cleanup_temp() == 0 and store.stats().hits == 2
        for doing in (store.prune, store.clear):
            try:
                doing()
                raise SystemExit(f"{{doing.__name__}} on a read-only store did not refuse")
            except StoreError as exc:
                assert "read-only" in str(exc), exc
        store.flush_stats()
        print(json.dumps(warnings))
    """)
    child = run_read_only(cache, code, env={"TMPDIR": str(tmp)})
    warnings = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(warnings) == 1 and str(cache) in warnings[0], warnings
    assert _snapshot(cache) == before


# ------------------------------------------------------------------------------ store statistics


@pytest.mark.parametrize("content", [b"\x00\xff{garbage", b'["a", "list"]',
                                     b'{"hits": "many", "bytes": "lots", "puts": 3, "misses": 2.5}',
                                     b'{"hits": 1, "bytes": -5}'])
def test_corrupt_stats_file_is_recounted_from_the_entries(tmp_path: Path, content: bytes,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    store = ArtifactStore(tmp_path / "store")
    for i, size in enumerate((100, 2000, 30000)):
        store.put(f"key{i}abcdefgh", {"blob": os.urandom(size)})
    good = store.stats()
    assert good.entries == 3 and good.bytes > 32100
    (tmp_path / "store" / "stats.json").write_bytes(content)
    caplog.set_level(logging.WARNING, logger="tuneforge")
    fresh = ArtifactStore(tmp_path / "store")
    stats = fresh.stats()
    assert stats.entries == 3 and stats.bytes == good.bytes
    if b"puts" in content:
        assert stats.puts == 3  # a good counter beside bad ones is kept
    warnings = _warnings(caplog)
    assert warnings and all("stats.json" in w for w in warnings)
    fresh.get("key0abcdefgh")
    fresh.flush_stats()  # the next write repairs the file
    assert json.loads((tmp_path / "store" / "stats.json").read_text())["bytes"] == good.bytes


def test_a_corrupt_stats_file_of_a_read_only_store_is_repaired_once(tmp_path: Path) -> None:
    """A read-only store cannot rewrite its damaged stats.json: the repair (a scan of every entry) and its
    warning must not come back with every flush and every `cache stats`."""
    cache = tmp_path / "shared"
    store = ArtifactStore(cache / "artifacts")
    for i, size in enumerate((100, 2000, 30000)):
        store.put(f"key{i}abcdefgh", {"blob": os.urandom(size)})
    good = store.stats()
    del store
    (cache / "artifacts" / "stats.json").write_bytes(b"\x00\xff{garbage")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = _COLLECT_WARNINGS + textwrap.dedent(f"""
        from tuneforge.store.artifacts import ArtifactStore
        store = ArtifactStore({str(cache / "artifacts")!r})
        for _ in range(3):
            assert store.get("key0abcdefgh") is not None
            store.flush_stats()
        stats = store.stats()
        again = ArtifactStore({str(cache / "artifacts")!r}).stats()  # `cache stats` in the same process
        print(json.dumps({{"warnings": warnings, "hits": stats.hits, "bytes": [stats.bytes, again.bytes]}}))
    """)
    child = run_read_only(cache, code, env={"TMPDIR": str(tmp)})
    out = json.loads(child.stdout.strip().splitlines()[-1])
    about_stats = [w for w in out["warnings"] if "stats.json" in w]
    assert len(about_stats) == 1 and "corrupt" in about_stats[0], out["warnings"]
    assert len(out["warnings"]) == 2  # and the one that the cache is read-only
    assert out["hits"] == 3 and out["bytes"] == [good.bytes, good.bytes]
