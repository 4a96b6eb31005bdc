"""Cheap argument checks for the emitter's call sites (the hot path first).

Each check takes the common case (a plain ``int`` or ``float``) with one ``type() is``
test and only falls back to slower conversions for numpy and torch scalars, which
training code passes all the time (``loss.item()`` is a float, ``np.int64(step)`` is not
an int). Strings and booleans are refused even though ``float("3.1")`` and ``int(True)``
would succeed: they are always a caller's mistake. NaN and infinities are valid floats.
"""

from __future__ import annotations

import operator
import os
from typing import Any

_REFUSED_FOR_NUMBERS = (str, bytes, bytearray, bool)


def as_int(name: str, value: Any) -> int:
    """``value`` as a Python int, or a TypeError that names the argument.

    Args:
        name: The argument's name, for the message.
        value: An int or an object with ``__index__`` (numpy or torch integer scalars).

    Returns:
        The integer.

    Raises:
        TypeError: ``value`` is a bool, a float, a string or anything else not integral.
    """
    if type(value) is int:
        return value
    if isinstance(value, _REFUSED_FOR_NUMBERS):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def as_step(name: str, value: Any) -> int:
    """``value`` as a non-negative int (a step number, a count).

    Raises:
        TypeError: not an integer (see `as_int`).
        ValueError: negative.
    """
    result = value if type(value) is int else as_int(name, value)
    if result < 0:
        raise ValueError(f"{name} must be >= 0, got {result}")
    return result


def as_float(name: str, value: Any) -> float:
    """``value`` as a Python float; NaN and infinities pass unchanged.

    Args:
        name: The argument's name, for the message.
        value: A float, an int, or an object with ``__float__`` (numpy or 0-d torch
            scalars).

    Returns:
        The float.

    Raises:
        TypeError: ``value`` is a string, bytes, a bool, None or not convertible.
    """
    if type(value) is float:
        return value
    if isinstance(value, _REFUSED_FOR_NUMBERS) or value is None:
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}") from None


def as_optional_float(name: str, value: Any) -> float | None:
    """Like `as_float`, but None passes through (a measurement that was not taken)."""
    if value is None or type(value) is float:
        return value
    return as_float(name, value)


def as_duration_s(name: str, value: Any) -> float:
    """``value`` as a float number of seconds that is not negative (NaN is refused too).

    Raises:
        TypeError: not a number (see `as_float`).
        ValueError: negative or NaN.
    """
    result = value if type(value) is float else as_float(name, value)
    if not result >= 0.0:  # also catches NaN
        raise ValueError(f"{name} must be >= 0 seconds, got {result!r}")
    return result


def as_bool(name: str, value: Any) -> bool:
    """``value`` as a bool; numpy bools and the ints 0 and 1 pass, strings do not.

    Raises:
        TypeError: anything else.
    """
    if type(value) is bool:
        return value
    if isinstance(value, (str, bytes, bytearray)) or value is None:
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def as_str(name: str, value: Any, *, allow_empty: bool = True) -> str:
    """``value`` if it is a str (and, unless allowed, not empty).

    Raises:
        TypeError: not a str.
        ValueError: empty while ``allow_empty`` is False.
    """
    if type(value) is not str and not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not allow_empty and not value:
        raise ValueError(f"{name} must not be empty")
    return value


def as_positive(name: str, value: Any) -> int:
    """``value`` as an int >= 1 (a count of microbatches, of ranks).

    Raises:
        TypeError: not an integer (see `as_int`).
        ValueError: less than 1.
    """
    result = as_int(name, value)
    if result < 1:
        raise ValueError(f"{name} must be >= 1, got {result}")
    return result


def as_path(name: str, value: Any) -> str:
    """``value`` (a str or path-like) as a non-empty str.

    Raises:
        TypeError: not a str or ``os.PathLike`` of str (bytes are refused).
        ValueError: empty.
    """
    try:
        text: str | bytes = os.fspath(value)
    except TypeError:
        raise TypeError(f"{name} must be a str or path, got {type(value).__name__}") from None
    if isinstance(text, bytes):
        raise TypeError(f"{name} must be a str or path, got bytes")
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text


def one_line(text: str, limit: int = 2000) -> str:
    """``text`` with its whitespace collapsed to single spaces, cut to ``limit`` chars."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


__all__ = [
    "as_bool",
    "as_duration_s",
    "as_float",
    "as_int",
    "as_optional_float",
    "as_path",
    "as_positive",
    "as_step",
    "as_str",
    "one_line",
]
