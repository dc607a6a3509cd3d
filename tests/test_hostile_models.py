"""Hostile model files of a few hundred bytes: every count, index and dimension they state is bounded before
anything is allocated from it, deep or aliased values never reach repr() or a hash whole, damaged archives,
huge numbers and non-regular files each give one ModelError, and a bad CTC branch is "no branch, because".
The bombs load in a child process under a memory limit and a time limit."""
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter

from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read, torch_zip
from nanoasr.checkpoints.load import load_checkpoint
from tools.reference import ctc_branch, funasr_checkpoint, funasr_llamacpp

ROOT = Path(__file__).resolve().parents[1]
CHILD_MEMORY = 1 << 30  # address space of the child that loads a bomb
CHILD_SECONDS = 60
HUGE_DIGITS = "1" * 5000  # more digits than Python converts to an int by default (4,300)
LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from nanoasr.errors import ModelError
from nanoasr.checkpoints.load import load_checkpoint
try:
    checkpoint = load_checkpoint(*sys.argv[1:])
except ModelError as exc:
    print("ModelError:", exc)
else:
    print("loaded; CTC branch:", checkpoint.ctc_absent or "present")
"""


def load_bounded(*args) -> str:
    """load_checkpoint(*args) in a child under CHILD_MEMORY and CHILD_SECONDS: what it printed. A crash, a
    traceback or a hang fails the test."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", LOAD.format(limit=CHILD_MEMORY), *map(str, args)],
                          capture_output=True, text=True, timeout=CHILD_SECONDS, env=env)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


# --- handmade torch.save archives --------------------------------------------------------------------------

def archive(path, pickled: bytes, members=None, compress=zipfile.ZIP_STORED,
            pickle_compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickled, compress_type=pickle_compress)
        z.writestr("archive/byteorder", b"little")
        for name, data in (members or {}).items():
            z.writestr(f"archive/data/{name}", data, compress_type=compress)
        z.writestr("archive/version", b"3\n")
    return path


def int_arg(x: int) -> bytes:
    """A pickle opcode pushing the integer x (LONG1 for any size)."""
    raw = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def tensor_pickle(name: bytes, numel: int, shape_ops: bytes, stride_ops: bytes) -> bytes:
    """{name: _rebuild_tensor_v2(FloatStorage of numel, 0, <shape_ops>, <stride_ops>)} in pickle opcodes."""
    return (b"\x80\x02}" + b"X" + struct.pack("<I", len(name)) + name
            + b"ctorch._utils\n_rebuild_tensor_v2\n("
            + b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu"
            + int_arg(numel) + b"tQ" + int_arg(0) + shape_ops + stride_ops + b"\x89}tRs.")


def ints(*xs) -> bytes:
    return b"(" + b"".join(map(int_arg, xs)) + b"t"


def funasr_folder(tmp_path, pickled: bytes, members=None) -> Path:
    """model.pt beside an (empty) Qwen3-0.6B/ folder, enough for the loader to read the state dict's names."""
    (tmp_path / "Qwen3-0.6B").mkdir()
    (tmp_path / "Qwen3-0.6B" / "tokenizer.json").write_text("{}")
    archive(tmp_path / "model.pt", pickled, members)
    return tmp_path / "model.pt"


def dict_with_key(key_ops: bytes) -> bytes:
    return b"\x80\x02}" + key_ops + b"Ns."


def test_a_tuple_nested_300000_deep_as_a_key_is_refused_before_it_is_built(tmp_path):
    path = archive(tmp_path / "model.pt", dict_with_key(b"N" + b"\x85" * 300_000))  # TUPLE1, 300,000 times
    assert "values nest more than 64 deep" in load_bounded(path)


def test_a_key_nested_5000_deep_is_refused_in_one_line(tmp_path):
    path = archive(tmp_path / "model.pt", dict_with_key(b"N" + b"\x85" * 5000))
    with pytest.raises(ModelError, match=r"data\.pkl is refused \(values nest more than 64 deep") as err:
        torch_zip.read(path)
    assert "\n" not in str(err.value)


def test_lists_nested_deep_through_appends_are_refused(tmp_path):
    pickled = b"\x80\x02}X\x01\x00\x00\x00w" + b"]" * 1000 + b"a" * 999 + b"s."  # EMPTY_LIST, APPEND
    with pytest.raises(ModelError, match=r"values nest more than 64 deep"):
        torch_zip.read(archive(tmp_path / "model.pt", pickled))


