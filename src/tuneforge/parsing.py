"""Strict parsers (text -> value) and coercers (value -> validated value) for settings.

Every function raises ValueError or TypeError with a message about the value only; the caller
adds which setting or environment variable it came from.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"expected one of 1/0/true/false/yes/no/on/off, got {text!r}")


def coerce_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return parse_bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"expected a boolean, got {value!r}")


def parse_int(text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _int_value(value: Any) -> int:
    if isinstance(value, str):
        value = parse_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _float_value(value: Any) -> float:
    if isinstance(value, str):
        value = parse_float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"expected a finite number, got {value!r}") from None
    # Every float setting is a time, a ratio or a margin: inf would wait forever and nan compares false
    # with everything, so neither can work.
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {number}")
    return number


def coerce_positive_int(value: Any) -> int:
    number = _int_value(value)
    if number < 1:
        raise ValueError(f"expected an integer >= 1, got {number}")
    return number


def coerce_non_negative_int(value: Any) -> int:
    number = _int_value(value)
    if number < 0:
        raise ValueError(f"expected an integer >= 0, got {number}")
    return number


def coerce_positive_float(value: Any) -> float:
    number = _float_value(value)
    if not number > 0:
        raise ValueError(f"expected a number > 0, got {number}")
    return number


def coerce_non_negative_float(value: Any) -> float:
    number = _float_value(value)
    if not number >= 0:
        raise ValueError(f"expected a number >= 0, got {number}")
    return number


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNIT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """Bytes from '123', '500M', '5G', '1.5GiB' (binary units: 1K = 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 1048576, 500M or 5G, got {text!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * _UNIT[unit])


def format_size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.1f} TiB"


def parse_path(text: str) -> Path:
    if not text.strip():
        raise ValueError("expected a path, got an empty string")
    return Path(os.path.expanduser(text.strip()))


def coerce_path(value: Any) -> Path:
    if isinstance(value, str):
        return parse_path(value)
    if isinstance(value, Path):
        return value
    raise TypeError(f"expected a path, got {value!r}")


def parse_path_list(text: str) -> tuple[Path, ...]:
    return tuple(parse_path(part) for part in text.split(os.pathsep) if part.strip())


def coerce_path_tuple(value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        return parse_path_list(value)
    if isinstance(value, Iterable):
        return tuple(coerce_path(v) for v in value)
    raise TypeError(f"expected a list of paths, got {value!r}")


def parse_optional_str(text: str) -> str | None:
    return text.strip() or None


def coerce_optional_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise TypeError(f"expected a string, got {value!r}")


_URL_SCHEMES = ("redis", "rediss", "unix")
_SECRET_QUERY_KEYS = frozenset({"password", "pass", "secret", "token", "ssl_password"})


def mask_url_password(url: str) -> str:
    """`url` with its password (in the user part or a ``password=`` query) replaced by ``***``, for display."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not has_password and not any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
        return url
    netloc = parts.netloc
    if has_password:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    query = urlencode([(k, "***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*")
    # Not urlunsplit: it drops the "//" of an empty host (unix:///path).
    return (f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
            + (f"#{parts.fragment}" if parts.fragment else ""))


def coerce_remote_url(value: Any) -> str | None:
    """A URL the remote tier can open, checked when it is set rather than at the first remote call."""
    text = coerce_optional_str(value)
    if text is None:
        return None
    shown = mask_url_password(text)  # error messages end up in logs: never echo a password
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}): {shown!r}") from None
    if parts.scheme not in _URL_SCHEMES:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {shown!r}")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"a unix:// URL needs the socket path (unix:///run/redis.sock), got {shown!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"a {parts.scheme}:// URL needs a host (redis://host:6379/0), got {shown!r}")
    return text


_EMPTY_SECRET = ("the secret is empty; set the same non-empty secret on every machine that shares the remote "
                 "cache, or unset it (and set remote.allow_unsigned=true to share unsigned artifacts knowingly)")


def parse_secret(text: str) -> str:
    # An empty variable must not read as "unset": that would silently turn signing off.
    if not text.strip():
        raise ValueError(_EMPTY_SECRET)
    return text


def coerce_secret(value: Any) -> str | None:
    """None (no signing) or a non-empty secret."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError("expected a string")  # the value itself is never echoed: it may be the secret
    return parse_secret(value)


def coerce_namespace(value: Any) -> str:
    text = coerce_optional_str(value)
    if text is None or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", text):
        raise ValueError(f"expected 1-64 letters, digits, '.', '_' or '-', got {value!r}")
    return text


DETECT_MARCH = "detect"  # cpp.march's default: the toolchain resolves it to the CPU the compiler detects


def coerce_march(value: Any) -> str:
    text = coerce_optional_str(value)
    if text is None:
        raise ValueError("expected a CPU name such as znver3 or skylake-avx512")
    if text == "native":
        raise ValueError("'native' is not allowed: it hides the real CPU from the cache key; "
                         "name the CPU (e.g. znver3) or leave the setting unset to detect it")
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", text):
        raise ValueError(f"not a CPU name: {text!r}")
    return text


def parse_flags(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"cannot split {text!r} as shell words: {exc}") from None


def coerce_str_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return parse_flags(value)
    if isinstance(value, Iterable) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"expected a list of strings, got {value!r}")


_OPT_LEVELS = ("0", "1", "2", "3", "s", "fast")


def parse_opt_level(text: str) -> str:
    return coerce_opt_level(text)


def coerce_opt_level(value: Any) -> str:
    text = str(value).strip().removeprefix("-O")
    if text not in _OPT_LEVELS:
        raise ValueError(f"expected one of {', '.join(_OPT_LEVELS)}, got {value!r}")
    return text


def one_of(*options: str) -> Callable[[Any], str]:
    """A coercer accepting exactly one of `options` (case-insensitive)."""

    def coerce(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return text

    return coerce


def coerce_optional_path(value: Any) -> Path | None:
    if value is None or value == "":
        return None
    return coerce_path(value)


def parse_optional_path(text: str) -> Path | None:
    return parse_path(text) if text.strip() else None


def parse_int_list(text: str) -> tuple[int, ...]:
    return tuple(parse_int(part) for part in text.replace(",", " ").split())


def coerce_int_tuple(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        return parse_int_list(value)
    if isinstance(value, Iterable):
        return tuple(coerce_non_negative_int(v) for v in value)
    raise TypeError(f"expected a list of integers, got {value!r}")


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_log_level(text: str) -> str:
    return coerce_log_level(text)


def coerce_log_level(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = logging.getLevelName(value)
    text = str(value).strip().upper()
    if text not in _LEVELS:
        raise ValueError(f"expected one of {', '.join(_LEVELS)}, got {value!r}")
    return text
