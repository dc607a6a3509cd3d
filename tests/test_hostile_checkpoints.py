"""Malformed checkpoint directories and GGUF files: each gives one ModelError naming the file, the field or
tensor, and what was expected; the command line prints it as one line; NaN/Inf weights never reach a
transcript."""
import json
import math
import re
import shutil
import struct

import numpy as np
import pytest
import soundfile
from gguf import GGUFValueType
from gguf.quants import dequantize as gguf_dequantize

from nanoasr import convert
from nanoasr.checkpoints.gguf_schema import load_gguf
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.formats.gguf_read import read_header
from nanoasr.formats.gguf_vocab import vocab_arrays
from test_gguf import Q8Quantizer, random_checkpoint
from tools.lib.synth import speech_like

NORM = "model.language_model.norm.weight"  # bf16 [16] in the tiny checkpoint
MATRIX = "model.language_model.layers.1.self_attn.q_proj.weight"  # bf16 [32, 16], read at the first forward
BF16_NAN, BF16_INF = 0x7FC0, 0x7F80


def checkpoint_copy(tiny_dir, tmp_path):
    """The tiny checkpoint in tmp_path; its 18 MB tokenizer.json is a link, replaced (never written through)
    by the cases that corrupt it."""
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in tiny_dir.iterdir():
        if f.name == "tokenizer.json":
            (out / f.name).symlink_to(f)
        else:
            shutil.copy(f, out / f.name)
    return out


def table(cases):
    """pytest params from rows of (description, arguments...)."""
    return [pytest.param(*case[1:], id=case[0]) for case in cases]


def replace(path, content: bytes) -> None:
    path.unlink()
    path.write_bytes(content)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# --- config.json -------------------------------------------------------------------------------------------

def setting(section, key, value):
    def mutate(raw):
        (raw[section] if section else raw)[key] = value
    return mutate


def legacy_encoder_config(raw):
    raw.pop("audio_config")
    raw["encoder_config"] = {"d_model": 32, "encoder_layers": "3", "num_timestamp_prediction_blocks": 2}


CONFIG_CASES = [
    ("zero audio heads", setting("audio_config", "num_attention_heads", 0),
     r"audio_config\.num_attention_heads must be a positive integer, found 0"),
    ("zero text heads", setting("text_config", "num_attention_heads", 0),
     r"text_config\.num_attention_heads must be a positive integer, found 0"),
    ("zero kv heads", setting("text_config", "num_key_value_heads", 0),
     r"text_config\.num_key_value_heads must be a positive integer, found 0"),
    ("zero adaptor heads", setting("adaptor_config", "num_attention_heads", 0),
     r"adaptor_config\.num_attention_heads must be a positive integer, found 0"),
    ("negative hidden size", setting("text_config", "hidden_size", -16),
     r"text_config\.hidden_size must be a positive integer, found -16"),
    ("zero audio layers", setting("audio_config", "num_hidden_layers", 0),
     r"audio_config\.num_hidden_layers must be a positive integer, found 0"),
    ("zero vocabulary", setting("text_config", "vocab_size", 0),
     r"text_config\.vocab_size must be a positive integer, found 0"),
    ("true as a size", setting("adaptor_config", "hidden_size", True),
     r"hidden_size must be int, found True"),
    ("float as a size", setting("audio_config", "intermediate_size", 64.0),
     r"intermediate_size must be int, found 64\.0"),
    ("odd head_dim", setting("text_config", "head_dim", 7), r"head_dim must be even for RoPE, found 7"),
    ("string audio_token_id", setting(None, "audio_token_id", "151646"),
     r"audio_token_id must be an integer token id, found '151646'"),
    ("true audio_token_id", setting(None, "audio_token_id", True),
     r"audio_token_id must be an integer token id, found True"),
    ("negative audio_token_id", setting(None, "audio_token_id", -1),
     r"audio_token_id -1 is outside the vocabulary \(size 151936\)"),
    ("audio_token_id past the vocabulary", setting(None, "audio_token_id", 151936),
     r"audio_token_id 151936 is outside the vocabulary"),
    ("string rope_theta", setting("text_config", "rope_parameters", {"rope_theta": "1e6"}),
     r"text_config\.rope_theta must be a number, found '1e6'"),
    ("zero rope_theta", setting("text_config", "rope_parameters", {"rope_theta": 0}),
     r"text_config\.rope_theta must be a positive finite number, found 0\.0"),
    ("infinite rope_theta", setting("text_config", "rope_theta", math.inf),
     r"text_config\.rope_theta must be a positive finite number, found inf"),
    ("rope_theta past float range", setting("text_config", "rope_theta", 10 ** 400),
     r"text_config\.rope_theta must be a positive finite number, found inf"),
    ("list rope_parameters", setting("text_config", "rope_parameters", [1e6]),
     r"text_config\.rope_parameters must be an object, found \[1000000\.0\]"),
    ("negative rms_norm_eps", setting("text_config", "rms_norm_eps", -1),
     r"text_config\.rms_norm_eps must be a positive finite number, found -1\.0"),
    ("zero layer_norm_eps", setting("audio_config", "layer_norm_eps", 0),
     r"audio_config\.layer_norm_eps must be a positive finite number, found 0\.0"),
    ("NaN layer_norm_eps", setting("adaptor_config", "layer_norm_eps", math.nan),
     r"adaptor_config\.layer_norm_eps must be a positive finite number, found nan"),
    ("string eps", setting("adaptor_config", "layer_norm_eps", "1e-5"),
     r"adaptor_config: layer_norm_eps must be a number, found '1e-5'"),
    ("string tie_word_embeddings", setting(None, "tie_word_embeddings", "false"),
     r"tie_word_embeddings must be true or false, found 'false'"),
    ("list audio_config", setting(None, "audio_config", []), r"audio_config must be an object, found list"),
    ("string adaptor_config", setting(None, "adaptor_config", "x"),
     r"adaptor_config must be an object, found str"),
    ("string legacy encoder_layers", legacy_encoder_config,
     r"encoder_config\.encoder_layers and num_timestamp_prediction_blocks must be integers, found '3'"),
]