def test_a_12_byte_memo_index_sizes_no_table(tmp_path):
    path = archive(tmp_path / "model.pt", b"\x80\x02}r\xff\xff\xff\x7f.")  # LONG_BINPUT 2**31 - 1
    assert "memo index 2147483647 skips past the 0 entries written" in load_bounded(path)


def test_a_shape_of_two_million_huge_dimensions_is_refused_before_its_product(tmp_path):
    shape = b"(" + int_arg(2 ** 64) + b"q\x00" + b"h\x00" * 1_999_999 + b"tq\x01"  # BINPUT, BINGETs
    pickled = tensor_pickle(b"audio_encoder.after_norm.weight", 4, shape, b"h\x01")  # the shape as strides
    path = funasr_folder(tmp_path, pickled, {"0": bytes(16)})
    assert "the number of dimensions is 2000000, expected at most 8" in load_bounded(path)


@pytest.mark.parametrize("where", ["pickle", "byteorder"])
def test_zip_damage_anywhere_is_one_error(tmp_path, where):
    if where == "pickle":  # a deflated data.pkl whose stream is corrupt: zlib.error
        path = archive(tmp_path / "model.pt", pickle.dumps({}, protocol=2) * 50,
                       pickle_compress=zipfile.ZIP_DEFLATED)
        blob = bytearray(path.read_bytes())
        at = blob.index(b"data.pkl") + len(b"data.pkl")
        blob[at] = 0xFF  # deflate block type 3, which does not exist
    else:  # a byteorder record whose bytes disagree with its CRC
        path = archive(tmp_path / "model.pt", pickle.dumps({}, protocol=2))
        blob = bytearray(path.read_bytes())
        at = blob.index(b"little")
        blob[at:at + 6] = b"LITTLE"
    path.write_bytes(bytes(blob))
    with pytest.raises(ModelError, match=r"cannot be read") as err:
        torch_zip.read(path)
    assert "\n" not in str(err.value)


def test_a_zero_size_tensor_with_a_huge_dimension_is_refused(tmp_path):
    path = archive(tmp_path / "model.pt", tensor_pickle(b"w", 0, ints(0, 2 ** 64), ints(2 ** 64, 1)),
                   {"0": b""})
    with pytest.raises(ModelError, match=r"tensor w shape \(0, 18446744073709551616\): more than 8 "
                                         r"dimensions or one above \d+"):
        torch_zip.read(path)


def test_a_layer_number_of_5000_digits_in_a_name_is_one_error(tmp_path):
    name = b"audio_encoder.encoders." + HUGE_DIGITS.encode() + b".norm1.weight"
    path = funasr_folder(tmp_path, tensor_pickle(name, 4, ints(4), ints(1)), {"0": bytes(16)})
    with pytest.raises(ModelError, match=r"layer number in audio_encoder\.encoders\.N '1111.*' is out of "
                                         r"range \(expected below 1\)"):
        load_checkpoint(path)


# --- other runtimes' GGUFs ---------------------------------------------------------------------------------

def small_gguf(path, arch: str, tensors: dict, keys=()) -> Path:
    w = GGUFWriter(path, arch)
    for key, value, vtype, sub in keys:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def llamacpp_pair(tiny_dir, tmp_path_factory):
    return funasr_llamacpp.write(tiny_dir, tmp_path_factory.mktemp("pair"), "f32", "bf16")


def test_a_288_byte_decoder_naming_layer_100000000_is_refused_before_the_name_table(llamacpp_pair,
                                                                                    tmp_path):
    tensors = {"blk.100000000.attn_norm.weight": np.ones(1, np.float32)}
    decoder = small_gguf(tmp_path / "decoder.gguf", "qwen3", tensors)
    assert decoder.stat().st_size < 400
    out = load_bounded(llamacpp_pair / funasr_llamacpp.ENCODER_FILE, decoder)
    assert "layer number in blk.N '100000000' is out of range (expected below 1)" in out


TOKENIZER = [("tokenizer.ggml.tokens", ["a", "b", "ab"], GGUFValueType.ARRAY, GGUFValueType.STRING),
             ("tokenizer.ggml.merges", ["a b"], GGUFValueType.ARRAY, GGUFValueType.STRING)]
