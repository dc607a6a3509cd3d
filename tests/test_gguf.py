"""GGUF: round trips per type, the schema as the gguf package reads it, other layouts, malformed files."""
import dataclasses
import gzip
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from nanoasr import convert
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.gguf_schema import load_gguf
from nanoasr.checkpoints.spec import expected_tensors
from nanoasr.errors import ModelError
from nanoasr.formats.gguf_read import read_header
from nanoasr.formats.gguf_vocab import tokenizer_from_vocab, vocab_arrays
from nanoasr.model.config import AdaptorConfig, AudioConfig, Config, TextConfig
from nanoasr.quant import quantize
from nanoasr.tensor import StoredTensor

FIXTURE = Path(__file__).parent / "fixtures" / "tiny"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>"]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = ["hello world", "Hello, wörld 12345!\n\nhe said <|im_end|> 语音转写", "<|im_start|>user\nhello<|im_end|>"]


def tiny_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("Ġw", "o")]
    vocab = {c: i for i, c in enumerate(alphabet)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def tiny_config(audio_token_id: int) -> Config:
    return Config(
        AudioConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_timestamp_prediction_layers=2),
        AdaptorConfig(hidden_size=256, num_attention_heads=4, intermediate_size=64, projector_hidden_size=128,
                      layer_norm_eps=1e-12),
        TextConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=5e5,
                   max_position_embeddings=4096),
        audio_token_id)


def config_json(config: Config) -> str:
    return json.dumps({"audio_config": dataclasses.asdict(config.audio),
                       "adaptor_config": dataclasses.asdict(config.adaptor),
                       "text_config": dataclasses.asdict(config.text),
                       "audio_token_id": config.audio_token_id})


def bf16(x: np.ndarray) -> StoredTensor:
    bits = gguf_quantize(x.astype(np.float32), GGMLQuantizationType.BF16).view(np.uint16)
    return StoredTensor(bits, "bf16", x.shape)


def random_checkpoint(seed: int = 0) -> Checkpoint:
    tok = tiny_tokenizer()
    config = tiny_config(tok.token_to_id("<|object_ref_start|>"))
    rng = np.random.default_rng(seed)
    tensors = {name: bf16(rng.standard_normal(shape) * (0.05 if kind == "matrix" else 1.0))
               for name, (shape, kind) in expected_tensors(config).items()}
    files = {"config.json": config_json(config), "tokenizer.json": tok.to_str(),
             "chat_template.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}",
             "processor_config.json": "", "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"})}
    source = {"repo": "example/tiny-fun-asr-nano", "revision": "0123abcd", "license": "test license",
              "license_url": "https://example.org/license"}
    return Checkpoint(config, tensors, files, source)


@pytest.fixture(scope="module")
def checkpoint():
    """Small vocabulary, so the gguf package's GGUFReader (the oracle) parses the files quickly."""
    return random_checkpoint()


@pytest.fixture(scope="module")
def written(checkpoint, tmp_path_factory):
    """target -> (path, report rows), written once per module."""
    out = {}
    directory = tmp_path_factory.mktemp("gguf")

    def get(target):
        if target not in out:
            path = directory / f"tiny-{target}.gguf"
            out[target] = (path, convert.write(path, checkpoint, target, report=True, progress=None))
        return out[target]
    return get


def kinds(config):
    return {name: kind for name, (_, kind) in expected_tensors(config).items()}


def test_dense_round_trip_keeps_config_files_names_and_values(checkpoint, written):
    for target in ("f32", "f16", "bf16"):
        path, rows = written(target)
        back = load_gguf(path)
        assert back.config == checkpoint.config
        assert back.files == checkpoint.files
        assert list(back.tensors) == list(checkpoint.tensors)
        raw = {t.name: t for t in GGUFReader(path).tensors}
        for name, t in checkpoint.tensors.items():
            got = back.tensors[name]
            want_type = target if kinds(checkpoint.config).get(name, "matrix") == "matrix" else "f32"
            assert got.dtype == want_type and got.shape == t.shape, name
            source = t.numpy()
            as_f16 = source.astype(np.float16).astype(np.float32)
            expected = {"f32": source, "f16": as_f16, "bf16": source}[want_type]
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=name)
            independent = gguf_dequantize(raw[name].data, raw[name].tensor_type).reshape(t.shape)
            np.testing.assert_array_equal(got.numpy(), independent, err_msg=name)
        assert [r["name"] for r in rows] == list(checkpoint.tensors)


