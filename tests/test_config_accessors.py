"""The typed setting accessors (config.get_float, get_path, ...): every setting, every accessor.

The expected type of each setting is read from the schema itself (the return type its coerce function
declares), and returned values are checked against it structurally here, not through the module under test.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tuneforge import config, config_values
from tuneforge.errors import ConfigError
from tuneforge.settings_schema import SETTINGS, Setting

# Declared type -> the accessor that must read it. test_every_declared_type_has_an_accessor keeps it whole.
EXPECTED_ACCESSOR: dict[object, str] = {
    bool: "get_bool", int: "get_int", float: "get_float", str: "get_str", str | None: "get_optional_str",
    Path: "get_path", Path | None: "get_optional_path", tuple[str, ...]: "get_strs",
    tuple[int, ...]: "get_ints", tuple[Path, ...]: "get_paths",
}
ACCESSOR_NAMES = sorted(set(EXPECTED_ACCESSOR.values()))


def declared_type(setting: Setting) -> object:
    return typing.get_type_hints(setting.coerce)["return"]


def accessor(name: str) -> Callable[[str], Any]:
    fn: Callable[[str], Any] = getattr(config, name)
    return fn


def conforms(value: object, declared: object) -> bool:
    """Whether `value` is exactly of `declared` type: a float is no int, a bool no int, a list no tuple."""
    args = typing.get_args(declared)
    if typing.get_origin(declared) is tuple:
        return type(value) is tuple and all(conforms(v, args[0]) for v in value)
    if args:  # X | None
        return any(conforms(value, arg) for arg in args)
    if declared is type(None):
        return value is None
    if declared is Path:
        return isinstance(value, Path)  # PosixPath / WindowsPath
    return type(value) is declared


def by_setting() -> Any:
    return pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])


def test_every_declared_type_has_an_accessor() -> None:
    missing = {s.name: declared_type(s) for s in SETTINGS if declared_type(s) not in EXPECTED_ACCESSOR}
    assert not missing, f"settings whose type no accessor reads: {missing}"


def test_accessors_are_exported_from_config() -> None:
    assert set(config_values.ACCESSORS.values()) == set(ACCESSOR_NAMES)
    assert set(ACCESSOR_NAMES) <= set(config.__all__)


@by_setting()
def test_matching_accessor_returns_the_default_typed(setting: Setting) -> None:
    declared = declared_type(setting)
    default = setting.coerce(setting.default_value())
    assert conforms(default, declared), f"{setting.name}: default {default!r} is not a {declared}"
    with config.patch({setting.name: setting.default_value()}):
        value = accessor(EXPECTED_ACCESSOR[declared])(setting.name)
    assert value == default
    assert conforms(value, declared)


@by_setting()
def test_every_other_accessor_raises_type_error(setting: Setting) -> None:
    right = EXPECTED_ACCESSOR[declared_type(setting)]
    for wrong in ACCESSOR_NAMES:
        if wrong == right:
            continue
        with pytest.raises(TypeError) as caught:
            accessor(wrong)(setting.name)
        message = str(caught.value)
        assert repr(setting.name) in message and f"config.{right}()" in message, message


@pytest.mark.parametrize("name", ACCESSOR_NAMES)
def test_unknown_setting_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="compile_timeout"):
        accessor(name)("compile_timeout")


@pytest.mark.parametrize("name,given,expected", [
    ("compile_timeout_s", 7, 7.0),
    ("compile_threads", "3", 3),
    ("debug", "yes", True),
    ("cache_dir", "/tmp/tf-accessor-test", Path("/tmp/tf-accessor-test")),
    ("autotune.log", "", None),
    ("autotune.log", "/tmp/tf-log.jsonl", Path("/tmp/tf-log.jsonl")),
    ("cpp.cxx", "", None),
    ("cpp.cxx", "clang++", "clang++"),
    ("cpp.flags", "-g -DX='a b'", ("-g", "-DX=a b")),
    ("cpp.include_dirs", ["/a", Path("/b")], (Path("/a"), Path("/b"))),
    ("autotune.worker_cpus", [2, 0], (2, 0)),
    ("autotune.statistic", "MIN", "min"),
])
def test_patched_values_come_back_typed(name: str, given: object, expected: object) -> None:
    setting = next(s for s in SETTINGS if s.name == name)
    with config.patch({name: given}):
        value = accessor(EXPECTED_ACCESSOR[declared_type(setting)])(name)
    assert value == expected
    assert conforms(value, declared_type(setting))


@pytest.mark.parametrize("var,text,name,expected", [
    ("TUNEFORGE_COMPILE_TIMEOUT_S", "7", "compile_timeout_s", 7.0),
    ("TUNEFORGE_CACHE_MAX_BYTES", "2G", "cache_max_bytes", 2 * 2**30),
    ("TUNEFORGE_AUTOTUNE_VERIFY", "off", "autotune.verify", False),
    ("TUNEFORGE_AUTOTUNE_WORKER_CPUS", "0,3", "autotune.worker_cpus", (0, 3)),
    ("TUNEFORGE_CPP_INCLUDE_DIRS", os.pathsep.join(["/x", "/y"]), "cpp.include_dirs", (Path("/x"), Path("/y"))),
    ("TUNEFORGE_REMOTE_NAMESPACE", "team-a", "remote.namespace", "team-a"),
])
def test_environment_values_come_back_typed(monkeypatch: pytest.MonkeyPatch, var: str, text: str, name: str,
                                            expected: object) -> None:
    setting = next(s for s in SETTINGS if s.name == name)
    monkeypatch.setenv(var, text)
    config.reset()
    try:
        assert config.source(name) == "env"
        value = accessor(EXPECTED_ACCESSOR[declared_type(setting)])(name)
    finally:
        monkeypatch.delenv(var)
        config.reset()
    assert value == expected
    assert conforms(value, declared_type(setting))


# Values the settings never hold after coercion, given to the checks directly: an accessor that passed
# its value through unchecked would return them.
@pytest.mark.parametrize("check,name,raw", [
    (config_values.as_bool, "debug", 1),
    (config_values.as_int, "compile_threads", True),
    (config_values.as_int, "compile_threads", 2.0),
    (config_values.as_float, "compile_timeout_s", "7"),
    (config_values.as_float, "compile_timeout_s", False),
    (config_values.as_str, "kernel_isa", None),
    (config_values.as_optional_str, "cpp.cxx", Path("g++")),
    (config_values.as_path, "cache_dir", "/tmp"),
    (config_values.as_optional_path, "autotune.log", "/tmp/log"),
    (config_values.as_strs, "cpp.flags", "-g"),
    (config_values.as_strs, "cpp.flags", ("-g", 3)),
    (config_values.as_ints, "autotune.worker_cpus", (0, True)),
    (config_values.as_paths, "bundles", ("/a.bundle",)),
])
def test_a_value_of_the_wrong_type_is_refused(check: Callable[[str, object], object], name: str, raw: object) -> None:
    with pytest.raises(TypeError, match=repr(name)):
        check(name, raw)


def test_an_int_value_reads_as_a_float() -> None:
    value = config_values.as_float("compile_timeout_s", 7)
    assert value == 7.0 and type(value) is float


def test_a_list_value_reads_as_a_tuple() -> None:
    assert config_values.as_ints("autotune.worker_cpus", [1, 2]) == (1, 2)


def test_a_refused_value_is_not_echoed() -> None:
    # remote.secret: the error may end up in a log, so it names the type only.
    with pytest.raises(TypeError) as caught:
        config_values.as_optional_str("remote.secret", b"hunter2-secret")
    assert "hunter2" not in str(caught.value) and "bytes" in str(caught.value)


def test_a_setting_of_a_type_no_accessor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def coerce_set(value: Any) -> frozenset[str]:
        return frozenset(value)

    monkeypatch.setitem(config_values._COERCERS, "test.unreadable", coerce_set)
    with pytest.raises(TypeError, match="no typed accessor"):
        config_values.accessor_for("test.unreadable")
