"""Silero VAD's 16 kHz weights, from the silero-vad wheel into nanoasr/audio/silero_vad_16k.npz (float32),
with Silero's licence beside them.

    pip download --no-deps silero-vad==6.2.3 -d /tmp/silero
    python tools/convert_silero_vad.py /tmp/silero/silero_vad-6.2.3-py3-none-any.whl

Reads silero_vad/data/silero_vad_16k_op15.onnx from the wheel with the `onnx` package (the `reference` extra);
the network's parts are the graph's initializers, renamed to the names nanoasr.audio.silero reads, and their
shapes checked against SHAPES.
"""
from __future__ import annotations

import argparse
import hashlib
import zipfile
from pathlib import Path

import numpy as np

MODEL = "silero_vad/data/silero_vad_16k_op15.onnx"
OUT = Path(__file__).resolve().parents[1] / "nanoasr" / "audio"
# the graph's initializer -> (nanoasr's name, shape)
SHAPES = {
    "model.stft.forward_basis_buffer": ("stft.basis", (258, 1, 256)),
    **{f"model.encoder.{i}.reparam_conv.{part}": (f"encoder.{i}.{part}", shape)
       for i, (c_out, c_in) in enumerate(((128, 129), (64, 128), (64, 64), (128, 64)))
       for part, shape in (("weight", (c_out, c_in, 3)), ("bias", (c_out,)))},
    "model.decoder.rnn.weight_ih": ("lstm.weight_ih", (512, 128)),
    "model.decoder.rnn.weight_hh": ("lstm.weight_hh", (512, 128)),
    "model.decoder.rnn.bias_ih": ("lstm.bias_ih", (512,)),
    "model.decoder.rnn.bias_hh": ("lstm.bias_hh", (512,)),
    "model.decoder.decoder.2.weight": ("head.weight", (1, 128, 1)),
    "model.decoder.decoder.2.bias": ("head.bias", (1,)),
}


def read_wheel(wheel: Path) -> tuple[bytes, str, str]:
    """The onnx model's bytes, the licence text and the wheel's name-version from a silero-vad wheel."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        licences = [n for n in names if n.endswith((".dist-info/licenses/LICENSE", ".dist-info/LICENSE"))]
        if MODEL not in names or not licences:
            raise SystemExit(f"{wheel}: not a silero-vad wheel (expected {MODEL} and a LICENSE in its "
                             "dist-info)")
        return z.read(MODEL), z.read(licences[0]).decode("utf-8"), licences[0].split(".dist-info")[0]


def weights(model_bytes: bytes) -> dict[str, np.ndarray]:
    """The graph's initializers under nanoasr's names, float32, shapes checked."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load_from_string(model_bytes).graph
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    missing = sorted(set(SHAPES) - set(found))
    if missing:
        raise SystemExit(f"{MODEL}: missing initializers {missing}")
    out = {}
    for name, (ours, shape) in SHAPES.items():
        if found[name].shape != shape:
            raise SystemExit(f"{MODEL}: {name} has shape {found[name].shape}, expected {shape}")
        out[ours] = np.ascontiguousarray(found[name], np.float32)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path,
                        help="silero_vad-*.whl (pip download --no-deps silero-vad==6.2.3)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="directory for silero_vad_16k.npz and its licence")
    args = parser.parse_args(argv)
    model_bytes, licence, release = read_wheel(args.wheel)
    tensors = weights(model_bytes)
    source = f"{release} {MODEL} sha256={hashlib.sha256(model_bytes).hexdigest()}"
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "silero_vad_16k.npz", source=np.array(source), **tensors)
    (args.out / "silero_vad_16k.LICENSE").write_text(
        f"The Silero VAD weights in silero_vad_16k.npz come from {release} ({MODEL}),\n"
        f"converted by tools/convert_silero_vad.py. Silero VAD's licence:\n\n{licence}", encoding="utf-8")
    print(f"wrote {args.out / 'silero_vad_16k.npz'}: {len(tensors)} tensors from {source}")


if __name__ == "__main__":
    main()
