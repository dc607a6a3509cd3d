"""GGUF writing: header, metadata and tensor infos, then each tensor's data streamed in turn, atomically."""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter

from nanoasr.errors import ModelError
from nanoasr.formats.gguf_read import GGML_TYPES
from nanoasr.formats.mapping import leave_page_cache

Progress = Callable[[int, int, str, str], None]  # (tensors written, tensors in all, name, stored type)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    block, type_bytes = GGML_QUANT_SIZES[GGML_TYPES[dtype]]
    if shape[-1] % block:
        raise ModelError(f"{dtype} needs rows of whole {block}-element blocks, found shape {list(shape)}")
    return int(np.prod(shape, dtype=np.int64)) // block * type_bytes


def _stream(path: Path, w: GGUFWriter, infos, data: Iterable[np.ndarray], progress: Progress | None) -> None:
    """Header, metadata and tensor infos, then each tensor's data as `data` yields it (one in memory)."""
    for name, shape, dtype in infos:
        w.add_tensor_info(name, shape, np.dtype(np.float32), _nbytes(shape, dtype),
                          raw_dtype=GGML_TYPES[dtype])
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, ((name, _, dtype), array) in enumerate(zip(infos, data, strict=True), 1):
        w.write_tensor_data(array)
        if progress is not None:
            progress(k, len(infos), name, dtype)


def partial_path(path: Path) -> Path:
    """A new, empty file beside `path` to write it in: its own name (created here, never one that exists),
    so neither a file of the user's nor another conversion's is overwritten, and on the same file system,
    so the rename that finishes is atomic."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return partial


def write(path: Path, arch: str, add_metadata: Callable[[GGUFWriter], None],
          infos: list[tuple[str, tuple[int, ...], str]], data: Iterable[np.ndarray],
          progress: Progress | None = None) -> None:
    """A GGUF of `arch`: `add_metadata(writer)` adds the keys, `infos` names each tensor (name, shape, stored
    type) and `data` yields their GGUF data in the same order. `progress(done, total, name, stored_type)`,
    when given, is called after each tensor is written; nothing is printed.

    Written beside `path` and renamed at the end, so a failed conversion leaves no partial file behind; then
    flushed and let go of the page cache, so that its first load reads it from disk in large folios.
    """
    path = Path(path)
    partial = partial_path(path)
    w = GGUFWriter(partial, arch)
    try:
        add_metadata(w)
        _stream(partial, w, infos, data, progress)
        w.close()
        os.replace(partial, path)
        leave_page_cache(path)  # read back from disk, it is mapped in 2 MiB pages (mapping.py)
    finally:
        w.close()
        partial.unlink(missing_ok=True)
