"""Bounds on what a model file states about itself, checked before anything is allocated from it.

A count, an index in a name or a dimension read from a file can be any size; each is held here to what the
file itself can hold (its byte size, its tensor count) or to what the format allows, before a table, a
product or an array is made from it. Files are opened only when they are regular files, and read up to a
limit, so a FIFO or a device never hangs or fills memory. Messages show values through `short`, which
never prints more than a line however large or deep the value is.
"""
from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path
from typing import BinaryIO

from nanoasr.errors import ModelError

MAX_RANK = 8  # dimensions of a tensor: no weight has more than GGUF's 4; far fewer than a hostile file states
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlong, _REPR.maxstring, _REPR.maxother = 3, 40, 60, 60


def short(value) -> str:
    """repr(value) cut to a line: depth, items and long integers elided (reprlib)."""
    return _REPR.repr(value)


def count(value: int, limit: int, what: str, where: str) -> int:
    """`value` when it is at most `limit`, else a ModelError naming both."""
    if value > limit:
        raise ModelError(f"{where}: {what} is {short(value)}, expected at most {limit}")
    return value


def index(digits: str, limit: int, what: str, where: str) -> int:
    """A decimal index from a name (a layer number), below `limit`: checked by its length before it is
    converted, so a name of 5,000 digits costs nothing."""
    if len(digits) > len(str(limit)) or int(digits) >= limit:
        raise ModelError(f"{where}: {what} {short(digits)} is out of range (expected below {limit})")
    return int(digits)


def dims(shape: tuple, max_rank: int, limit: int, what: str, where: str) -> tuple:
    """`shape` when it has at most `max_rank` dimensions, each at most `limit`: checked before any product of
    them is taken (a product of a million huge dimensions would run for minutes) or numpy sees them."""
    if len(shape) > max_rank or any(n > limit for n in shape):
        raise ModelError(f"{where}: {what} {short(shape)}: more than {max_rank} dimensions or one above "
                         f"{limit} (more than the file holds)")
    return shape


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file. It is opened without blocking and checked on the
    open descriptor, so a FIFO or a device is refused (OSError) rather than waited on or read without end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = IsADirectoryError if stat.S_ISDIR(mode) else OSError
        raise kind(f"{path} is not a regular file (a FIFO, a device or a directory)")
    return os.fdopen(fd, "rb")


def read_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    try:
        with open_regular(path) as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise ModelError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise ModelError(f"{path}: {what} cannot be read ({exc})") from None
    if len(data) > limit:
        raise ModelError(f"{path}: {what} is more than the {limit} bytes expected")
    return data


def regular_file(path: Path, what: str) -> Path:
    """`path` when it names a regular file (symlinks followed): a FIFO or a device is refused before anything
    opens it and waits."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise ModelError(f"{path}: {what} cannot be read ({exc})") from None
    if not stat.S_ISREG(mode):
        raise ModelError(f"{path}: {what} cannot be read (not a regular file: a FIFO, a device or a "
                         f"directory)")
    return path