@pytest.mark.parametrize("mutate, message", table(CONFIG_CASES))
def test_config_values_of_the_wrong_kind_or_range(tiny_dir, tmp_path, mutate, message):
    d = checkpoint_copy(tiny_dir, tmp_path)
    raw = json.loads((d / "config.json").read_text())
    mutate(raw)
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=message) as err:
        load_checkpoint(d)
    assert str(d / "config.json") in str(err.value)


def test_a_billion_layers_is_refused_before_the_name_table_is_built(tiny_dir, tmp_path):
    d = checkpoint_copy(tiny_dir, tmp_path)
    raw = json.loads((d / "config.json").read_text())
    raw["text_config"]["num_hidden_layers"] = 10 ** 9
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=rf"{d}: text_config\.num_hidden_layers is 1000000000, but the "
                                         r"checkpoint holds only 149 tensors"):
        load_checkpoint(d)


# --- whole files that are not what they claim --------------------------------------------------------------

def directory_named(name):
    def mutate(d):
        (d / name).unlink()
        (d / name).mkdir()
    return mutate


def content(name, data: bytes):
    return lambda d: replace(d / name, data)


FILE_CASES = [
    ("config.json a directory", directory_named("config.json"), "config.json", "config.json cannot be read"),
    ("config.json a list", content("config.json", b"[1, 2]"), "config.json",
     "expected a JSON object, found list"),
    ("config.json a number", content("config.json", b"7"), "config.json",
     "expected a JSON object, found int"),
    ("config.json not UTF-8", content("config.json", b'{"a": "\xff\xfe"}'), "config.json",
     "config.json cannot be read.*utf-8"),
    ("config.json nested too deep", content("config.json", nested(100_000)), "config.json",
     "not valid JSON.*RecursionError"),
    ("tokenizer.json not UTF-8", content("tokenizer.json", b'{"model": "\xff"}'), "tokenizer.json",
     "cannot be read as UTF-8 text"),
    ("tokenizer_config.json not UTF-8", content("tokenizer_config.json", b"\xff\xfe"),
     "tokenizer_config.json", "cannot be read as UTF-8 text"),
    ("model.safetensors a directory", directory_named("model.safetensors"), "model.safetensors",
     "cannot be read as a safetensors file"),
]


