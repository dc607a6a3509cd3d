"""FunASR's CTC branch as a checkpoint holds it: its tensors (`ctc_decoder.*`, `ctc.ctc_lo.*`) in our names,
its config from their shapes and config.yaml, and the vocabulary file beside model.pt. Only the ModelScope
copy of Fun-ASR-Nano-2512's model.pt carries it; nanoasr.model.ctc runs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanoasr.checkpoints.ctc_vocab import CtcVocabulary
from nanoasr.checkpoints.layouts import funasr_transformer_name
from nanoasr.checkpoints.shapes import layer_count
from nanoasr.errors import ModelError
from nanoasr.model.ctc import P, CtcConfig
from nanoasr.tensor import StoredTensor
from nanoasr.untrusted import short

VOCAB_FILE = "multilingual.tiktoken"
HOLDERS = ("only the ModelScope copy of FunAudioLLM/Fun-ASR-Nano-2512's model.pt has it (with "
           f"{VOCAB_FILE} beside it); the Hugging Face copies, the -hf safetensors, GGUF files and "
           "Fun-ASR-MLT-Nano do not")


@dataclass(frozen=True)
class CtcBranch:
    config: CtcConfig
    tensors: dict[str, StoredTensor]  # logical names (expected_tensors)
    vocabulary: CtcVocabulary


def logical_name(name: str) -> str:
    """FunASR's name -> ours: linear1/2 -> linear_1/2, blocks.i -> layers.i (the adaptor's sublayer names)."""
    return funasr_transformer_name(name, P, P) or name


def expected_tensors(cfg: CtcConfig) -> dict[str, tuple[int, ...]]:
    h, ffn = cfg.hidden_size, cfg.hidden_size // 4  # FunASR's blocks: feed-forward width llm_dim // 4
    out = {f"{P}linear_1.weight": (cfg.projector_hidden_size, cfg.input_size),
           f"{P}linear_1.bias": (cfg.projector_hidden_size,),
           f"{P}linear_2.weight": (h, cfg.projector_hidden_size), f"{P}linear_2.bias": (h,),
           "ctc.ctc_lo.weight": (cfg.vocab_size, h), "ctc.ctc_lo.bias": (cfg.vocab_size,)}
    for i in range(cfg.num_hidden_layers):
        p = f"{P}layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out.update({f"{p}{norm}.weight": (h,), f"{p}{norm}.bias": (h,)})
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.update({f"{p}self_attn.{proj}.weight": (h, h), f"{p}self_attn.{proj}.bias": (h,)})
        out.update({f"{p}mlp.fc1.weight": (ffn, h), f"{p}mlp.fc1.bias": (ffn,),
                    f"{p}mlp.fc2.weight": (h, ffn), f"{p}mlp.fc2.bias": (h,)})
    return out


def _yaml_int(section: dict, key: str, default: int, where: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where}: {key} must be an integer, found {short(value)}")
    return value


def config_from(tensors: dict[str, StoredTensor], yaml: dict | None, where: str) -> CtcConfig:
    """Widths and depth from the tensors' shapes; the head count and blank id from config.yaml (FunASR's
    defaults where it says nothing)."""
    ffn, input_size = tensors[f"{P}linear_1.weight"].shape
    vocab, hidden = tensors["ctc.ctc_lo.weight"].shape
    yaml = yaml or {}
    conf, ctc_conf = yaml.get("ctc_decoder_conf") or {}, yaml.get("ctc_conf") or {}
    if not isinstance(conf, dict) or not isinstance(ctc_conf, dict):
        raise ModelError(f"{where}: config.yaml: ctc_decoder_conf and ctc_conf must be mappings")
    if _yaml_int(conf, "downsample_rate", 1, where) != 1:
        raise ModelError(f"{where}: config.yaml: ctc_decoder_conf.downsample_rate must be 1")
    vocab = _yaml_int(yaml, "ctc_vocab_size", vocab, where)
    return CtcConfig(input_size, ffn, hidden, layer_count(tensors, f"{P}layers.", where),
                     _yaml_int(conf, "attention_heads", 8, where), vocab,
                     _yaml_int(ctc_conf, "blank_id", vocab - 1, where))


def _problem(tensors: dict[str, StoredTensor], yaml: dict | None, where: str) -> str | None:
    """What keeps the branch from running (no tensors, a partial set, a wrong shape), or None."""
    if not tensors:
        return "it has no ctc_decoder.* or ctc.ctc_lo.* tensors"
    if not all(n in tensors for n in (f"{P}linear_1.weight", "ctc.ctc_lo.weight")):
        return (f"it has a partial CTC branch ({len(tensors)} tensors; the full one has ctc_decoder.linear1, "
                f"linear2, blocks and ctc.ctc_lo)")
    expected = expected_tensors(config_from(tensors, yaml, where))
    missing = [n for n in expected if n not in tensors]
    if missing:
        return f"it has a partial CTC branch ({len(missing)} tensor(s) missing, first {missing[0]})"
    for name, t in tensors.items():
        if tuple(t.shape) != expected.get(name, ()):
            return f"its CTC tensor {name} has shape {list(t.shape)}, expected {list(expected.get(name, ()))}"
    return _config_problem(config_from(tensors, yaml, where))


def _config_problem(cfg: CtcConfig) -> str | None:
    """What in config.yaml keeps the branch from running: heads that do not split the width, a blank id
    outside the vocabulary."""
    if cfg.num_attention_heads < 1 or cfg.hidden_size % cfg.num_attention_heads:
        return (f"its ctc_decoder_conf.attention_heads is {cfg.num_attention_heads}, which does not split "
                f"the CTC decoder's width {cfg.hidden_size} into heads")
    if not 0 <= cfg.blank_id < cfg.vocab_size:
        return (f"its ctc_conf.blank_id is {cfg.blank_id}, outside the CTC vocabulary "
                f"(0 to {cfg.vocab_size - 1})")
    return None


def load(raw: dict[str, StoredTensor], yaml: dict | None, folder: Path,
         where: str) -> tuple[CtcBranch | None, str | None]:
    """(branch, None) when model.pt's CTC tensors and the vocabulary file make a whole branch, else
    (None, why not): a checkpoint without one still transcribes."""
    tensors = {logical_name(n): t for n, t in raw.items() if n.startswith(("ctc.", "ctc_decoder."))}
    try:  # a faulty branch leaves the model transcribing; word timestamps then say what is wrong
        problem = _problem(tensors, yaml, where)
        if problem is None and not (folder / VOCAB_FILE).is_file():
            problem = f"{folder / VOCAB_FILE} is missing (the CTC vocabulary)"
        if problem is not None:
            return None, problem
        config, vocabulary = config_from(tensors, yaml, where), CtcVocabulary.read(folder / VOCAB_FILE)
        if vocabulary.n_ranks > config.vocab_size:
            return None, (f"{folder / VOCAB_FILE} ranks {vocabulary.n_ranks} tokens, more than the "
                          f"{config.vocab_size} rows of ctc.ctc_lo")
        return CtcBranch(config, tensors, vocabulary), None
    except ModelError as exc:
        return None, str(exc)


def vector_names(branch: CtcBranch) -> set[str]:
    """Norms and biases: widened to float32 once when the weights are placed."""
    return {name for name, t in branch.tensors.items() if len(t.shape) == 1}