def test_read_keeps_tensors_as_views_of_a_read_only_map(written):
    back = load_gguf(written("f16")[0])
    for t in back.tensors.values():
        base = t.data
        while base is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap) and not t.data.flags.writeable


def test_schema_as_the_gguf_package_reads_it(checkpoint, written):
    fields = GGUFReader(written("f16")[0]).fields
    value = {k: f.contents() for k, f in fields.items()}
    assert value["general.architecture"] == "fun_asr_nano"
    assert value["general.license"] == "test license"  # random_checkpoint's source
    assert value["general.license.link"] == "https://example.org/license"
    assert value["general.file_type"] == 1 and value["general.quantization_version"] == 2
    assert value["fun_asr_nano.text.rope_theta"] == checkpoint.config.text.rope_theta
    assert value["fun_asr_nano.adaptor.layer_norm_eps"] == checkpoint.config.adaptor.layer_norm_eps
    assert value["fun_asr_nano.files.tokenizer_json"] == checkpoint.files["tokenizer.json"]
    assert value["tokenizer.ggml.model"] == "gpt2" and value["tokenizer.ggml.pre"] == "qwen2"
    tokens = value["tokenizer.ggml.tokens"]
    assert len(tokens) == checkpoint.config.text.vocab_size == len(value["tokenizer.ggml.token_type"])
    assert value["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    assert value["tokenizer.ggml.padding_token_id"] == tokens.index("<|endoftext|>")
    assert value["tokenizer.chat_template"] == checkpoint.files["chat_template.jinja"]
    assert value["general.source.url"] == "https://huggingface.co/example/tiny-fun-asr-nano/tree/0123abcd"
    vocab = tiny_tokenizer().get_vocab()
    assert len(vocab) == 256 + 5 + len(SPECIALS)  # byte alphabet, merges, special tokens
    assert all(tokens[i] == t for t, i in vocab.items())
    assert value["tokenizer.ggml.merges"] == ["h e", "l l", "he ll", "Ġ w", "Ġw o"]


def test_vocabulary_arrays_rebuild_the_same_tokenizer(checkpoint, written):
    value = {k: f.contents() for k, f in GGUFReader(written("f32")[0]).fields.items()}
    rebuilt = Tokenizer.from_str(tokenizer_from_vocab(
        value["tokenizer.ggml.tokens"], value["tokenizer.ggml.token_type"], value["tokenizer.ggml.merges"]))
    original = Tokenizer.from_str(checkpoint.files["tokenizer.json"])
    for text in TEXTS:
        assert rebuilt.encode(text).ids == original.encode(text).ids, text


def test_quantized_round_trip_matches_the_gguf_dequantizers(checkpoint, written):
    n_layers = checkpoint.config.text.num_hidden_layers
    for target, bound in (("q8_0", 0.01), ("q4_k_m", 0.1)):
        path, rows = written(target)
        back = load_gguf(path)
        assert back.config == checkpoint.config and back.files == checkpoint.files
        raw = {t.name: t for t in GGUFReader(path).tensors}
        report = {r["name"]: r for r in rows}
        for name, t in checkpoint.tensors.items():
            matrix = kinds(checkpoint.config).get(name, "matrix") == "matrix"
            want = quantize.storage_type(name, t.shape, target, n_layers) if matrix else "f32"
            assert back.tensors[name].dtype == want, name
            restored = gguf_dequantize(raw[name].data, raw[name].tensor_type).reshape(t.shape)
            np.testing.assert_array_equal(back.tensors[name].numpy(), restored, err_msg=name)
            source = t.numpy().astype(np.float64)
            rel = np.sqrt(np.mean((restored - source) ** 2) / np.mean(source ** 2))
            assert rel < bound, (name, want, rel)
            assert report[name]["rel_rms"] == pytest.approx(rel, rel=1e-6, abs=1e-12)
            max_abs = np.abs(restored - source).max()
            assert report[name]["max_abs"] == pytest.approx(max_abs, rel=1e-6, abs=1e-12)


def widened_independently(t: StoredTensor) -> np.ndarray:
    """float32 of a stored tensor by plain numpy (BF16 bits shifted up) or the gguf package's dequantizers."""
    if t.dtype == "bf16":
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    if t.dtype in ("f32", "f16"):
        return t.data.astype(np.float32)
    return gguf_dequantize(np.asarray(t.data), GGMLQuantizationType[t.dtype.upper()]).reshape(t.shape)


class Q8Quantizer:
    """The gguf package's own Q8_0 quantizer behind nanoasr.quant's interface: Q8_0 rows, F16 otherwise."""

    @staticmethod
    def storage_type(name, shape, target, n_layers):
        return "q8_0" if shape[-1] % 32 == 0 else "f16"

    @staticmethod
    def quantize(x, dtype):
        return gguf_quantize(x, GGMLQuantizationType.Q8_0)


def test_writing_is_silent_unless_progress_is_asked_for(checkpoint, tmp_path, capsys):
    seen = []
    rows = convert.write(tmp_path / "a.gguf", checkpoint, "f16", report=False)
    convert.write(tmp_path / "b.gguf", checkpoint, "f16", report=False,
                  progress=lambda *step: seen.append(step))
    assert capsys.readouterr() == ("", "")
    n = len(rows)
    assert seen == [(k, n, r["name"], r["type"].lower()) for k, r in enumerate(rows, 1)]


def test_block_types_are_written_and_read_as_gguf_blocks(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(convert, "quantize", Q8Quantizer)
    path = tmp_path / "q8.gguf"
    rows = convert.write(path, checkpoint, "q8_0", report=True, progress=None)
    back = load_gguf(path)
    raw = {t.name: t for t in GGUFReader(path).tensors}
    matrices = [n for n in checkpoint.tensors if kinds(checkpoint.config).get(n, "matrix") == "matrix"]
    assert {back.tensors[n].dtype for n in matrices} == {"q8_0", "f16"}  # 560-wide rows fall back
    for name in matrices:
        t, got = checkpoint.tensors[name], back.tensors[name]
        if got.dtype == "q8_0":
            blocks = gguf_quantize(t.numpy(), GGMLQuantizationType.Q8_0)
            assert got.data.shape == (t.shape[0], t.shape[1] // 32 * 34) and got.data.dtype == np.uint8
            np.testing.assert_array_equal(got.data, blocks, err_msg=name)
        restored = gguf_dequantize(raw[name].data, raw[name].tensor_type).reshape(t.shape)
        np.testing.assert_array_equal(widened_independently(got), restored, err_msg=name)
    assert GGUFReader(path).fields["general.file_type"].contents() == 7
    assert {r["type"] for r in rows} == {"Q8_0", "F16", "F32"}
    assert all(0 < r["rel_rms"] < 0.01 for r in rows if r["type"] == "Q8_0")


def write_layout(path, arrays, vocab=None, types=None, extra=()):
    """A GGUF in another runtime's shape: logical names, the architecture key, no nanoasr keys."""
    w = GGUFWriter(path, "fun_asr_nano")
    if vocab is not None:
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_token_merges(vocab["merges"])
    for key, value in extra:
        w.add_string(key, value)
    for name, array in arrays.items():
        w.add_tensor(name, array, raw_dtype=(types or {}).get(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def widened(checkpoint):
    return {name: t.numpy() for name, t in checkpoint.tensors.items()}


def test_layout_without_nanoasr_keys_loads_with_the_assumed_fields_listed(checkpoint, tmp_path):
    vocab = vocab_arrays(checkpoint.files, checkpoint.config.text.vocab_size, "test")
    path = tmp_path / "other.gguf"
    write_layout(path, widened(checkpoint), vocab=vocab)
    with pytest.warns(UserWarning, match="assumed") as caught:
        back = load_gguf(path)
    message = str(caught[0].message)
    for field in ("adaptor.num_attention_heads=8", "text.rope_theta=1000000.0", "audio.layer_norm_eps=1e-05",
                  "text.rms_norm_eps=1e-06", "audio.num_mel_bins=80"):
        assert field in message
    c, want = back.config, checkpoint.config
    assert (c.audio.hidden_size, c.audio.num_hidden_layers, c.audio.num_timestamp_prediction_layers) == \
        (want.audio.hidden_size, want.audio.num_hidden_layers, want.audio.num_timestamp_prediction_layers)
    as_derived = dataclasses.replace(c.text, rope_theta=want.text.rope_theta, max_position_embeddings=4096)
    assert as_derived == want.text
    assert c.audio_token_id == want.audio_token_id and c.text.rope_theta == 1e6
    rebuilt = Tokenizer.from_str(back.files["tokenizer.json"])
    original = Tokenizer.from_str(checkpoint.files["tokenizer.json"])
    assert [rebuilt.encode(t).ids for t in TEXTS] == [original.encode(t).ids for t in TEXTS]


def test_layout_with_an_embedded_config_reads_it(checkpoint, tmp_path):
    embedded = config_json(checkpoint.config)
    path = tmp_path / "embedded.gguf"
    write_layout(path, widened(checkpoint),
                 extra=[("other.config", embedded), ("other.tokenizer", checkpoint.files["tokenizer.json"])])
    back = load_gguf(path)
    assert back.config == checkpoint.config and back.files["config.json"] == embedded


def test_layout_without_any_tokenizer_is_refused(checkpoint, tmp_path):
    path = tmp_path / "notok.gguf"
    write_layout(path, widened(checkpoint))
    with pytest.raises(ModelError, match="no tokenizer"):
        load_gguf(path)


def test_a_quantized_norm_or_an_unsupported_type_is_refused(checkpoint, tmp_path):
    norm = "model.language_model.norm.weight"
    data = gguf_quantize(checkpoint.tensors[norm].numpy(), GGMLQuantizationType.Q8_0)
    path = tmp_path / "qnorm.gguf"
    write_layout(path, dict(widened(checkpoint), **{norm: data}), types={norm: GGMLQuantizationType.Q8_0})
    with pytest.raises(ModelError, match=f"{norm}.*q8_0"):
        load_gguf(path)
    write_layout(path, dict(widened(checkpoint), **{norm: np.zeros(256, np.int32)}))
    with pytest.raises(ModelError, match=f"{norm}: type I32 is not supported"):
        load_gguf(path)


def patched(path: Path, old: bytes, new: bytes, tmp_path: Path) -> Path:
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    out = tmp_path / "patched.gguf"
    out.write_bytes(data.replace(old, new))
    return out


def test_wrong_shape_and_missing_keys_name_what_is_wrong(written, tmp_path):
    path = written("f32")[0]
    name = b"model.audio_tower.layers.1.mlp.fc2.weight"
    dims = struct.pack("<IQQ", 2, 128, 64)  # GGUF order of logical [64, 128]
    swapped = patched(path, struct.pack("<Q", len(name)) + name + dims,
                      struct.pack("<Q", len(name)) + name + struct.pack("<IQQ", 2, 64, 128), tmp_path)
    with pytest.raises(ModelError, match=r"fc2.weight: expected shape \[64, 128\], found \[128, 64\]"):
        load_gguf(swapped)
    missing = patched(path, b"fun_asr_nano.text.rope_theta", b"fun_asr_nano.text.rope_thetX", tmp_path)
    with pytest.raises(ModelError, match="missing: fun_asr_nano.text.rope_theta"):
        load_gguf(missing)


def test_use_low_frame_rate_is_kept_and_reads_as_true_where_the_file_predates_it(checkpoint, tmp_path):
    adaptor = dataclasses.replace(checkpoint.config.adaptor, use_low_frame_rate=False)
    all_rows = dataclasses.replace(checkpoint, config=dataclasses.replace(checkpoint.config, adaptor=adaptor))
    path = tmp_path / "all-rows.gguf"
    convert.write(path, all_rows, "f32", report=False, progress=None)
    assert load_gguf(path).config.adaptor.use_low_frame_rate is False
    key = b"fun_asr_nano.adaptor.use_low_frame_rate"
    older = patched(path, key, key[:-1] + b"X", tmp_path)  # as if the key were not there
    assert load_gguf(older).config.adaptor.use_low_frame_rate is True


def test_bad_magic_version_and_truncation(written, tmp_path):
    data = written("f16")[0].read_bytes()
    cases = {"magic": b"GGML" + data[4:], "version": data[:4] + struct.pack("<I", 4) + data[8:]}
    cases.update({f"cut{n}": data[:n] for n in (0, 3, 10, 23, 30, 200, len(data) // 2, len(data) - 1)})
    messages = {"magic": "not a GGUF file", "version": "version 4 is not supported"}
    for case, content in cases.items():
        path = tmp_path / f"{case}.gguf"
        path.write_bytes(content)
        with pytest.raises(ModelError, match=messages.get(case, "truncated")) as err:
            load_gguf(path)
        assert str(path) in str(err.value)


def header(n_tensors=0, n_kv=0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("content, message", [
    (header(n_tensors=2 ** 62), "more than a .*-byte file can hold"),
    (header(n_kv=2 ** 60) + b"\0" * 64, "more than a .*-byte file can hold"),
    (header(n_kv=1) + struct.pack("<Q", 2 ** 60) + b"\0" * 64, "claims 1152921504606846976 bytes"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT8,
                                                      2 ** 61),
     "array of 2305843009213693952 UINT8"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING,
                                                      2 ** 40),
     "array of 1099511627776 STRING"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<II", 99, 0), "unknown value type 99"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 2)
     + gguf_string(b"ab") + struct.pack("<Q", 2 ** 62) + b"\0" * 8, "2 strings run past the end"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 3)
     + struct.pack("<Q", 2 ** 64 - 1) + b"\0" * 16, "3 strings run past the end"),
    (header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, 2)
     + gguf_string(b"ab") + gguf_string(b"\xff"), "array k is not UTF-8"),
    (header(n_tensors=1) + gguf_string(b"t") + struct.pack("<I", 1000) + b"\0" * 64, "1000 dimensions"),
    (header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQQIQ", 2, 2 ** 40, 2 ** 40, 0, 0) + b"\0" * 64,
     "need 4835703278458516698824704 bytes"),
    (header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQQIQ", 2, 4, 4, 0, 0) + b"\0" * 8,
     "past the end"),
    (header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQIQ", 1, 4, 0, 2 ** 63) + b"\0" * 64,
     r"data \[9223372036854775872, 9223372036854775888\) is misaligned or past the end"),
    (header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQIQ", 1, 33, 8, 0) + b"\0" * 64,
     "not valid for Q8_0"),
])
def test_absurd_counts_fail_fast_without_allocating(tmp_path, content, message):
    path = tmp_path / "absurd.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        load_gguf(path)


def test_duplicate_keys_are_refused(tmp_path):
    kv = gguf_string(b"k") + struct.pack("<IB", GGUFValueType.UINT8, 1)
    path = tmp_path / "dup.gguf"
    path.write_bytes(header(n_kv=2) + kv + kv)
    with pytest.raises(ModelError, match="key k appears twice"):
        load_gguf(path)


def test_header_reader_agrees_with_gguf_reader(written, tmp_path):
    for path in (written("bf16")[0], tmp_path / "other.gguf"):
        if not path.exists():
            w = GGUFWriter(path, "other")
            scalars = [("int8", -3), ("uint16", 7), ("int64", -2 ** 40), ("float32", 0.5), ("bool", True),
                       ("string", "ok")]
            for i, (kind, value) in enumerate(scalars):
                getattr(w, f"add_{kind}")(f"k{i}", value)
            w.add_array("floats", [0.25, 1.5])
            w.add_array("strings", ["", "é", "日本語", "a b", ""])  # the last one empty: at the run's end
            w.add_custom_alignment(64)
            w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
            w.add_tensor("b", np.ones((4, 2), np.float16))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
        reference = GGUFReader(path)
        got = read_header(path)
        fields = reference.fields.items()
        assert got.values == {k: f.contents() for k, f in fields if not k.startswith("GGUF.")}
        assert [(t.name, t.shape, t.ggml_type, t.start, t.nbytes) for t in got.tensors] == [
            (t.name, tuple(reversed(t.shape.tolist())), t.tensor_type, t.data_offset, t.n_bytes)
            for t in reference.tensors]


def test_qwen3_export_has_the_llama_cpp_names_and_hparams(checkpoint, tmp_path):
    path = tmp_path / "qwen3.gguf"
    convert.write_qwen3(path, checkpoint, "f32", report=False, progress=None)
    reader = GGUFReader(path)
    value = {k: f.contents() for k, f in reader.fields.items()}
    t = checkpoint.config.text
    assert value["general.architecture"] == "qwen3"
    assert value["qwen3.block_count"] == t.num_hidden_layers
    assert value["qwen3.rope.freq_base"] == pytest.approx(t.rope_theta)
    assert value["qwen3.attention.head_count_kv"] == t.num_key_value_heads
    assert value["qwen3.attention.key_length"] == t.head_dim
    assert len(value["tokenizer.ggml.tokens"]) == t.vocab_size
    names = {r.name: r for r in reader.tensors}
    per_layer = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_gate",
                 "ffn_up", "ffn_down", "attn_norm", "ffn_norm"]
    assert set(names) == {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{p}.weight" for i in range(t.num_hidden_layers) for p in per_layer}
    k_proj = checkpoint.tensors["model.language_model.layers.1.self_attn.k_proj.weight"]
    np.testing.assert_array_equal(names["blk.1.attn_k.weight"].data, k_proj.numpy())


def test_convert_command_writes_the_file_report_and_a_one_line_summary(checkpoint, tmp_path, capsys):
    from safetensors.numpy import save_file

    from nanoasr.cli import main

    source = tmp_path / "ckpt"
    source.mkdir()
    save_file(widened(checkpoint), str(source / "model.safetensors"))
    for name, text in checkpoint.files.items():
        (source / name).write_text(text, encoding="utf-8")
    out, report, qwen3 = tmp_path / "out.gguf", tmp_path / "out.json", tmp_path / "decoder.gguf"
    rc = main(["convert", str(source), "--type", "f16", "--output", str(out), "--report", str(report),
               "--repo", "example/tiny", "--revision", "abc", "--export-qwen3-gguf", str(qwen3)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    rows = json.loads(report.read_text())
    assert sorted(r["name"] for r in rows) == sorted(checkpoint.tensors)
    assert {r["type"] for r in rows} == {"F16", "F32"}
    summary, decoder = printed.out.splitlines()  # one line for the file, one for the export
    assert summary.startswith(f"{out}: ") and "x input" in summary and "largest relative RMS error" in summary
    assert decoder.startswith("qwen3 decoder:")
    assert printed.err.splitlines() == [f"reading {source}"]  # stderr is no terminal here: no progress
    back = load_gguf(out)
    assert back.source["repo"] == "example/tiny" and back.source["revision"] == "abc"
    assert GGUFReader(qwen3).fields["general.architecture"].contents() == "qwen3"
    assert main(["convert", str(tmp_path / "missing"), "--output", str(tmp_path / "new.gguf")]) == 1
    assert "no such model directory" in capsys.readouterr().err


def test_convert_command_writes_a_table_report_and_overwrites_only_with_force(checkpoint, tmp_path, capsys):
    from nanoasr.cli import main

    source = tmp_path / "ckpt.gguf"
    convert.write(source, checkpoint, "f32", report=False)
    out, table = tmp_path / "out.gguf", tmp_path / "report.txt"
    out.write_bytes(b"the user's file")
    assert main(["convert", str(source), "--type", "f16", "--output", str(out), "--report", str(table)]) == 2
    assert f"{out} exists; --force overwrites it" in capsys.readouterr().err
    assert out.read_bytes() == b"the user's file" and not table.exists()
    assert main(["convert", str(source), "--type", "f16", "--output", str(out), "--report", str(table),
                 "--force"]) == 0
    assert load_gguf(out).tensors.keys() == checkpoint.tensors.keys()
    lines = table.read_text().splitlines()
    assert lines[0].split() == ["tensor", "type", "shape", "bytes", "rel_rms", "max_abs"]
    assert len(lines) == 1 + len(checkpoint.tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.gguf", "out.gguf", "report.txt"]


def fixture_checkpoint(tmp_path):
    from nanoasr.checkpoints.load import load_checkpoint

    for f in FIXTURE.iterdir():
        if f.name == "tokenizer.json.gz":
            (tmp_path / "tokenizer.json").write_bytes(gzip.decompress(f.read_bytes()))
        elif f.is_file():
            shutil.copy(f, tmp_path / f.name)
    return load_checkpoint(tmp_path)


@pytest.mark.parametrize("target", convert.TARGETS)
def test_committed_fixture_round_trip(tmp_path, target):
    source = fixture_checkpoint(tmp_path)
    path = tmp_path / f"fixture-{target}.gguf"
    rows = convert.write(path, source, target, report=True, progress=None)
    back = load_gguf(path)
    assert back.config == source.config and back.files == source.files
    assert list(back.tensors) == list(source.tensors)
    for row in rows:
        t, got = source.tensors[row["name"]], back.tensors[row["name"]]
        assert got.shape == t.shape and GGMLQuantizationType[got.dtype.upper()].name == row["type"]
        restored = widened_independently(got)
        if target in ("f32", "bf16") or got.dtype == "f32":
            np.testing.assert_array_equal(restored, t.numpy(), err_msg=row["name"])
    tokens = json.loads(source.files["tokenizer.json"])["added_tokens"]
    assert any(a["content"] == "<|object_ref_start|>" and a["id"] == back.config.audio_token_id
               for a in tokens)
