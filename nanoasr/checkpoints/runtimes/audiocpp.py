"""audio.cpp's GGUF (`general.architecture` = audiocpp, `audiocpp.model_spec.family` = fun_asr_nano).

Written by audio.cpp's `audiocpp_gguf` (0xShug0/audio.cpp src/framework/assets/tensor_source.cpp, commit
f8fb0c1; the fun_asr_nano package spec at 57837ac) from the Hugging Face `-hf` checkpoint: the tensors keep
their safetensors names, listed in `audiocpp.tensor_names` in tensor order (a name of 64 bytes or more is
stored under `_audiocpp.<i>`), and the checkpoint's text files are embedded as one byte blob
(`audiocpp.embedded_files.names`, `.offsets` with one more entry than names, `.data`).
"""
from __future__ import annotations

from nanoasr.errors import ModelError
from nanoasr.formats.gguf_read import NumericArray
from nanoasr.tensor import StoredTensor
from nanoasr.untrusted import short

ARCH = "audiocpp"
FAMILY = "fun_asr_nano"
TEXT_FILE_LIMIT = 64 * 1024 * 1024  # the converter embeds no file larger than this


def check_family(values: dict, where: str) -> None:
    family = values.get("audiocpp.model_spec.family")
    if family != FAMILY:
        raise ModelError(f"{where}: an audio.cpp GGUF of family {family!r}; expected {FAMILY!r}")


def logical_tensors(values: dict, tensors: dict[str, StoredTensor], where: str) -> dict[str, StoredTensor]:
    """The tensors under the names `audiocpp.tensor_names` gives them (one per tensor, in file order)."""
    names = values.get("audiocpp.tensor_names")
    if names is None:
        return tensors
    if (not isinstance(names, list) or len(names) != len(tensors)
            or not all(isinstance(n, str) for n in names)):
        raise ModelError(f"{where}: audiocpp.tensor_names must list one name per tensor ({len(tensors)}), "
                         f"found {type(names).__name__} of {len(names) if isinstance(names, list) else '?'}")
    if len(set(names)) != len(names):
        raise ModelError(f"{where}: audiocpp.tensor_names repeats a name")
    packed = [n for n in names if "/" in n]
    if packed:
        raise ModelError(f"{where}: tensor {packed[0]}: namespaced (packed) audio.cpp GGUFs are not "
                         f"supported; expected the checkpoint's own tensor names")
    return dict(zip(names, tensors.values()))


def _integers(value) -> bool:
    return isinstance(value, NumericArray) and value.array.dtype.kind in "iu"


def embedded_files(values: dict, where: str) -> dict[str, str]:
    """The embedded files at the top of the package (config.json, tokenizer.json, ...) as text."""
    names = values.get("audiocpp.embedded_files.names")
    if names is None:
        return {}
    offsets, data = values.get("audiocpp.embedded_files.offsets"), values.get("audiocpp.embedded_files.data")
    if not (isinstance(names, list) and _integers(offsets) and _integers(data)
            and data.array.dtype.itemsize == 1):
        raise ModelError(f"{where}: audiocpp.embedded_files: expected a list of names, an integer array of "
                         f"offsets and a byte array of data, found {short(names)}, "
                         f"{short(offsets)} and {short(data)}")
    offsets = offsets.tolist()
    if (len(offsets) != len(names) + 1 or offsets[0] != 0 or offsets[-1] != len(data)
            or any(b < a for a, b in zip(offsets, offsets[1:]))):
        raise ModelError(f"{where}: audiocpp.embedded_files: expected names, offsets (one more than names, "
                         f"from 0 to the data's length, increasing) and data")
    blob = data.array.tobytes()
    files = {}
    for name, start, end in zip(names, offsets, offsets[1:]):
        if not isinstance(name, str) or "/" in name or end - start > TEXT_FILE_LIMIT:
            continue  # files in subfolders have no role here
        try:
            files[name] = blob[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(f"{where}: embedded file {name} is not UTF-8 text") from None
    return files
