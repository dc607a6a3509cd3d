"""FunASR's llama.cpp runtime files (an encoder GGUF + a llama.cpp qwen3 GGUF) open as one model.

The files are written from the committed tiny checkpoint by tools/reference/funasr_llamacpp.py, which follows
modelscope/FunASR runtime/llama.cpp/fun-asr-nano/export_encoder_gguf.py (commit 3c58cb5) for the encoder and
llama.cpp's convert_hf_to_gguf.py (vendored in llama-cpp-python 0.3.36, Qwen3Model) for the decoder.
"""
from pathlib import Path

import numpy as np
import pytest

from nanoasr import convert
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.tensor import widen
import nanoasr

from tools.lib.parity import cases
from tools.reference import funasr_llamacpp
from tools.reference.funasr_llamacpp import DECODER_FILE, ENCODER_FILE

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
TOKENS = 16  # a prefix of the pinned greedy ids: enough to tell models apart, quick to decode


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_checkpoint(tiny_dir)


@pytest.fixture(scope="module")
def pair(tiny_dir, tmp_path_factory):
    return funasr_llamacpp.write(tiny_dir, tmp_path_factory.mktemp("pair"), "f32", "bf16")


def greedy_ids(model, reference="funasr"):
    wave = cases(REFS, reference)["short"]["wave"]
    result = model.transcribe(wave, sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                              ignore_stop=True)
    return list(result.segments[0].token_ids)