@pytest.mark.parametrize("mutate, named, message", table(FILE_CASES))
def test_files_that_are_not_what_they_claim(tiny_dir, tmp_path, mutate, named, message):
    d = checkpoint_copy(tiny_dir, tmp_path)
    mutate(d)
    with pytest.raises(ModelError, match=message) as err:
        load_checkpoint(d)
    assert str(d / named) in str(err.value)


# --- safetensors header ------------------------------------------------------------------------------------

def parts(path) -> tuple[bytes, bytes]:
    """(header bytes, data section) of a safetensors file."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return blob[8:8 + n], blob[8 + n:]


def header_of(path):
    raw, data = parts(path)
    return json.loads(raw), data


def write_header(path, header: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def entry(field, value):
    def mutate(header):
        header[NORM][field] = value
    return mutate


def whole_entry(value):
    def mutate(header):
        header[NORM] = value
    return mutate


def norm_offsets(header):
    begin, _ = header[NORM]["data_offsets"]
    header[NORM]["data_offsets"] = [begin, begin + 30]  # 15 BF16 values for a [16] tensor


HEADER_CASES = [
    ("dtype a list", entry("dtype", ["BF16"]), r"norm\.weight: dtype \['BF16'\] is not supported"),
    ("dtype a number", entry("dtype", 16), r"norm\.weight: dtype 16 is not supported \(expected F32, F16"),
    ("shape a string", entry("shape", "16"), r"shape must be a list of non-negative integers, found '16'"),
    ("shape negative", entry("shape", [-16]),
     r"shape must be a list of non-negative integers, found \[-16\]"),
    ("shape of floats", entry("shape", [16.0]), r"shape must be a list of non-negative integers"),
    ("shape overflowing int64", entry("shape", [2 ** 62, 2 ** 62]),
     r"does not fit shape \[4611686018427387904, 4611686018427387904\] BF16 "
     r"\(42535295865117307932921825928971026432 bytes\)"),
    ("offsets a string", entry("data_offsets", "0,32"), r"data_offsets must be two non-negative integers"),
    ("offsets negative", entry("data_offsets", [-32, 0]), r"data_offsets must be two non-negative integers"),
    ("offsets three", entry("data_offsets", [0, 16, 32]), r"data_offsets must be two non-negative integers"),
    ("offsets past the data", entry("data_offsets", [0, 10 ** 12]), r"does not fit shape \[16\] BF16"),
    ("offsets disagree with the shape", norm_offsets,
     r"data \[\d+, \d+\) does not fit shape \[16\] BF16 \(32 bytes\)"),
    ("entry a number", whole_entry(5),
     r"norm\.weight: expected an object with dtype, shape and data_offsets"),
    ("entry without offsets", whole_entry({"dtype": "BF16", "shape": [16]}),
     r"expected an object with dtype"),
]


@pytest.mark.parametrize("mutate, message", table(HEADER_CASES))
def test_safetensors_header_fields_of_the_wrong_kind(tiny_dir, tmp_path, mutate, message):
    d = checkpoint_copy(tiny_dir, tmp_path)
    path = d / "model.safetensors"
    header, data = header_of(path)
    mutate(header)
    write_header(path, json.dumps(header).encode(), data)
    with pytest.raises(ModelError, match=message) as err:
        load_checkpoint(d)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("raw_header, message", [
    (b'{"a": ' + nested(100_000) + b"}", "not valid JSON.*RecursionError"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"a": "\xff"}', "not valid JSON"),
], ids=["nested too deep", "a list", "not UTF-8"])
def test_safetensors_header_that_is_not_a_json_object(tiny_dir, tmp_path, raw_header, message):
    d = checkpoint_copy(tiny_dir, tmp_path)
    path = d / "model.safetensors"
    write_header(path, raw_header, header_of(path)[1])
    with pytest.raises(ModelError, match=f"{path}: safetensors header is {message}"):
        load_checkpoint(d)


def test_header_length_larger_than_the_file(tiny_dir, tmp_path):
    d = checkpoint_copy(tiny_dir, tmp_path)
    path = d / "model.safetensors"
    blob = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob[8:])
    with pytest.raises(ModelError, match=f"{path}: safetensors header claims {len(blob)} bytes"):
        load_checkpoint(d)


# --- sharded checkpoints -----------------------------------------------------------------------------------

SHARD = "model-00001-of-00001.safetensors"


def sharded_copy(tiny_dir, tmp_path):
    """The tiny checkpoint as one shard and its index (which the cases then corrupt)."""
    d = checkpoint_copy(tiny_dir, tmp_path)
    (d / "model.safetensors").rename(d / SHARD)
    names = [n for n in header_of(d / SHARD)[0] if n != "__metadata__"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: SHARD for n in names}}))
    return d


def index_text(mutate):
    def edit(d, outside):
        path = d / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        mutate(index, d, outside)
        path.write_text(json.dumps(index))
    return edit


def point_norm_to(where):
    def mutate(index, d, outside):
        index["weight_map"][NORM] = where(d, outside)
    return mutate


def symlink_escaping(d, outside):
    (d / "linked.safetensors").symlink_to(outside)
    return "linked.safetensors"


def symlink_loop(d, outside):
    (d / "loop.safetensors").symlink_to(d / "loop.safetensors")
    return "loop.safetensors"


INDEX_CASES = [
    ("weight_map a list", index_text(lambda index, d, o: index.update(weight_map=list(index["weight_map"]))),
     r"weight_map must be an object of tensor name -> shard file name, found list"),
    ("weight_map value a number", index_text(point_norm_to(lambda d, o: 5)),
     r"weight_map\['model\.language_model\.norm\.weight'\] must be a shard file name, found 5"),
    ("index a list", lambda d, o: (d / "model.safetensors.index.json").write_text("[]"),
     "expected a JSON object with a weight_map, found list"),
    ("index not JSON", lambda d, o: (d / "model.safetensors.index.json").write_text("{"),
     "not a valid safetensors index"),
    ("index nested too deep", lambda d, o: (d / "model.safetensors.index.json").write_bytes(nested(100_000)),
     "not a valid safetensors index.*RecursionError"),
    ("index a directory", lambda d, o: directory_named("model.safetensors.index.json")(d),
     "not a valid safetensors index.*is a directory, not a regular file"),
    ("shard in the parent directory", index_text(point_norm_to(lambda d, o: "../outside.safetensors")),
     "shard '../outside.safetensors' lies outside the checkpoint directory"),
    ("shard by absolute path", index_text(point_norm_to(lambda d, o: str(o))),
     "lies outside the checkpoint directory"),
    ("shard a symlink leading out", index_text(point_norm_to(symlink_escaping)),
     "shard 'linked.safetensors' lies outside the checkpoint directory"),
    ("shard a symlink loop", index_text(point_norm_to(symlink_loop)),
     "shard 'loop.safetensors' (cannot be resolved|is missing)"),  # Python 3.13 resolves loops quietly
    ("shard missing", index_text(point_norm_to(lambda d, o: "absent.safetensors")),
     "shard 'absent.safetensors' is missing"),
]


@pytest.mark.parametrize("mutate, message", table(INDEX_CASES))
def test_shard_index_that_is_malformed_or_leads_outside(tiny_dir, tmp_path, monkeypatch, mutate, message):
    from nanoasr.formats import safetensors

    d = sharded_copy(tiny_dir, tmp_path)
    outside = tmp_path / "outside.safetensors"  # a valid file, so only the refusal can stop it being read
    shutil.copy(d / SHARD, outside)
    mutate(d, outside)
    read = safetensors.read

    def read_inside(path):
        assert path.parent == d.resolve(), f"opened {path}, outside the checkpoint"
        return read(path)
    monkeypatch.setattr(safetensors, "read", read_inside)
    with pytest.raises(ModelError, match=message) as err:
        load_checkpoint(d)
    assert str(d / "model.safetensors.index.json") in str(err.value)


def test_sharded_checkpoint_in_a_hub_cache_snapshot_loads(tiny_dir, tmp_path):
    """huggingface_hub's cache links each snapshot file to ../../blobs: those links are not escapes."""
    d = sharded_copy(tiny_dir, tmp_path)
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    shutil.move(d / SHARD, repo / "blobs" / "sha")
    shutil.copytree(d, snapshot, symlinks=True)
    (snapshot / SHARD).symlink_to("../../blobs/sha")
    assert load_checkpoint(snapshot).tensors[NORM].shape == (16,)


