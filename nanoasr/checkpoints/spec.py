"""model_specs/fun_asr_nano.json, the one loader: the tensor table (names, shapes, kinds) and the packages."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from nanoasr.model.config import Config


@lru_cache(maxsize=1)
def spec() -> dict:
    return json.loads(resources.files("nanoasr").joinpath("model_specs/fun_asr_nano.json").read_text("utf-8"))


def _layer_set(key: str, config: Config) -> list[int]:
    a = config.audio
    sets = {
        "audio.first": [0],
        "audio.rest": list(range(1, a.num_hidden_layers)),
        "audio.all": list(range(a.num_hidden_layers)),
        "audio.final_norm": list(a.final_norm_layers),
        "adaptor.all": list(range(config.adaptor.num_hidden_layers)),
        "text.all": list(range(config.text.num_hidden_layers)),
    }
    return sets[key]


def _dim(expr, config: Config) -> int:
    if isinstance(expr, int):
        return expr
    value = 1
    for factor in expr.split("*"):
        section, name = factor.split(".")
        value *= getattr(getattr(config, section), name)
    return value


def expected_tensors(config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
    """logical name -> (shape, kind) for this config, from the spec table."""
    out = {}
    for entry in spec()["tensors"]:
        shape = tuple(_dim(d, config) for d in entry["shape"])
        layers = _layer_set(entry["layers"], config) if "layers" in entry else [None]
        for i in layers:
            out[entry["name"].replace("{i}", str(i))] = (shape, entry["kind"])
    return out
