"""Random-weight Fun-ASR-Nano checkpoints, with numpy alone (no torch, no network): the one builder of them.

    python tools/random_checkpoint.py OUT_DIR [--seed N]

Writes OUT_DIR/config.json (the tiny fixture's config with Config()'s sizes, which are Fun-ASR-Nano-2512's),
tokenizer.json (the fixture's: the full Qwen3 vocabulary) and model.safetensors in BF16, as the official file.
The weights are redrawn at unit scale (matrices N(0, 1/fan_in), norm gains 1 + N(0, 0.1), biases N(0, 0.1),
embeddings 0.1 N(0, 1)), so the logits have a clear argmax and greedy ids are a sharp comparison (an
initialiser's 0.02 scale would make every logit nearly equal). tools/reference/checkpoint.py writes the
tiny and full sizes with a config stated by Transformers through `write_safetensors`. `nanoasr convert`
makes GGUFs of it.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nanoasr.model.config import Config  # noqa: E402
from nanoasr.checkpoints.spec import expected_tensors  # noqa: E402

TINY = ROOT / "tests" / "fixtures" / "tiny"
SIZE_KEYS = {"audio_config": ("audio", ("hidden_size", "num_attention_heads", "intermediate_size",
                                        "num_hidden_layers", "num_timestamp_prediction_layers")),
             "adaptor_config": ("adaptor", ("hidden_size", "num_attention_heads", "intermediate_size",
                                            "num_hidden_layers", "projector_hidden_size")),
             "text_config": ("text", ("hidden_size", "intermediate_size", "num_hidden_layers",
                                      "num_attention_heads", "num_key_value_heads", "head_dim"))}


def full_config() -> dict:
    """The tiny fixture's config.json with every size set to the real model's."""
    raw = json.loads((TINY / "config.json").read_text())
    sizes = Config()
    for key, (part, fields) in SIZE_KEYS.items():
        values = dataclasses.asdict(getattr(sizes, part))
        raw[key].update({name: values[name] for name in fields})
    raw["text_config"]["layer_types"] = ["full_attention"] * sizes.text.num_hidden_layers
    return raw


def random_weight(rng, name: str, shape: tuple[int, ...]) -> np.ndarray:  # float32 of `shape`
    noise = rng.standard_normal(shape, dtype=np.float32)
    # Token embeddings well below the layers' unit-scale outputs: with a dominant residual the tied head
    # maps each token back to itself and greedy output repeats one token, which would make a weak test.
    if "embed_tokens" in name:
        return noise * np.float32(0.1)
    if len(shape) == 1:
        return 1 + np.float32(0.1) * noise if name.endswith("weight") else np.float32(0.1) * noise
    return noise / np.float32(math.sqrt(math.prod(shape[1:])))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits, rounded to nearest even (finite values)."""
    bits = x.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, config: Config, seed: int) -> None:
    """Every tensor the spec expects, BF16, one tensor in memory at a time."""
    rng = np.random.default_rng(seed)
    shapes = {name: shape for name, (shape, _) in expected_tensors(config).items()}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}  # what Transformers' loader asks of a safetensors file
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, shape in shapes.items():
            f.write(bf16_bits(random_weight(rng, name, shape)).tobytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from nanoasr.model.config import from_dict

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = full_config()
    stage(f"{out / 'config.json'}: the real model's sizes")
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    stage(f"{out / 'tokenizer.json'}: the Qwen3 vocabulary")
    (out / "tokenizer.json").write_bytes(gzip.decompress((TINY / "tokenizer.json.gz").read_bytes()))
    config = from_dict(raw)
    size = sum(2 * math.prod(shape) for shape, _ in expected_tensors(config).values())
    stage(f"{out / 'model.safetensors'}: {size / 1e9:.1f} GB of random BF16 weights (the longest stage: "
          "about half a minute)")
    write_safetensors(out / "model.safetensors", config, args.seed)
    stage(f"done: {out}")
    return 0


def stage(what: str) -> None:
    """One stderr line as each stage starts: the weights take long enough to pass for a hang."""
    print(f"random_checkpoint: {what}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
