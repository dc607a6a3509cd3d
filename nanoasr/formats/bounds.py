"""Bounds on what a model file states about itself, checked before anything is allocated from it.

A count, an index in a name or a dimension read from a file can be any size; each is held here to what the
file itself can hold (its byte size, its tensor count) or to what the format allows, before a table, a
product or an array is made from it. Files are opened only when they are regular files, and read up to a
limit (nanoasr.untrusted does the reading), so a FIFO or a device never hangs or fills memory. Messages
show values through untrusted.short, which never prints more than a line however large or deep the value is.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from nanoasr.errors import ModelError
from nanoasr.untrusted import ReadRefused, kind_of, read_regular, short

MAX_RANK = 8  # dimensions of a tensor: no weight has more than GGUF's 4; far fewer than a hostile file states


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


def read_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    try:
        return read_regular(path, limit)
    except FileNotFoundError:
        raise ModelError(f"{path}: {what} not found") from None
    except ReadRefused as exc:
        raise ModelError(f"{path}: {what} cannot be read (it {exc})") from None
    except OSError as exc:
        raise ModelError(f"{path}: {what} cannot be read ({exc})") from None


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
        raise ModelError(f"{path}: {what} cannot be read (it is {kind_of(mode)}, not a regular file)")
    return path