TOKEN_TYPES = [("tokenizer.ggml.token_type", [1, 1, 1], GGUFValueType.ARRAY, GGUFValueType.INT32)]


def test_a_crispasr_file_naming_layer_100000000_is_refused_before_the_name_table(tmp_path):
    keys = TOKENIZER + [("funasr.n_blocks_base", 1, GGUFValueType.UINT32, None)]
    tensors = {"funasr.enc.blk.0.norm1.w": np.ones(1, np.float32),
               "blk.100000000.attn_norm.weight": np.ones(1, np.float32)}
    path = small_gguf(tmp_path / "funasr.gguf", "funasr", tensors, keys)
    assert "layer number in blk.N '100000000' is out of range (expected below 2)" in load_bounded(path)


@pytest.mark.parametrize("data, sub", [([1.0, 2.0], GGUFValueType.FLOAT32), ([1, 2], GGUFValueType.UINT32)],
                         ids=["floats", "32-bit integers"])
def test_an_audiocpp_blob_of_the_wrong_element_type_is_named(tmp_path, data, sub):
    keys = [("audiocpp.model_spec.family", "fun_asr_nano", GGUFValueType.STRING, None),
            ("audiocpp.embedded_files.names", ["config.json"], GGUFValueType.ARRAY, GGUFValueType.STRING),
            ("audiocpp.embedded_files.offsets", [0, 2], GGUFValueType.ARRAY, GGUFValueType.UINT64),
            ("audiocpp.embedded_files.data", data, GGUFValueType.ARRAY, sub)]
    path = small_gguf(tmp_path / "a.gguf", "audiocpp", {"w": np.ones(1, np.float32)}, keys)
    with pytest.raises(ModelError, match=r"audiocpp\.embedded_files: expected a list of names, an integer "
                                         r"array of offsets and a byte array of data"):
        load_checkpoint(path)


def test_numeric_metadata_arrays_stay_views_of_the_file(tmp_path):
    n = 20_000_000  # 80 MB of uint32: as Python ints, about 800 MB
    key = b"big"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(header + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT32, n))
        f.truncate(len(header) + 16 + 4 * n)
    tracemalloc.start()
    try:
        values, _ = gguf_read.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(values["big"], gguf_read.NumericArray) and len(values["big"]) == n
    assert not values["big"].array.flags.owndata and not values["big"].array.flags.writeable
    assert peak < 8 << 20


def test_a_json_string_value_with_a_5000_digit_number_is_skipped(tmp_path):
    keys = TOKENIZER + TOKEN_TYPES + [("note", '{"n": ' + HUGE_DIGITS + "}", GGUFValueType.STRING, None)]
    path = small_gguf(tmp_path / "x.gguf", "other", {"w": np.ones(1, np.float32)}, keys)
    with pytest.raises(ModelError, match=r"no nanoasr metadata and no tensor"):
        load_checkpoint(path)


# --- config.json, config.yaml, non-regular files ------------------------------------------------------------

def checkpoint_copy(tiny_dir, tmp_path) -> Path:
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in tiny_dir.iterdir():
        (out / f.name).symlink_to(f)
    return out


def test_a_5000_digit_number_in_config_json_is_one_error(tiny_dir, tmp_path):
    d = checkpoint_copy(tiny_dir, tmp_path)
    (d / "config.json").unlink()
    (d / "config.json").write_text('{"audio_config": {"hidden_size": ' + HUGE_DIGITS + "}}")
    with pytest.raises(ModelError, match=r"config\.json is not valid JSON \(ValueError: Exceeds the limit"):
        load_checkpoint(d)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_fifo_in_place_of_a_model_file_is_refused_without_waiting(tiny_dir, tmp_path, name):
    d = checkpoint_copy(tiny_dir, tmp_path)
    (d / name).unlink()
    os.mkfifo(d / name)
    assert "not a regular file" in load_bounded(d)


def test_a_fifo_named_like_a_gguf_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "model.gguf")
    assert "not a regular file" in load_bounded(tmp_path)


@pytest.fixture(scope="module")
def ctc_dir(tiny_dir, tmp_path_factory):
    pytest.importorskip("torch")
    return ctc_branch.write(funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("ctc")))