@pytest.mark.parametrize("wtype, outtype", [("f32", "f32"), ("f32", "bf16"), ("f16", "bf16")])
def test_the_pair_holds_the_original_weights_and_config(tiny_dir, original, tmp_path, wtype, outtype):
    folder = funasr_llamacpp.write(tiny_dir, tmp_path, wtype, outtype)
    loaded = load_checkpoint(folder / ENCODER_FILE, llm=folder / DECODER_FILE)
    assert loaded.config == original.config
    assert sorted(loaded.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        mine = loaded.tensors[name]
        assert mine.shape == t.shape, name
        expected = widen(t)
        if mine.dtype == "f16":  # the export's own rounding of the float32 values
            expected = expected.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(widen(mine), expected, err_msg=name)


@pytest.mark.parametrize("reference", ["funasr", "transformers"])
def test_greedy_ids_equal_the_original(pair, reference):
    ref = cases(REFS, reference)["short"]
    model = nanoasr.load_model(str(pair / ENCODER_FILE), llm=str(pair / DECODER_FILE))
    ids = greedy_ids(model, reference)
    assert ids == ref["greedy_ids"][:TOKENS].tolist() and len(set(ids)) > 5


def test_a_directory_holding_both_files_loads(pair, original):
    loaded = load_checkpoint(pair)
    assert loaded.config == original.config and loaded.source["format"] == "funasr-llama.cpp"


def test_q8_0_encoder_blocks_equal_a_nanoasr_gguf_and_give_the_same_ids(tiny_dir, original, tmp_path):
    folder = funasr_llamacpp.write(tiny_dir, tmp_path / "pair", "q8_0", "bf16")
    loaded = load_checkpoint(folder)
    quantized = sorted(n for n, t in loaded.tensors.items() if t.dtype == "q8_0")
    assert quantized and all(n.startswith("model.audio_tower.") or "projector" in n for n in quantized)
    convert.write(tmp_path / "ours.gguf", original, "q8_0", report=False, progress=None)
    ours = load_checkpoint(tmp_path / "ours.gguf")
    for name in quantized:
        assert ours.tensors[name].dtype == "q8_0", name
        blocks = np.asarray(loaded.tensors[name].data)
        np.testing.assert_array_equal(blocks, np.asarray(ours.tensors[name].data), err_msg=name)
    mixed = dict(original.tensors, **{name: ours.tensors[name] for name in quantized})
    reference = nanoasr.Model(Checkpoint(original.config, mixed, original.files))
    assert greedy_ids(nanoasr.Model(loaded)) == greedy_ids(reference)


def with_encoder(tiny_dir, pair, tmp_path, edit=lambda state: state, metadata=None):
    """A folder with the pair's decoder file and an encoder file written from an edited state dict."""
    import json

    from safetensors.torch import load_file

    from tools.reference.funasr_checkpoint import funasr_state_dict

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = json.loads((tiny_dir / "config.json").read_text())
    state = edit(funasr_state_dict(load_file(str(tiny_dir / "model.safetensors")), config))
    funasr_llamacpp.write_encoder(state, metadata or funasr_llamacpp.encoder_metadata(config),
                                  tmp_path / ENCODER_FILE)
    (tmp_path / DECODER_FILE).symlink_to(pair / DECODER_FILE)
    return tmp_path


def full_size_config() -> dict:
    """The values export_encoder_gguf.py writes as constants (the full model's)."""
    return {"audio_config": {"num_stacked_frames": 7, "num_mel_bins": 80, "hidden_size": 512,
                             "num_attention_heads": 4, "intermediate_size": 2048, "num_hidden_layers": 70,
                             "num_timestamp_prediction_layers": 20, "fsmn_kernel_size": 11},
            "adaptor_config": {"hidden_size": 1024, "projector_hidden_size": 2048, "num_hidden_layers": 2,
                               "num_attention_heads": 8}}


def test_the_scripts_full_size_constants_on_tiny_tensors_name_the_disagreeing_key(tiny_dir, pair, tmp_path):
    metadata = funasr_llamacpp.encoder_metadata(full_size_config())
    folder = with_encoder(tiny_dir, pair, tmp_path, metadata=metadata)
    with pytest.raises(ModelError, match=r"funasr-encoder.gguf: metadata funasr.enc.output_size is 512, "
                                         r"but the tensors say 32"):
        load_checkpoint(folder)


def test_an_fsmn_kernel_not_stored_as_k_by_d_is_named(tiny_dir, pair, tmp_path):
    name = "audio_encoder.encoders.0.self_attn.fsmn_block.weight"

    def unflipped(state):  # the file then holds (D, K), as if the export had not transposed it
        state[name] = state[name].permute(2, 1, 0)
        return state

    folder = with_encoder(tiny_dir, pair, tmp_path, unflipped)
    with pytest.raises(ModelError, match=r"expected shape \[32, 1, 11\], found \[11, 1, 32\]"):
        load_checkpoint(folder)


def test_a_missing_or_unexpected_tensor_is_named(tiny_dir, pair, tmp_path):
    def without_norm(state):
        del state["audio_adaptor.blocks.1.norm2.bias"]
        return state

    folder = with_encoder(tiny_dir, pair, tmp_path / "missing", without_norm)
    missing = r"model.multi_modal_projector.layers.1.post_attention_layernorm.bias"
    with pytest.raises(ModelError, match=r"1 tensor\(s\) missing, first " + missing):
        load_checkpoint(folder)

    def with_extra(state):
        state["audio_encoder.embed.weight"] = state["audio_encoder.after_norm.weight"]
        return state

    folder = with_encoder(tiny_dir, pair, tmp_path / "extra", with_extra)
    with pytest.raises(ModelError, match=r"unexpected tensor audio_encoder.embed.weight"):
        load_checkpoint(folder)


def test_each_file_alone_is_refused_with_what_to_give(pair):
    with pytest.raises(ModelError, match=r"encoder file of FunASR's llama.cpp runtime; give its decoder"):
        load_checkpoint(pair / ENCODER_FILE)
    with pytest.raises(ModelError, match=r"qwen3 GGUF holds the decoder only"):
        load_checkpoint(pair / DECODER_FILE)
    with pytest.raises(ModelError, match=r"expected the decoder file .* found 'funasr-sensevoice-encoder'"):
        load_checkpoint(pair / ENCODER_FILE, llm=pair / ENCODER_FILE)


def test_the_command_line_takes_the_pair_to_transcribe_and_to_convert(pair, original, tmp_path, capsys):
    import json

    import soundfile

    from nanoasr import cli

    wav = tmp_path / "clip.wav"
    soundfile.write(wav, cases(REFS, "funasr")["short"]["wave"], 16000)
    status = cli.main([str(wav), "--model", str(pair / ENCODER_FILE), "--llm", str(pair / DECODER_FILE),
                       "--max-new-tokens", "4", "-f", "json", "-q"])
    assert status == 0 and json.loads(capsys.readouterr().out)["segments"]
    out = tmp_path / "converted.gguf"
    assert cli.main(["convert", str(pair / ENCODER_FILE), "--llm", str(pair / DECODER_FILE), "--type", "f32",
                     "-o", str(out)]) == 0
    converted = load_checkpoint(out)
    assert converted.config == original.config
    for name, t in original.tensors.items():
        np.testing.assert_array_equal(widen(converted.tensors[name]), widen(t), err_msg=name)


def test_a_folder_of_ggufs_holds_one_model_or_says_what_it_found(pair, original, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    convert.write(one / "model.gguf", original, "f32", report=False, progress=None)
    assert load_checkpoint(one).config == original.config
    (one / "other.gguf").symlink_to(pair / DECODER_FILE)
    with pytest.raises(ModelError, match=r"expected one model in the directory.* found 2 GGUF file\(s\) "
                                         r"\(model.gguf, other.gguf\)"):
        load_checkpoint(one)


def test_each_gguf_header_is_parsed_once(pair, monkeypatch):
    from nanoasr.formats import gguf_read

    reads = []
    real = gguf_read.read_header
    monkeypatch.setattr(gguf_read, "read_header", lambda path: reads.append(path) or real(path))
    load_checkpoint(pair)
    assert sorted(p.name for p in reads) == sorted([DECODER_FILE, ENCODER_FILE])
    reads.clear()
    load_checkpoint(pair / ENCODER_FILE, llm=pair / DECODER_FILE)
    assert sorted(p.name for p in reads) == sorted([DECODER_FILE, ENCODER_FILE])