# --- NaN / Inf weights -------------------------------------------------------------------------------------

def with_bits(d, name, bits: int, index: int = 3) -> None:
    """Set one BF16 element of tensor `name` in the copy's model.safetensors."""
    path = d / "model.safetensors"
    raw, data = parts(path)
    begin = json.loads(raw)[name]["data_offsets"][0] + 2 * index
    write_header(path, raw, data[:begin] + struct.pack("<H", bits) + data[begin + 2:])


@pytest.mark.parametrize("name, bits", [
    (NORM, BF16_NAN), ("model.audio_tower.layers.2.self_attn.fsmn.conv.weight", BF16_INF),
    ("model.multi_modal_projector.linear_1.bias", 0xFF80),  # -Inf
])
def test_nan_or_inf_in_a_vector_is_refused_at_load(tiny_dir, tmp_path, name, bits):
    d = checkpoint_copy(tiny_dir, tmp_path)
    with_bits(d, name, bits)
    with pytest.raises(ModelError, match=f"{d}: tensor {name}: expected finite values, found NaN or Inf"):
        load_checkpoint(d)


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio") / "a.wav"
    soundfile.write(path, speech_like(2.0, seed=5), 16000)
    return path


@pytest.mark.parametrize("name", [MATRIX, "model.audio_tower.layers.0.mlp.fc2.weight",
                                  "model.language_model.embed_tokens.weight"])