def folder_with(ctc_dir, tmp_path, **texts) -> Path:
    """The CTC folder (files linked) with some of its text files replaced."""
    out = tmp_path / "funasr"
    out.mkdir()
    for f in ctc_dir.iterdir():
        (out / f.name).symlink_to(f)
    for name, text in texts.items():
        name = name.replace("_", ".")
        (out / name).unlink()
        (out / name).write_text(text)
    return out


def test_a_yaml_alias_bomb_is_refused_before_anything_walks_it(ctc_dir, tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = "\n".join(lines) + "\naudio_encoder_conf:\n  output_size: *a8\n"
    assert len(bomb) < 1024
    out = load_bounded(folder_with(ctc_dir, tmp_path, config_yaml=bomb))
    assert "config.yaml is not valid YAML (YAMLError: 'more than 16 aliases')" in out


def test_a_5000_digit_number_in_config_yaml_is_one_error(ctc_dir, tmp_path):
    folder = folder_with(ctc_dir, tmp_path, config_yaml=f"ctc_vocab_size: {HUGE_DIGITS}\n")
    with pytest.raises(ModelError, match=r"config\.yaml is not valid YAML \(ValueError: 'Exceeds the limit"):
        load_checkpoint(folder)


def test_a_fifo_named_config_yaml_is_refused_without_waiting(ctc_dir, tmp_path):
    folder = folder_with(ctc_dir, tmp_path)
    (folder / "config.yaml").unlink()
    os.mkfifo(folder / "config.yaml")
    assert "config.yaml cannot be read" in load_bounded(folder)


def test_a_ctc_decoder_block_numbered_100000000_is_no_branch(ctc_dir, tmp_path):
    import torch

    folder = folder_with(ctc_dir, tmp_path)
    saved = torch.load(ctc_dir / "model.pt")
    saved["state_dict"]["ctc_decoder.blocks.100000000.norm1.weight"] = torch.ones(1)
    (folder / "model.pt").unlink()
    torch.save(saved, folder / "model.pt")
    out = load_bounded(folder)
    assert "CTC branch: " in out and "layer number in ctc_decoder.layers.N '100000000' is out of range" in out


# --- the CTC branch checked at load ------------------------------------------------------------------------

def yaml_with(ctc_dir, old: str, new: str) -> str:
    text = (ctc_dir / "config.yaml").read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize("heads", [0, 3, -4])
def test_attention_heads_that_do_not_split_the_width_leave_no_branch(ctc_dir, tmp_path, heads):
    folder = folder_with(ctc_dir, tmp_path, config_yaml=yaml_with(ctc_dir, "attention_heads: 4\nctc_vocab",
                                                                  f"attention_heads: {heads}\nctc_vocab"))
    checkpoint = load_checkpoint(folder)
    assert checkpoint.ctc is None
    assert f"its ctc_decoder_conf.attention_heads is {heads}, which does not split" in checkpoint.ctc_absent


@pytest.mark.parametrize("blank", [-1, "vocab"])
def test_a_blank_id_outside_the_vocabulary_leaves_no_branch(ctc_dir, tmp_path, blank):
    vocab_size = load_checkpoint(ctc_dir).ctc.config.vocab_size
    blank = vocab_size if blank == "vocab" else blank
    folder = folder_with(ctc_dir, tmp_path, config_yaml=yaml_with(ctc_dir, "ctc_conf:\n",
                                                                  f"ctc_conf:\n  blank_id: {blank}\n"))
    checkpoint = load_checkpoint(folder)
    assert checkpoint.ctc is None
    assert f"its ctc_conf.blank_id is {blank}, outside the CTC vocabulary" in checkpoint.ctc_absent


def test_a_tiktoken_with_more_ranks_than_ctc_lo_rows_leaves_no_branch(ctc_dir, tmp_path):
    import base64

    rows = load_checkpoint(ctc_dir).ctc.config.vocab_size
    pieces = [bytes([b]) for b in range(256)] + [b"x%d" % i for i in range(rows)]
    text = "".join(f"{base64.b64encode(p).decode()} {rank}\n" for rank, p in enumerate(pieces))
    checkpoint = load_checkpoint(folder_with(ctc_dir, tmp_path, multilingual_tiktoken=text))
    assert checkpoint.ctc is None
    assert f"ranks {len(pieces)} tokens, more than the {rows} rows of ctc.ctc_lo" in checkpoint.ctc_absent
