"""Typed config: nested and legacy layouts, and one clear error per unsupported value."""
import copy
import json

import pytest

from nanoasr.checkpoints.load import load_config
from nanoasr.errors import ModelError
from nanoasr.model import config as cm

NESTED = {
    "audio_config": {"hidden_size": 512, "num_attention_heads": 4, "intermediate_size": 2048,
                     "num_hidden_layers": 70, "num_timestamp_prediction_layers": 20, "fsmn_kernel_size": 11,
                     "layer_norm_eps": 1e-5, "hidden_act": "relu", "num_mel_bins": 80,
                     "num_stacked_frames": 7},
    "adaptor_config": {"hidden_size": 1024, "intermediate_size": 256, "num_attention_heads": 8,
                       "num_hidden_layers": 2, "projector_hidden_size": 2048, "layer_norm_eps": 1e-5,
                       "hidden_act": "relu", "projector_hidden_act": "relu"},
    "text_config": {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
                    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                    "head_dim": 128, "rms_norm_eps": 1e-6,
                    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
                    "hidden_act": "silu", "tie_word_embeddings": True, "max_position_embeddings": 40960},
    "audio_token_id": 151646,
    "tie_word_embeddings": True,
}


def test_nested_config_gives_the_real_model():
    assert cm.from_dict(NESTED) == cm.Config()
    assert cm.Config().audio.final_norm_layers == (49, 69)
    assert cm.Config().audio.input_size == 560


def test_rope_theta_both_spellings_and_never_assumed():
    raw = copy.deepcopy(NESTED)
    raw["text_config"].pop("rope_parameters")
    with pytest.raises(ModelError, match="rope_theta"):
        cm.from_dict(raw)
    raw["text_config"]["rope_theta"] = 10000.0
    assert cm.from_dict(raw).text.rope_theta == 10000.0


def test_legacy_flat_adaptor_fields_and_encoder_config(tmp_path):
    raw = copy.deepcopy(NESTED)
    adaptor = raw.pop("adaptor_config")
    raw.update(adaptor_intermediate_size=adaptor["intermediate_size"],
               adaptor_num_attention_heads=adaptor["num_attention_heads"],
               adaptor_num_hidden_layers=adaptor["num_hidden_layers"])
    audio = raw.pop("audio_config")
    raw["encoder_config"] = {"d_model": 512, "encoder_attention_heads": 4, "encoder_ffn_dim": 2048,
                             "encoder_layers": 50, "num_timestamp_prediction_blocks": 20, "kernel_size": 11,
                             "num_mel_bins": 80, "num_stacked_frames": 7}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    config = load_config(path)
    assert config.audio == cm.from_dict(dict(NESTED, audio_config=audio)).audio
    assert config.adaptor.intermediate_size == 256 and config.adaptor.num_attention_heads == 8


@pytest.mark.parametrize("section, key, value, message", [
    ("audio_config", "hidden_act", "gelu", "audio_config.hidden_act"),
    ("adaptor_config", "projector_hidden_act", "tanh", "projector_hidden_act"),
    ("text_config", "hidden_act", "gelu", "silu"),
    ("text_config", "tie_word_embeddings", False, "tie_word_embeddings"),
    ("adaptor_config", "hidden_size", 512, "must equal text hidden_size"),
    ("text_config", "num_key_value_heads", 5, "num_key_value_heads"),
    ("audio_config", "num_attention_heads", 3, "not divisible"),
    ("audio_config", "hidden_size", "512", "must be int"),
    ("audio_config", "num_timestamp_prediction_layers", 70, "num_timestamp_prediction_layers"),
])
def test_unsupported_values_are_named(section, key, value, message):
    raw = copy.deepcopy(NESTED)
    raw[section][key] = value
    if key == "tie_word_embeddings":
        raw["tie_word_embeddings"] = False
    with pytest.raises(ModelError, match=message):
        cm.from_dict(raw)


def test_bad_json_and_missing_file(tmp_path):
    path = tmp_path / "config.json"
    with pytest.raises(ModelError, match="not found"):
        load_config(path)
    path.write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        load_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ModelError, match="JSON object"):
        load_config(path)
    path.write_text(json.dumps({"audio_config": {}}))
    with pytest.raises(ModelError, match="text_config"):
        load_config(path)
