"""tuneforge settings: typed values with defaults, environment overrides, patching, save/load.

Read a value with the accessor of its type (``get_float("compile_timeout_s")``, ``get_strs("cpp.flags")``,
see `config_values.py`), or untyped as an attribute (``config.cpp.flags``) or with ``get("cpp.flags")``.
Precedence, lowest first: default < file (``load()`` or ``$TUNEFORGE_CONFIG``) < environment
(``TUNEFORGE_<GROUP>_<NAME>``, read at import) < ``set()`` / assignment < ``patch()``.
The declarations live in `settings_schema.py`.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tuneforge import config_values as _typed
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import ConfigError
from tuneforge.settings_schema import SETTINGS, Setting

__all__ = [
    "ConfigError", "SettingInfo", "cache_key_hash", "describe", "get", "get_bool", "get_float", "get_int",
    "get_ints", "get_optional_path", "get_optional_str", "get_path", "get_paths", "get_str", "get_strs", "load",
    "names", "patch", "reset", "save", "set",
]

FILE_FORMAT = "tuneforge-config"
FILE_VERSION = 1
CONFIG_FILE_ENV = "TUNEFORGE_CONFIG"

_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
_GROUPS: frozenset[str] = frozenset(s.name.split(".")[0] for s in SETTINGS if "." in s.name)
# Lazily computed defaults are stored on first read, so that an expensive default (compiler probing)
# runs at most once and only when needed.
_values: dict[str, Any] = {}
_sources: dict[str, str] = {}

F = TypeVar("F", bound=Callable[..., Any])


def _lookup(name: str) -> Setting:
    setting = _BY_NAME.get(name)
    if setting is None:
        hint = difflib.get_close_matches(name, list(_BY_NAME), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(f"unknown tuneforge setting {name!r}{suggestion} "
                          f"(known: {', '.join(sorted(_BY_NAME))})")
    return setting


def _resolve_kwarg(name: str) -> str:
    """`cpp_openmp` -> `cpp.openmp`: keyword arguments spell groups with an underscore."""
    if name in _BY_NAME:
        return name
    group, _, rest = name.partition("_")
    if group in _GROUPS and f"{group}.{rest}" in _BY_NAME:
        return f"{group}.{rest}"
    return name


def _validated(setting: Setting, value: Any, origin: str) -> Any:
    try:
        return setting.coerce(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid value for setting {setting.name!r} (environment variable "
                          f"{setting.env_var}) from {origin}: {exc}") from None


def validate(name: str, value: Any, origin: str = "an argument") -> Any:
    """`value` as setting `name` would take it, without setting it; a ConfigError names the setting and its
    environment variable (for arguments that stand for a setting, e.g. RemoteCache's)."""
    return _validated(_lookup(name), value, origin)


def setting_error(name: str, problem: str) -> ConfigError:
    """An error about a value for setting `name` found wrong beyond its own checks, naming its variable."""
    return ConfigError(f"invalid value for setting {name!r} (environment variable {_lookup(name).env_var}): "
                       f"{problem}")


def get(name: str) -> Any:
    setting = _lookup(name)
    if name not in _values:
        _values[name] = _validated(setting, setting.default_value(), "its default")
        _sources[name] = "default"
    return _values[name]


# Typed reads: each raises TypeError, naming the accessor to use, for a setting of another type.
def get_bool(name: str) -> bool:
    return _typed.as_bool(name, get(name))


def get_int(name: str) -> int:
    return _typed.as_int(name, get(name))


def get_float(name: str) -> float:
    return _typed.as_float(name, get(name))


def get_str(name: str) -> str:
    return _typed.as_str(name, get(name))


def get_optional_str(name: str) -> str | None:
    return _typed.as_optional_str(name, get(name))


def get_path(name: str) -> Path:
    return _typed.as_path(name, get(name))


def get_optional_path(name: str) -> Path | None:
    return _typed.as_optional_path(name, get(name))


def get_strs(name: str) -> tuple[str, ...]:
    return _typed.as_strs(name, get(name))


def get_ints(name: str) -> tuple[int, ...]:
    return _typed.as_ints(name, get(name))


def get_paths(name: str) -> tuple[Path, ...]:
    return _typed.as_paths(name, get(name))


def source(name: str) -> str:
    """Where the current value came from: default, file, env, set or patch."""
    _lookup(name)
    return _sources.get(name, "default")


def _assign(name: str, value: Any, origin: str) -> None:
    setting = _lookup(name)
    _values[name] = _validated(setting, value, origin)
    _sources[name] = origin
    if name == "log_level":
        logging.getLogger("tuneforge").setLevel(_values[name])


def set(name: str, value: Any) -> None:
    _assign(name, value, "set")


def names() -> list[str]:
    return [s.name for s in SETTINGS]


@dataclass(frozen=True)
class SettingInfo:
    name: str
    value: Any  # "***" for a secret that is set
    source: str
    env_var: str
    doc: str
    in_cache_key: bool


def _shown(setting: Setting) -> Any:
    value = get(setting.name)
    if setting.secret and value:
        return "***"
    if setting.redact is not None and value:
        return setting.redact(value)
    return value


def describe() -> list[SettingInfo]:
    """Every setting for display: secrets, and the secret parts of values (a URL's password), are masked."""
    return [SettingInfo(s.name, _shown(s), source(s.name), s.env_var, s.doc, s.in_cache_key) for s in SETTINGS]


def jsonable(value: Any) -> Any:
    """A setting's value as JSON can hold it (paths as text, tuples as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value


def cache_key_hash() -> str:
    """Hash of the settings that can change a compiled artifact (those with in_cache_key=True)."""
    from tuneforge.hashing import key_hash

    return key_hash({s.name: jsonable(get(s.name)) for s in SETTINGS if s.in_cache_key})


def save(path: str | os.PathLike[str] | None = None, *, include_defaults: bool = False) -> dict[str, Any]:
    """Write the settings that differ from their defaults (or all of them) as JSON; return the dict."""
    chosen = {s.name: jsonable(get(s.name)) for s in SETTINGS
              if include_defaults or source(s.name) != "default"}
    document = {"format": FILE_FORMAT, "version": FILE_VERSION, "settings": chosen}
    if path is not None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, target)
    return document


def load(path: str | os.PathLike[str]) -> None:
    """Apply a file written by save(). Settings set in the environment keep their environment value."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read tuneforge config file {path}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FILE_FORMAT:
        raise ConfigError(f"{path} is not a tuneforge config file (missing format: {FILE_FORMAT!r})")
    if document.get("version") != FILE_VERSION:
        raise ConfigError(f"{path} has config version {document.get('version')!r}; "
                          f"this tuneforge reads version {FILE_VERSION}")
    settings = document.get("settings", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{path}: 'settings' must be an object")
    staged = {name: _validated(_lookup(name), value, f"file {path}") for name, value in settings.items()}
    for name, value in staged.items():
        if source(name) != "env":
            _values[name] = value
            _sources[name] = "file"


def _read_environment(environ: Mapping[str, str]) -> None:
    known_vars = {s.env_var: s for s in SETTINGS}
    for var, text in environ.items():
        if not var.startswith("TUNEFORGE_") or var == CONFIG_FILE_ENV:
            continue
        setting = known_vars.get(var)
        if setting is None:
            continue  # other TUNEFORGE_* variables (e.g. TUNEFORGE_AUTOTUNE_LOG) belong to other modules
        try:
            value = setting.parse(text)
        except (TypeError, ValueError) as exc:
            shown = "***" if setting.secret and text else (setting.redact or str)(text)
            raise ConfigError(f"environment variable {var}={shown!r} is invalid for setting "
                              f"{setting.name!r}: {exc}") from None
        _assign(setting.name, value, "env")


def reset() -> None:
    """Back to defaults, then the config file and environment, as at import."""
    _values.clear()
    _sources.clear()
    config_file = os.environ.get(CONFIG_FILE_ENV)
    if config_file:
        load(config_file)
    _read_environment(os.environ)
    logging.getLogger("tuneforge").setLevel(get("log_level"))


_MISSING = object()


class patch:
    """Temporarily change settings; restores the previous values even when an exception escapes."""

    def __init__(self, changes: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(changes or {})
        merged.update({_resolve_kwarg(k): v for k, v in kwargs.items()})
        self._changes = {name: _validated(_lookup(name), value, "patch()") for name, value in merged.items()}
        self._saved: list[dict[str, tuple[Any, Any]]] = []

    def __enter__(self) -> patch:
        saved = {name: (_values.get(name, _MISSING), _sources.get(name, _MISSING)) for name in self._changes}
        self._saved.append(saved)
        for name, value in self._changes.items():
            _assign(name, value, "patch")
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, (value, origin) in self._saved.pop().items():
            if value is _MISSING:
                _values.pop(name, None)
                _sources.pop(name, None)
            else:
                _values[name] = value
                _sources[name] = origin
        logging.getLogger("tuneforge").setLevel(get("log_level"))

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _Group:
    """Attribute view of one settings group: ``config.cpp.flags``."""

    def __init__(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str) -> Any:
        return get(f"{self._prefix}.{name}")

    def __setattr__(self, name: str, value: Any) -> None:
        _assign(f"{self._prefix}.{name}", value, "set")

    def __dir__(self) -> list[str]:
        return [n.split(".", 1)[1] for n in _BY_NAME if n.startswith(self._prefix + ".")]

    def __repr__(self) -> str:
        return f"<tuneforge settings group {self._prefix!r}>"


class _ConfigModule(types.ModuleType):
    """Lets ``config.compile_threads = 4`` validate like ``config.set``."""

    def __getattr__(self, name: str) -> Any:
        if name in _GROUPS:
            return _Group(name)
        if name in _BY_NAME:
            return get(name)
        raise AttributeError(f"module 'tuneforge.config' has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _BY_NAME:
            _assign(name, value, "set")
        elif name in _GROUPS:
            raise ConfigError(f"cannot replace settings group {name!r}; assign its members instead")
        else:
            super().__setattr__(name, value)


def iter_env_vars() -> Iterator[tuple[str, str]]:
    for s in SETTINGS:
        yield s.env_var, s.name


def _started_as_command() -> bool:
    """Whether this process is the `tuneforge` command: its console script or ``python -m tuneforge``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name in ("tuneforge", "tuneforge.exe", "tuneforge-script.py"):
        return True
    if argv0 != "-m":  # while `python -m` imports the package, argv[0] is "-m"
        return False
    words = list(getattr(sys, "orig_argv", ()))
    return "-mtuneforge" in words or any(pair == ("-m", "tuneforge") for pair in itertools.pairwise(words))


_startup_error: ConfigError | None = None


def startup_error() -> ConfigError | None:
    """The error in the environment or config file found at import, when the `tuneforge` command runs.

    Anywhere else `import tuneforge` raises it. The command is importing this module before any of its
    own code can run, so it would end in a traceback; instead the command reports it as one line.
    """
    return _startup_error


sys.modules[__name__].__class__ = _ConfigModule
try:
    reset()
except ConfigError as _exc:
    if not _started_as_command():
        raise
    _startup_error = _exc
