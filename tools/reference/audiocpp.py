"""A Transformers-layout checkpoint as audio.cpp's GGUF, written as its converter does it.

    python -m tools.reference.audiocpp CHECKPOINT_DIR OUT.gguf [--type orig|f16|bf16|q8_0]

Follows `audiocpp_gguf --input CHECKPOINT_DIR/model.safetensors --root CHECKPOINT_DIR --family fun_asr_nano`
(0xShug0/audio.cpp src/framework/assets/tensor_source.cpp, commit f8fb0c1; model_specs/fun_asr_nano.json at
57837ac): general.architecture `audiocpp`, the package spec under audiocpp.model_spec.*, tensors under their
safetensors names (`_audiocpp.<i>` for a name of 64 bytes or more) listed in audiocpp.tensor_names with their
exact ranks and shapes, every other file of the folder embedded (sorted by path) as one byte blob. Types:
`orig` keeps each tensor's; f16/bf16 convert every float tensor; q8_0 quantizes 2-D `.weight` tensors whose
rows are a multiple of 32 and whose name has no `embed`, stores embeddings as F16 and keeps the rest.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from gguf import GGUFValueType, GGUFWriter

from tools.lib.gguf_file import finish

SKIPPED_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")


def _stored(name: str, t, kind: str):
    """(array, ggml type or None) as the converter stores one tensor."""
    import gguf
    import numpy as np

    arr = t.float().numpy()
    native = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}[str(t.dtype)]
    if kind == "q8_0" and name.endswith(".weight") and arr.ndim == 2 and "embed" not in name.lower() \
            and arr.shape[1] % 32 == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(np.ascontiguousarray(arr), q8), q8
    target = {"orig": native, "q8_0": "f16" if "embed" in name.lower() else native}.get(kind, kind)
    if target == "bf16":
        bf16 = gguf.GGMLQuantizationType.BF16
        return gguf.quants.quantize(np.ascontiguousarray(arr), bf16), bf16
    return np.ascontiguousarray(arr.astype(np.float16 if target == "f16" else np.float32)), None


class _Writer(GGUFWriter):
    """gguf's writer, packing a bytes value of a UINT8 array as it is: the same bytes as its per-item packing,
    which takes minutes for the megabytes of embedded files."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if isinstance(val, bytes) and vtype == GGUFValueType.ARRAY and sub_type == GGUFValueType.UINT8:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", len(val)) + val
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def write(checkpoint_dir, out, kind: str = "q8_0", spec: dict | None = None) -> Path:
    from safetensors.torch import load_file

    src, out = Path(checkpoint_dir), Path(out)
    w = _Writer(str(out), "audiocpp")
    w.add_string("general.name", src.name)
    w.add_string("audiocpp.tensor_name_format", "native")
    w.add_string("audiocpp.source_format", ".safetensors")
    w.add_string("audiocpp.weight_type", kind)
    w.add_uint32("audiocpp.model_spec.version", 1)
    w.add_string("audiocpp.model_spec.family", "fun_asr_nano")
    w.add_string("audiocpp.model_spec.json", json.dumps(spec or {"family": "fun_asr_nano"}))
    w.add_array("audiocpp.tensor_sources.names", [""])
    w.add_array("audiocpp.tensor_sources.paths", ["model.safetensors"])
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix not in SKIPPED_SUFFIXES and p != out)
    blob, offsets = b"", [0]
    for path in files:
        blob += path.read_bytes()
        offsets.append(len(blob))
    w.add_array("audiocpp.embedded_files.names", [p.relative_to(src).as_posix() for p in files])
    array, kinds = GGUFValueType.ARRAY, GGUFValueType
    w.add_key_value("audiocpp.embedded_files.offsets", offsets, array, sub_type=kinds.UINT64)
    w.add_key_value("audiocpp.embedded_files.data", blob, array, sub_type=kinds.UINT8)
    names, ranks, shapes = [], [], []
    for i, (name, t) in enumerate(load_file(str(src / "model.safetensors")).items()):
        data, raw_dtype = _stored(name, t, kind)
        w.add_tensor(name if len(name) < 64 else f"_audiocpp.{i}", data, raw_dtype=raw_dtype)
        names.append(name)
        ranks.append(t.dim())
        shapes += list(t.shape)
    w.add_array("audiocpp.tensor_names", names)
    w.add_key_value("audiocpp.tensor_ranks", ranks, array, sub_type=kinds.INT32)
    w.add_key_value("audiocpp.tensor_shapes", shapes, array, sub_type=kinds.INT64)
    finish(w)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--type", default="q8_0", choices=["orig", "f16", "bf16", "q8_0"])
    args = parser.parse_args(argv)
    print(write(args.checkpoint_dir, args.out, args.type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