def test_nan_in_a_matrix_fails_the_first_transcription_naming_the_tensor(tiny_dir, tmp_path, wav, name):
    from nanoasr.api import Model

    d = checkpoint_copy(tiny_dir, tmp_path)
    with_bits(d, name, BF16_NAN)
    model = Model.load(str(d))  # matrices are not read at load
    expected = rf"NaN or Inf in 1 tensor\(s\): {name} \(in {d / 'model.safetensors'}\)"
    with pytest.raises(ModelError, match=expected):
        model.transcribe(str(wav), max_new_tokens=2)


def test_nonfinite_logits_from_finite_weights_say_so(tiny_model):
    from nanoasr.model.generate import generate

    embeds = np.zeros((4, tiny_model.config.text.hidden_size), np.float32)
    embeds[1, 0] = np.inf  # stands for activations that overflowed before the decoder
    with pytest.raises(ModelError, match="logits hold NaN or Inf although every weight is finite"):
        generate([embeds], [2], tiny_model.weights, tiny_model.config.text, tiny_model.tokenizer.stop_ids)


# --- the command line: one line, no traceback -------------------------------------------------------------

CLI_CASES = [
    ("zero heads", lambda d: (d / "config.json").write_text((d / "config.json").read_text().replace(
        '"num_key_value_heads": 2', '"num_key_value_heads": 0')),
     r"text_config\.num_key_value_heads must be a positive integer, found 0"),
    ("config.json a directory", directory_named("config.json"), "config.json cannot be read"),
    ("tokenizer.json not JSON", content("tokenizer.json", b"{not json"),
     "tokenizer.json cannot be read by the tokenizers library"),
    ("tokenizer.json without the audio token", content("tokenizer.json", json.dumps(
        {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}).encode()),
     "tokenizer.json: special token"),
    ("header nested too deep",
     lambda d: write_header(d / "model.safetensors", b'{"a": ' + nested(100_000) + b"}", b""),
     "RecursionError"),
    ("NaN norm", lambda d: with_bits(d, NORM, BF16_NAN), f"{NORM}: expected finite values"),
    ("NaN matrix", lambda d: with_bits(d, MATRIX, BF16_NAN), f"NaN or Inf in 1 tensor\\(s\\): {MATRIX}"),
]


