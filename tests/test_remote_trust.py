"""The trust boundary of the remote tier, against a real redis-server: the unsigned-remote warning and the
empty-secret error, generated Python code that never comes from Redis and is checked against its
source before it runs, remote artifacts that are intact but unusable, and remote errors that reach
`tuneforge cache stats`."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuneforge import config, warn_once
from tuneforge.store import remote_format, remote_settings, tiers
from tuneforge.store.entry import MANIFEST, make_manifest
from tuneforge.store.remote import RemoteCache

from .redis_server import RedisServer, free_port

redis = pytest.importorskip("redis")
zstandard = pytest.importorskip("zstandard")

pytestmark = pytest.mark.redis

WARNING = "remote artifacts are unsigned: anyone who can write to this server can run code here"
ART = "cppabcdefghijklmnop234567"


def child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose TUNEFORGE_REMOTE_* variables are exactly those of ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFORGE_REMOTE_")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**full, **env}, timeout=120)


def cache_stats(cache_dir: Path, *, as_json: bool) -> Any:
    proc = subprocess.run([sys.executable, "-m", "tuneforge", "cache", "stats", *(["--json"] if as_json else [])],
                          capture_output=True, text=True, check=True, timeout=120,
                          env={**os.environ, "TUNEFORGE_CACHE_DIR": str(cache_dir)})
    return json.loads(proc.stdout) if as_json else proc.stdout


@pytest.fixture(autouse=True)
def _fresh_remotes() -> Iterator[None]:
    """Each test starts with no warning given and with new remote caches (their counters at zero)."""
    warn_once.forget()
    yield
    for cache in list(remote_settings._defaults.values()):
        cache.close()
    remote_settings._defaults.clear()


# ------------------------------------------------------------------------------ unsigned, empty secret

LOOKUPS = """
    from tuneforge import config
    from tuneforge.store import tiers
    for i in range(5):
        tiers.record_tiers.remote_records(f"selection-key-{i:04d}")
    with config.patch({"remote.namespace": "another-team"}):  # a second cache: still one warning
        tiers.record_tiers.remote_records("selection-key-9999")
    print("done")
