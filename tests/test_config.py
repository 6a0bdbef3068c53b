from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneforge import config, parsing
from tuneforge.errors import ConfigError
from tuneforge.settings_schema import SETTINGS, Setting

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


# ------------------------------------------------------------------ settings that cannot work are rejected

_FLOAT_SETTINGS = [s for s in SETTINGS if s.parse is parsing.parse_float]


def test_there_are_float_settings_to_check() -> None:
    assert {"compile_timeout_s", "remote.timeout_s", "autotune.bench_time_s"} <= {s.name for s in _FLOAT_SETTINGS}


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "Infinity", "1e999"])
@pytest.mark.parametrize("setting", _FLOAT_SETTINGS, ids=lambda s: s.name)
def test_non_finite_numbers_are_rejected_for_every_float_setting(monkeypatch: pytest.MonkeyPatch, setting: Setting,
                                                                 text: str) -> None:
    monkeypatch.setenv(setting.env_var, text)
    try:
        with pytest.raises(ConfigError) as info:
            config.reset()
        assert setting.env_var in str(info.value) and setting.name in str(info.value)
    finally:
        monkeypatch.delenv(setting.env_var)
        config.reset()
    with pytest.raises(ConfigError, match=setting.name.replace(".", r"\.")):
        config.set(setting.name, float(text))


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "ftp://user:hunter2@host/0",
                                 "redis://host:notaport/0", "redis:///0", "unix://"])
def test_remote_url_that_cannot_work_is_rejected(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.set("remote.url", url)
    assert "remote.url" in str(info.value) and "TUNEFORGE_REMOTE_URL" in str(info.value)
    assert "hunter2" not in str(info.value)
    monkeypatch.setenv("TUNEFORGE_REMOTE_URL", url)
    try:
        with pytest.raises(ConfigError, match="TUNEFORGE_REMOTE_URL"):
            config.reset()
    finally:
        monkeypatch.delenv("TUNEFORGE_REMOTE_URL")
        config.reset()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://user:pw@cache.example:6380/2",
                                 "unix:///run/redis/redis.sock?db=1", "redis://localhost"])
def test_remote_url_that_can_work_is_accepted(url: str) -> None:
    with config.patch({"remote.url": url}):
        assert config.get("remote.url") == url
    with config.patch({"remote.url": ""}):
        assert config.get("remote.url") is None


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_remote_secret_is_an_error_not_off(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("TUNEFORGE_REMOTE_SECRET", text)
    try:
        with pytest.raises(ConfigError) as info:
            config.reset()
        assert "TUNEFORGE_REMOTE_SECRET" in str(info.value) and "remote.secret" in str(info.value)
        assert "empty" in str(info.value)
    finally:
        monkeypatch.delenv("TUNEFORGE_REMOTE_SECRET")
        config.reset()
    with pytest.raises(ConfigError, match="remote.secret"):
        config.set("remote.secret", text)
    with config.patch({"remote.secret": None}):  # unset stays the way to turn signing off
        assert config.get("remote.secret") is None


def test_rejected_secret_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        config.set("remote.secret", ["hunter2"])
    assert "hunter2" not in str(info.value)


# ------------------------------------------------------------------------------ config show masks secrets

@pytest.mark.parametrize("url,shown", [
    ("redis://user:hunter2@cache.example:6379/0", "redis://user:***@cache.example:6379/0"),
    ("rediss://:hunter2@cache.example/1", "rediss://:***@cache.example/1"),
    ("redis://cache.example:6379/0?password=hunter2&db=3", "redis://cache.example:6379/0?password=***&db=3"),
    ("redis://cache.example:6379/0", "redis://cache.example:6379/0"),
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
])
def test_config_show_masks_the_password_in_remote_url(url: str, shown: str) -> None:
    with config.patch({"remote.url": url, "remote.secret": "hunter2"}):
        infos = {i.name: i.value for i in config.describe()}
        assert infos["remote.url"] == shown and infos["remote.secret"] == "***"
        assert config.get("remote.url") == url  # masked for display only
    proc = run_python("import sys; from tuneforge.cli import run; sys.argv[1:] = ['config', 'show']; run()",
                      env={"TUNEFORGE_REMOTE_URL": url, "TUNEFORGE_REMOTE_SECRET": "hunter2"}, check=False)
    as_json = run_python("import sys; from tuneforge.cli import run; sys.argv[1:] = ['config', 'show', '--json']; "
                         "run()", env={"TUNEFORGE_REMOTE_URL": url, "TUNEFORGE_REMOTE_SECRET": "hunter2"},
                         check=False)
    for result in (proc, as_json):
        assert result.returncode == 0, result.stderr
        assert "hunter2" not in result.stdout + result.stderr
    assert shown in proc.stdout
    assert next(d["value"] for d in json.loads(as_json.stdout) if d["name"] == "remote.url") == shown


def test_masking_a_unix_url_keeps_its_form() -> None:
    assert parsing.mask_url_password("unix:///run/redis.sock?password=hunter2&db=1") == \
        "unix:///run/redis.sock?password=***&db=1"