@pytest.mark.parametrize("mutate, message", table(CLI_CASES))
def test_command_line_prints_one_error_line(tiny_dir, tmp_path, wav, capsys, mutate, message):
    from nanoasr.cli import main

    d = checkpoint_copy(tiny_dir, tmp_path)
    mutate(d)
    assert main(["--model", str(d), "--max-new-tokens", "2", str(wav)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nanoasr: error: ") and str(d) in err[0], err
    assert re.search(message, err[0]), err


# --- GGUF ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_checkpoint():
    return random_checkpoint()


def gguf_with(small_checkpoint, tmp_path, monkeypatch, key, value, vtype):
    """A nanoasr GGUF of the small checkpoint whose metadata `key` is replaced by `value` of type `vtype`."""
    add_keys = convert._add_nanoasr_keys

    def add_then_replace(w, checkpoint):
        add_keys(w, checkpoint)
        w.add_key_value(key, value, vtype)
    monkeypatch.setattr(convert, "_add_nanoasr_keys", add_then_replace)
    path = tmp_path / "bad.gguf"
    convert.write(path, small_checkpoint, "f32", report=False, progress=None)
    monkeypatch.undo()
    return path


U32, F64, STR, BOOL = GGUFValueType.UINT32, GGUFValueType.FLOAT64, GGUFValueType.STRING, GGUFValueType.BOOL
GGUF_CASES = [
    ("zero text heads", "fun_asr_nano.text.num_attention_heads", 0, U32,
     r"text_config\.num_attention_heads must be a positive integer, found 0"),
    ("zero audio heads", "fun_asr_nano.audio.num_attention_heads", 0, U32,
     r"audio_config\.num_attention_heads must be a positive integer, found 0"),
    ("size as a string", "fun_asr_nano.audio.hidden_size", "64", STR, r"hidden_size must be int, found '64'"),
    ("size as a bool", "fun_asr_nano.adaptor.num_hidden_layers", True, BOOL,
     r"num_hidden_layers must be int, found True"),
    ("rope_theta as a string", "fun_asr_nano.text.rope_theta", "5e5", STR,
     r"rope_theta must be a number, found '5e5'"),
    ("rope_theta zero", "fun_asr_nano.text.rope_theta", 0.0, F64,
     r"text_config\.rope_theta must be a positive finite number, found 0\.0"),
    ("rope_theta NaN", "fun_asr_nano.text.rope_theta", math.nan, F64,
     r"text_config\.rope_theta must be a positive finite number, found nan"),
    ("rms_norm_eps negative", "fun_asr_nano.text.rms_norm_eps", -1.0, F64,
     r"text_config\.rms_norm_eps must be a positive finite number, found -1\.0"),
    ("audio_token_id as a string", "fun_asr_nano.audio_token_id", "7", STR,
     r"audio_token_id must be an integer token id, found '7'"),
    ("audio_token_id past the vocabulary", "fun_asr_nano.audio_token_id", 100000, U32,
     r"audio_token_id 100000 is outside the vocabulary \(size 320\)"),
    ("tie_word_embeddings as a number", "fun_asr_nano.text.tie_word_embeddings", 1, U32,
     r"tie_word_embeddings must be bool, found 1"),
]


@pytest.mark.parametrize("key, value, vtype, message", table(GGUF_CASES))
def test_gguf_metadata_of_the_wrong_kind_or_range(small_checkpoint, tmp_path, monkeypatch, key, value, vtype,
                                                  message):
    path = gguf_with(small_checkpoint, tmp_path, monkeypatch, key, value, vtype)
    with pytest.raises(ModelError, match=message) as err:
        load_gguf(path)
    assert str(path) in str(err.value)


def quantized_gguf(small_checkpoint, tmp_path, monkeypatch, target):
    if target == "q8_0":
        monkeypatch.setattr(convert, "quantize", Q8Quantizer)
    path = tmp_path / f"{target}.gguf"
    convert.write(path, small_checkpoint, target, report=False, progress=None)
    return path


@pytest.mark.parametrize("target, dtype, offset", [
    ("q8_0", "Q8_0", 0),  # d
    ("q4_k_m", "Q4_K", 0),  # d
    ("q4_k_m", "Q4_K", 2),  # dmin
    ("q4_k_m", "Q6_K", 208),  # d, after 128 + 64 quant bytes and 16 scales
])
def test_nan_block_scale_is_refused_at_load(small_checkpoint, tmp_path, monkeypatch, target, dtype, offset):
    path = quantized_gguf(small_checkpoint, tmp_path, monkeypatch, target)
    info = next(t for t in read_header(path).tensors if t.ggml_type.name == dtype)
    blob = bytearray(path.read_bytes())
    block_bytes = {"Q8_0": 34, "Q4_K": 144, "Q6_K": 210}[dtype]
    at = info.start + 5 * block_bytes + offset  # the sixth block's scale
    blob[at:at + 2] = struct.pack("<e", math.nan)
    path.write_bytes(blob)
    data = np.frombuffer(bytes(blob[info.start:info.start + info.nbytes]), np.uint8)
    block = data.reshape(info.shape[0], -1)
    assert np.isnan(gguf_dequantize(block, info.ggml_type)).any()  # the bytes patched are a scale
    with pytest.raises(ModelError, match=rf"{path}: tensor {info.name}: expected finite block scales"):
        load_gguf(path)


def test_nan_in_an_f32_vector_of_a_gguf_is_refused_at_load(small_checkpoint, tmp_path):
    path = tmp_path / "f16.gguf"
    convert.write(path, small_checkpoint, "f16", report=False, progress=None)
    bias = "model.multi_modal_projector.linear_2.bias"
    info = next(t for t in read_header(path).tensors if t.name == bias)
    blob = bytearray(path.read_bytes())
    blob[info.start + 8:info.start + 12] = struct.pack("<f", math.inf)
    path.write_bytes(blob)
    with pytest.raises(ModelError, match=f"{path}: tensor {info.name}: expected finite values"):
        load_gguf(path)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_nonfinite_scan_finds_every_position_across_chunks(monkeypatch, dtype):
    import nanoasr.tensor as tensor

    monkeypatch.setattr(tensor, "SCAN_CHUNK", 7)  # several chunks and a ragged last one
    largest, subnormal = (65504.0, 6e-8) if dtype == "f16" else (3e38, 1e-40)
    extremes = np.array([0.0, -0.0, subnormal, -subnormal, largest, -largest, 1.5], np.float32)
    values = np.resize(extremes, (5, 11))  # finite extremes of the stored type: none may be flagged
    stored = {"f32": lambda x: x, "f16": lambda x: x.astype(np.float16),
              "bf16": lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)}[dtype]
    assert not tensor.has_nonfinite(tensor.StoredTensor(stored(values), dtype, values.shape))
    for position in range(values.size):
        for bad in (np.nan, np.inf, -np.inf):
            x = values.copy()
            x.flat[position] = bad
            assert tensor.has_nonfinite(tensor.StoredTensor(stored(x), dtype, x.shape)), (position, bad)


def test_gguf_vocabulary_arrays_of_the_wrong_kind(small_checkpoint, tmp_path):
    from gguf import GGUFWriter

    vocab = vocab_arrays(small_checkpoint.files, small_checkpoint.config.text.vocab_size, "test")
    cases = [("tokenizer.ggml.tokens", list(range(len(vocab["tokens"]))), GGUFValueType.INT32,
              r"tokenizer\.ggml\.tokens must be an array of str"),
             ("tokenizer.ggml.token_type", vocab["types"][:-1], GGUFValueType.INT32,
              rf"tokenizer\.ggml\.token_type has {len(vocab['types']) - 1} entries, expected one per token")]
    for key, value, item_type, message in cases:
        arrays = {"tokenizer.ggml.tokens": (vocab["tokens"], GGUFValueType.STRING),
                  "tokenizer.ggml.token_type": (vocab["types"], GGUFValueType.INT32),
                  "tokenizer.ggml.merges": (vocab["merges"], GGUFValueType.STRING),
                  key: (value, item_type)}
        path = tmp_path / "vocab.gguf"
        w = GGUFWriter(path, "fun_asr_nano")
        for name, (array, kind) in arrays.items():
            w.add_key_value(name, array, GGUFValueType.ARRAY, sub_type=kind)
        for name, t in small_checkpoint.tensors.items():
            w.add_tensor(name, t.numpy())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(ModelError, match=message) as err:
            load_gguf(path)
        assert str(path) in str(err.value)
