from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneforge import config
from tuneforge.errors import ConfigError

from .conftest import run_python


@pytest.mark.parametrize("text,expected", [("1", True), ("TRUE", True), ("yes", True), ("On", True),
                                           ("0", False), ("false", False), ("No", False), ("OFF", False)])
def test_boolean_environment_values(monkeypatch: pytest.MonkeyPatch, text: str, expected: bool) -> None:
    monkeypatch.setenv("TUNEFORGE_CPP_OPENMP", text)
    config.reset()
    try:
        assert config.get("cpp.openmp") is expected
        assert config.source("cpp.openmp") == "env"
    finally:
        monkeypatch.delenv("TUNEFORGE_CPP_OPENMP")
        config.reset()


@pytest.mark.parametrize("var,text,fragment", [
    ("TUNEFORGE_CPP_OPENMP", "maybe", "'maybe'"),
    ("TUNEFORGE_COMPILE_THREADS", "two", "'two'"),
    ("TUNEFORGE_COMPILE_THREADS", "0", ">= 1"),
    ("TUNEFORGE_CACHE_MAX_BYTES", "lots", "'lots'"),
    ("TUNEFORGE_CPP_OPT_LEVEL", "9", "'9'"),
    ("TUNEFORGE_CPP_MARCH", "native", "native"),
    ("TUNEFORGE_LOG_LEVEL", "LOUD", "'LOUD'"),
])
def test_bad_environment_value_names_variable_and_value(monkeypatch: pytest.MonkeyPatch, var: str, text: str,
                                                        fragment: str) -> None:
    monkeypatch.setenv(var, text)
    try:
        with pytest.raises(ConfigError) as info:
            config.reset()
        assert var in str(info.value)
        assert fragment in str(info.value)
    finally:
        monkeypatch.delenv(var)
        config.reset()


def test_environment_is_read_at_import(tmp_path: Path) -> None:
    out = run_python("""
        from tuneforge import config
        print(config.cache_max_bytes, config.cpp.flags, config.source("cpp.flags"), config.compile_threads)
    """, env={"TUNEFORGE_CACHE_MAX_BYTES": "2G", "TUNEFORGE_CPP_FLAGS": "-DX=1 '-DY=a b'",
              "TUNEFORGE_COMPILE_THREADS": "3", "TUNEFORGE_CACHE_DIR": str(tmp_path)}).stdout.split(" ", 1)
    assert out[0] == str(2 * 2**30)
    assert out[1].strip() == "('-DX=1', '-DY=a b') env 3"


def test_import_fails_on_bad_environment_value() -> None:
    proc = run_python("import tuneforge", env={"TUNEFORGE_DEBUG": "perhaps"}, check=False)
    assert proc.returncode != 0
    assert "TUNEFORGE_DEBUG" in proc.stderr and "'perhaps'" in proc.stderr


def test_unknown_setting_suggests_close_match() -> None:
    with pytest.raises(ConfigError, match="did you mean 'compile_threads'"):
        config.get("compile_thread")
    with pytest.raises(ConfigError, match="did you mean 'cpp.openmp'"):
        config.patch({"cpp.opnmp": True})
    with pytest.raises(AttributeError):
        _ = config.no_such_setting


def test_patch_restores_after_exception() -> None:
    before = config.get("cpp.flags"), config.source("cpp.flags")
    with pytest.raises(RuntimeError), config.patch(cpp_flags=["-DA"], compile_threads=7):
        assert config.cpp.flags == ("-DA",)
        assert config.compile_threads == 7
        assert config.source("compile_threads") == "patch"
        raise RuntimeError("boom")
    assert (config.get("cpp.flags"), config.source("cpp.flags")) == before
    assert config.compile_threads != 7


def test_patch_as_decorator_and_nested() -> None:
    @config.patch({"cpp.openmp": True})
    def inner() -> bool:
        with config.patch(cpp_openmp=False):
            assert config.cpp.openmp is False
        return bool(config.cpp.openmp)

    assert inner() is True
    assert config.cpp.openmp is False


def test_patch_validates_before_applying() -> None:
    with pytest.raises(ConfigError, match="compile_threads"):
        config.patch(compile_threads=-1)
    with pytest.raises(ConfigError, match="cpp.flags"):
        config.patch(cpp_flags=[1, 2])


def test_assignment_is_validated() -> None:
    with config.patch(compile_threads=2):
        config.compile_threads = 5
        assert config.get("compile_threads") == 5
        with pytest.raises(ConfigError, match="compile_threads"):
            config.compile_threads = "many"
        config.cpp.opt_level = "-O2"
        assert config.cpp.opt_level == "2"
    config.cpp.opt_level = "3"


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    with config.patch({"cpp.flags": ["-DFOO=1"], "cpp.openmp": True, "cache_max_bytes": 123456}):
        document = config.save(path)
        assert document["settings"]["cpp.flags"] == ["-DFOO=1"]
    assert config.cpp.flags == ()
    snapshot = {n: (config.get(n), config.source(n)) for n in ("cpp.flags", "cpp.openmp", "cache_max_bytes")}
    try:
        config.load(path)
        assert config.cpp.flags == ("-DFOO=1",)
        assert config.cpp.openmp is True
        assert config.cache_max_bytes == 123456
        assert config.source("cpp.openmp") == "file"
    finally:
        for name, (value, _) in snapshot.items():
            config.set(name, value)
        config.reset()


def test_load_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(bad)
    bad.write_text(json.dumps({"format": "tuneforge-config", "version": 1, "settings": {"cpp.cflags": []}}))
    with pytest.raises(ConfigError, match="did you mean 'cpp.flags'"):
        config.load(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="not a tuneforge config file"):
        config.load(bad)


def test_environment_beats_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "tuneforge-config", "version": 1,
                                "settings": {"compile_threads": 4, "cpp.opt_level": "1"}}))
    out = run_python("""
        from tuneforge import config
        print(config.compile_threads, config.source("compile_threads"), config.cpp.opt_level,
              config.source("cpp.opt_level"))
    """, env={"TUNEFORGE_CONFIG": str(path), "TUNEFORGE_COMPILE_THREADS": "2"}).stdout.split()
    assert out == ["2", "env", "1", "file"]


def test_cache_key_hash_ignores_debug_and_logging_settings() -> None:
    base = config.cache_key_hash()
    with config.patch(debug=True, log_level="DEBUG", compile_threads=9, cache_max_bytes=10**6):
        assert config.cache_key_hash() == base
    with config.patch(cpp_flags=["-DZ"]):
        assert config.cache_key_hash() != base
    with config.patch(cpp_opt_level="2"):
        assert config.cache_key_hash() != base


def test_every_setting_declares_cache_key_role_and_env_var() -> None:
    infos = config.describe()
    assert {i.name for i in infos} >= {"cache_dir", "cache_max_bytes", "compile_threads", "compile_timeout_s",
                                       "cpp.cxx", "cpp.flags", "cpp.openmp", "cpp.march"}
    for info in infos:
        assert info.env_var == "TUNEFORGE_" + info.name.replace(".", "_").upper()
        assert info.doc
    assert not any(i.in_cache_key for i in infos if i.name in ("debug", "log_level", "cache_dir"))
