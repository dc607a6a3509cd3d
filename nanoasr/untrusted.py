"""Reading files that may be hostile: refuse what is not a regular file, and read with a cap.

A FIFO waits for a writer when it is opened, and a device such as /dev/zero or a pipe without end never
reaches end of file, so `read()` of "a file" can hang or take all memory. `read_regular` opens a path
without blocking, checks the open descriptor is a regular file of at most `cap` bytes, and reads it;
`read_capped` reads a stream (a pipe, stdin) in chunks and stops once it holds more than `cap` bytes.
Both raise `ReadRefused` (a ValueError), whose message says what the file is or how large; callers turn it
into their own error (AudioError, ModelError) with the file's name in front. `load_json` is json.loads with
every way hostile JSON fails a ValueError, so one `except ValueError` is enough. `short` shows a value read
from such a file in a message: never more than a line, however large or deep the value is.

A leaf: it imports nothing from nanoasr, so the audio reader, the model loaders and the hub can share it.
"""
from __future__ import annotations

import json
import os
import reprlib
import stat

CHUNK = 1 << 20  # bytes read from a stream at once
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlong, _REPR.maxstring, _REPR.maxother = 3, 40, 60, 60


def short(value) -> str:
    """repr(value) cut to a line: depth, items and long integers elided (reprlib)."""
    return _REPR.repr(value)


class ReadRefused(ValueError):
    """The file is not a regular file, or holds more than the cap; the message says which (no name)."""


def kind_of(mode: int) -> str:
    """What an st_mode says a file is, with its article: 'a FIFO (named pipe)', 'a directory', ..."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "a special file"


def not_regular(path) -> str | None:
    """None when `path` leads to a regular file; else why it is refused ('is a FIFO (named pipe), not a
    regular file'), found by stat, which, unlike open, never waits on a FIFO."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if stat.S_ISREG(mode) else f"is {kind_of(mode)}, not a regular file"


def open_regular(path):
    """`path` opened for binary reading when it is a regular file; ReadRefused for anything else.

    The file is opened without blocking (a FIFO put there after any earlier check opens at once instead of
    waiting for a writer) and without becoming a controlling terminal, and its open descriptor is checked,
    so what is read is what was checked. OSError when it cannot be opened."""
    flags = os.O_RDONLY
    for name in ("O_NONBLOCK", "O_NOCTTY", "O_BINARY"):  # where the system has them
        flags |= getattr(os, name, 0)
    fd = os.open(path, flags)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ReadRefused(f"is {kind_of(mode)}, not a regular file")
    return open(fd, "rb", buffering=0, closefd=True)


def read_regular(path, cap: int) -> bytes:
    """The bytes of the regular file at `path`, at most `cap` of them; ReadRefused for anything else (see
    open_regular). OSError when it cannot be opened or read."""
    with open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > cap:
            raise ReadRefused(f"is {size} bytes, more than the {_size(cap)} it may be")
        return read_capped(file, cap)


def read_capped(file, cap: int) -> bytes:
    """Everything `file` (a binary file object: a pipe, stdin, a socket's file) gives until end of file, in
    chunks, or ReadRefused as soon as it has given more than `cap` bytes: memory stays near `cap`."""
    chunks, total = [], 0
    while True:
        chunk = file.read(min(CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"the file object returned {type(chunk).__name__}, not bytes")
        total += len(chunk)
        if total > cap:
            raise ReadRefused(f"holds more than the {_size(cap)} that may be read from it")
        chunks.append(bytes(chunk))


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def load_json(data: bytes | str):
    """json.loads, with every way it fails on hostile text a ValueError: invalid UTF-8 or JSON, an integer of
    more than 4,300 digits (a plain ValueError already, not a JSONDecodeError), and nesting deeper than the
    parser's recursion limit (a RecursionError from the parser, raised here as a ValueError)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