"""


def test_an_unsigned_remote_warns_once_per_process(redis_clean: str, tmp_path: Path) -> None:
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, "TUNEFORGE_CACHE_DIR": str(tmp_path)}
    proc = child(LOOKUPS, env)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert proc.stderr.count(WARNING) == 1, proc.stderr
    line = next(line for line in proc.stderr.splitlines() if WARNING in line)
    assert "TUNEFORGE_REMOTE_SECRET" in line and "remote.allow_unsigned=true" in line


@pytest.mark.parametrize("extra", [{"TUNEFORGE_REMOTE_ALLOW_UNSIGNED": "1"}, {"TUNEFORGE_REMOTE_SECRET": "s3cret"}],
                         ids=["allow_unsigned", "secret"])
def test_no_unsigned_warning_when_allowed_or_signed(redis_clean: str, tmp_path: Path, extra: dict[str, str]) -> None:
    proc = child(LOOKUPS, {"TUNEFORGE_REMOTE_URL": redis_clean, "TUNEFORGE_CACHE_DIR": str(tmp_path), **extra})
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert "unsigned" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("secret", ["", "   "], ids=["empty", "blank"])
def test_an_empty_secret_is_an_error_not_off(redis_clean: str, tmp_path: Path, secret: str) -> None:
    # Whether parsing the environment or creating the remote cache refuses it, the error names the setting
    # and its variable, and no lookup goes ahead unsigned.
    code = """
        try:
            from tuneforge.store import tiers
            tiers.record_tiers.remote_records("selection-key-0000")
        except Exception as exc:
            print(f"{type(exc).__name__}:", exc)
        else:
            print("no error")
    """
    proc = child(code, {"TUNEFORGE_REMOTE_URL": redis_clean, "TUNEFORGE_REMOTE_SECRET": secret,
                        "TUNEFORGE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ConfigError:"), proc.stdout + proc.stderr
    assert "remote.secret" in proc.stdout and "TUNEFORGE_REMOTE_SECRET" in proc.stdout
    assert "anyone who can write" not in proc.stderr  # it never got as far as an unsigned remote


# ----------------------------------------------------------------------------- generated Python code

SOURCE = "def answer():\n    return 42\n"


def planted_code(marker: Path, source_path: str) -> bytes:
    """A code object that leaves ``marker`` behind and defines answer() wrongly."""
    evil = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\ndef answer():\n    return 666\n"
    return marshal.dumps(compile(evil, source_path, "exec", dont_inherit=True))


@pytest.fixture
def python_loader(cache_dir: Path) -> Iterator[Any]:
    from tuneforge.compile import python

    python._modules.clear()
    yield python
    python._modules.clear()


def test_python_code_is_never_taken_from_redis(python_loader: Any, redis_clean: str, tmp_path: Path) -> None:
    from tuneforge.store.default import default_store

    key = python_loader._key(SOURCE)
    marker = tmp_path / "planted-code-ran"
    source = SOURCE.encode()
    # Compiled for the path the entry would be published at, as a real artifact is.
    code = planted_code(marker, str(default_store().root / "entries" / key[:2] / key / "module.py"))
    files = {"module.py": source, "module.marshal": code}
    table = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}
    meta = {"python": sys.version.split()[0], "source_sha256": hashlib.sha256(source).hexdigest(),
            "code_sha256": hashlib.sha256(code).hexdigest()}
    manifest = make_manifest(key, table, meta, {"artifact": "python", "source_key": key})
    # A complete, consistent and correctly signed artifact: only not reading it keeps it from running.
    writer = RemoteCache(redis_clean, secret="s3cret")
    try:
        writer.put_artifact(key, manifest, files)
        assert writer.flush(10) and writer.stats.puts == 1
    finally:
        writer.close()
    with config.patch({"remote.url": redis_clean, "remote.secret": "s3cret"}):
        module = python_loader.load(SOURCE)
        remote = tiers.remote()
        assert remote is not None
        assert module.answer() == 42 and not marker.exists()
        assert remote.stats.hits + remote.stats.misses + remote.stats.rejected == 0  # Redis was not asked


def test_tampered_marshalled_code_in_the_local_store_is_not_run(python_loader: Any, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from tuneforge.store.default import default_store

    first = python_loader.load(SOURCE)
    assert first.answer() == 42
    entry = default_store().get(first.tuneforge_key)
    assert entry is not None
    marker = tmp_path / "planted-code-ran"
    code_path = entry.path / "module.marshal"
    code_path.write_bytes(planted_code(marker, str(entry.path / "module.py")))
    # The manifest's checksums are made to agree, as in an entry written whole by someone else.
    manifest = json.loads((entry.path / MANIFEST).read_text())
    data = code_path.read_bytes()
    manifest["files"]["module.marshal"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (entry.path / "manifest.tmp").write_text(json.dumps(manifest))
    os.replace(entry.path / "manifest.tmp", entry.path / MANIFEST)

    python_loader._modules.clear()  # as in a new process
    second = python_loader.load(SOURCE)
    assert second.answer() == 42 and not marker.exists()
    assert any("does not match its source" in r.getMessage() for r in caplog.records)
    # The entry was rebuilt from the source: a third load runs the stored code, and it is the right code.
    python_loader._modules.clear()
    rebuilt = default_store().get(first.tuneforge_key)
    assert rebuilt is not None and (rebuilt.path / "module.marshal").read_bytes() != data
    assert python_loader.load(SOURCE).answer() == 42 and not marker.exists()


# -------------------------------------------------------------------------- intact but unusable artifacts

def elf_library() -> bytes:
    import _ctypes

    with open(_ctypes.__file__, "rb") as f:
        return f.read(64) + os.urandom(2000)


UNUSABLE: dict[str, tuple[Any, dict[str, bytes]]] = {
    "meta-not-a-dict": ("a string", {"kernel.so": elf_library()}),
    "output-missing": ({"output": "kernel.so", "module": "tfmod"}, {"source.cpp": b"int x;\n"}),
    "not-elf": ({"output": "kernel.so", "module": "tfmod"}, {"kernel.so": b"MZ" + os.urandom(4000)}),
    "elf-not-a-library": ({"output": "kernel.so", "module": "tfmod"},
                          {"kernel.so": elf_library()[:16] + b"\x01\x00" + elf_library()[18:]}),  # ET_REL
    "module-not-a-string": ({"output": "kernel.so", "module": ["x"]}, {"kernel.so": elf_library()}),
}


def put_raw(redis_url: str, key: str, meta: Any, files: dict[str, bytes], secret: str | None) -> None:
    """Write an artifact whose checksums all match, signed with ``secret`` or unsigned."""
    table = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}
    manifest = make_manifest(key, table, {}, {})
    manifest["meta"] = meta
    body = remote_format.join_artifact(json.dumps(manifest).encode(), files)
    cache = RemoteCache(redis_url, secret=secret)
    try:
        rkey = cache._redis_key("art", key)
        value = remote_format.seal(cache._secret, rkey, body)
    finally:
        cache.close()
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(rkey, value)
    finally:
        client.close()


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["unsigned", "signed"])
@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_intact_but_unusable_remote_artifact_is_a_counted_miss(redis_clean: str, cache_dir: Path, case: str,
                                                                  secret: str | None) -> None:
    from tuneforge.store.default import default_store

    meta, files = UNUSABLE[case]
    put_raw(redis_clean, ART, meta, files, secret)
    with config.patch({"remote.url": redis_clean, "remote.secret": secret, "remote.allow_unsigned": True}):
        remote = tiers.remote()
        assert remote is not None
        # A miss (as cpp.load_module_by_key sees it: back to the build), not an exception, not a published entry
        assert tiers.artifact_tiers.fetch(ART) is None
        assert default_store().get(ART) is None  # nothing of it was published locally
        assert (remote.stats.unusable, remote.stats.hits, remote.stats.rejected) == (1, 0, 0)

        def build(staging: Path) -> dict[str, Any]:
            (staging / "built-here.txt").write_text("local")
            return {"built": "locally"}

        entry = tiers.artifact_tiers.get_or_build(ART, build)
        assert entry.meta.get("built") == "locally" and "fetched_from_remote" not in entry.meta
        assert entry.files == ["built-here.txt"]
        assert remote.stats.unusable == 2
        assert tiers.remote_stats_file().flush()["unusable"] == 2
    text = cache_stats(cache_dir, as_json=False)
    assert any(line.split() == ["remote", "unusable", "entries", "2"] for line in text.splitlines()), text


# --------------------------------------------------------------------------- errors in cache stats

def test_remote_errors_and_timeouts_reach_cache_stats(tmp_path: Path, redis_private: RedisServer) -> None:
    cache_dir = tmp_path / "cache"
    lookup = """
        from tuneforge.store import tiers
        assert tiers.record_tiers.remote_records("selection-key-0000") == []
        assert tiers.record_tiers.remote_records("selection-key-0001") == []  # skipped: the breaker is open
    """
    common = {"TUNEFORGE_CACHE_DIR": str(cache_dir), "TUNEFORGE_REMOTE_ALLOW_UNSIGNED": "1",
              "TUNEFORGE_REMOTE_TIMEOUT_S": "0.3"}
    # A server that is not there (connection refused) ...
    proc = child(lookup, {**common, "TUNEFORGE_REMOTE_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert proc.returncode == 0, proc.stderr
    # ... and one that does not answer in time.
    redis_private.pause(20000)
    proc = child(lookup, {**common, "TUNEFORGE_REMOTE_URL": redis_private.url})
    assert proc.returncode == 0, proc.stderr
    stats = cache_stats(cache_dir, as_json=True)["remote"]
    assert (stats["errors"], stats["skipped"]) == (2, 2), stats
    text = cache_stats(cache_dir, as_json=False)
    assert any(line.split() == ["remote", "errors", "2"] for line in text.splitlines()), text
    assert any(line.split() == ["remote", "lookups", "skipped", "2"] for line in text.splitlines()), text
