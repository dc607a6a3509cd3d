"""Other runtimes' files of the model open through the same load_model, holding the original's weights and
config: FunASR's model.pt folder, FunASR's llama.cpp runtime pair (an encoder GGUF + a llama.cpp qwen3 GGUF),
transcribe.cpp's, CrispASR's and audio.cpp's GGUFs.

Each file is written from the committed tiny checkpoint by its probe in tools/reference/, which follows that
runtime's own converter: funasr_checkpoint.py (torch.save itself), funasr_llamacpp.py (modelscope/FunASR
runtime/llama.cpp/fun-asr-nano/export_encoder_gguf.py, commit 3c58cb5, and llama.cpp's convert_hf_to_gguf.py
vendored in llama-cpp-python 0.3.36), transcribe_cpp.py (handy-computer/transcribe.cpp
scripts/convert-funasr_nano.py, commit ea077b8), crispasr.py (CrispStrobe/CrispASR
models/convert-funasr-to-gguf.py, commit 72d3c38: matrices as F16, so the expected weights are the original's
rounded to F16 where the file holds F16) and audiocpp.py (audio.cpp's `audiocpp_gguf`, f8fb0c1).
The tests every layout passes run over LAYOUTS; each layout's own checks follow, in a section each.
"""
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest

import nanoasr
from nanoasr import convert
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.formats import gguf_read, torch_zip
from nanoasr.tensor import StoredTensor, widen
from tools.lib.parity import cases
from tools.reference import audiocpp, crispasr, funasr_checkpoint, funasr_llamacpp, transcribe_cpp
from tools.reference.funasr_llamacpp import DECODER_FILE, ENCODER_FILE

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")
TOKENS = 16  # a prefix of the pinned greedy ids: enough to tell models apart, quick to decode
TIED = "model.language_model.embed_tokens.weight"


@dataclass(frozen=True)
class Layout:
    write: Callable  # (tiny checkpoint dir, empty folder) -> the written file or folder
    format: str  # the loaded Checkpoint's source["format"]
    opens: Callable = lambda path: (path, None)  # what was written -> (model, llm) as load_model takes them
    extra: tuple[str, ...] = ()  # tensors the file holds beside the original's (a tied head written out)
    same_types: bool = True  # every tensor in the original's stored type, bit for bit
    pinned_ids: bool = True  # greedy ids are the original's pinned ones (no rounding on the way)
    needs_torch: bool = False
    metadata_edits: list = field(default_factory=list)  # (writer method, key, value, error) rows


# (GGUFWriter method, key, value written instead, the error it gives) for each layout's metadata checks
TRANSCRIBE_CPP_EDITS = [
    ("add_string", "stt.variant", "fun-asr-nano-2609",
     r".*stt.variant 'fun-asr-nano-2609' is not a Fun-ASR"),
    ("add_uint32", "stt.funasr_nano.encoder.sanm_shift", 1,
     r".*encoder.sanm_shift is 1, only 0 is supported"),
    ("add_bool", "stt.frontend.apply_cmvn", True, r".*apply_cmvn is True, only False is supported"),
    ("add_uint32", "stt.funasr_nano.encoder.d_model", 512,
     r".*metadata stt.funasr_nano.encoder.d_model is 512, but the tensors say 32 \(audio hidden_size\)"),
    ("add_uint32", "stt.funasr_nano.decoder.n_kv_heads", 4,
     r".*decoder.n_kv_heads is 4, but the tensors say 2"),
]
CRISPASR_EDITS = [
    ("add_uint32", "funasr.lfr_n", 5, r"metadata funasr.lfr_n is 5, only 6 is supported"),
    ("add_uint32", "funasr.n_blocks_base", 0, r"metadata funasr.n_blocks_base is 0, expected the count"),
    ("add_uint32", "funasr.llm.head_dim", 16, r"metadata funasr.llm.head_dim is 16, but the tensors say 8"),
]
AUDIOCPP_EDITS = [
    ("add_key_value", "audiocpp.model_spec.family", "qwen3_asr",
     r"an audio.cpp GGUF of family .qwen3_asr.; expected"),
    ("add_key_value", "audiocpp.embedded_files.offsets", [0, 5],
     r"audiocpp.embedded_files: expected names, offsets"),
    ("add_key_value", "audiocpp.tensor_names", ["model.audio_tower.layers.0.self_attn.q_proj.weight"],
     r"audiocpp.tensor_names must list one name per tensor"),
]
LAYOUTS = {
    "model_pt": Layout(lambda tiny, out: funasr_checkpoint.write(tiny, out), "model.pt", needs_torch=True),
    "funasr_llamacpp": Layout(lambda tiny, out: funasr_llamacpp.write(tiny, out, "f32", "bf16"),
                              "funasr-llama.cpp", same_types=False,
                              opens=lambda path: (path / ENCODER_FILE, path / DECODER_FILE)),
    "transcribe_cpp": Layout(lambda tiny, out: transcribe_cpp.write(tiny, out / "fun-asr-nano-BF16.gguf"),
                             "transcribe.cpp gguf", same_types=False, metadata_edits=TRANSCRIBE_CPP_EDITS),
    "crispasr": Layout(lambda tiny, out: crispasr.write(tiny, out / "funasr-nano-f16.gguf"), "CrispASR gguf",
                       extra=("lm_head.weight",), same_types=False, pinned_ids=False,
                       metadata_edits=CRISPASR_EDITS),
    "audiocpp": Layout(lambda tiny, out: audiocpp.write(tiny, out / "orig.gguf", "orig"), "audio.cpp gguf",
                       metadata_edits=AUDIOCPP_EDITS),
}
METADATA_EDITS = [(name, *edit) for name, layout in LAYOUTS.items() for edit in layout.metadata_edits]


class LayoutFiles:
    """Each layout of the tiny checkpoint, written once on first use and shared by every test."""

    def __init__(self, tiny_dir: Path, tmp_path_factory):
        self.tiny_dir, self.tmp_path_factory, self.written = tiny_dir, tmp_path_factory, {}

    def path(self, name: str) -> Path:
        if LAYOUTS[name].needs_torch:
            pytest.importorskip("torch")
        if name not in self.written:
            self.written[name] = LAYOUTS[name].write(self.tiny_dir, self.tmp_path_factory.mktemp(name))
        return self.written[name]


@pytest.fixture(scope="session")
def layout_files(tiny_dir, tmp_path_factory) -> LayoutFiles:
    return LayoutFiles(tiny_dir, tmp_path_factory)


@pytest.fixture(params=list(LAYOUTS))
def layout(request, layout_files):
    """(layout, model, llm): one layout of the tiny checkpoint, as load_model takes it."""
    return (LAYOUTS[request.param], *LAYOUTS[request.param].opens(layout_files.path(request.param)))


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def pair(layout_files):
    return layout_files.path("funasr_llamacpp")


@pytest.fixture
def funasr_dir(layout_files):
    return layout_files.path("model_pt")


def in_stored_type(t: StoredTensor, dtype: str) -> np.ndarray:
    """The original tensor's float32 values as a file storing it as `dtype` holds them (f16 rounds)."""
    values = widen(t)
    return values.astype(np.float16).astype(np.float32) if dtype == "f16" else values


def as_stored(t: StoredTensor, dtype: str) -> StoredTensor:
    """The original tensor as the converter stores it: float32, or float16 when the file holds F16."""
    data = widen(t).astype(np.float16 if dtype == "f16" else np.float32)
    return StoredTensor(data, "f16" if dtype == "f16" else "f32", t.shape)


def greedy_ids(model, reference="funasr"):
    wave = cases(REFS, reference)["short"]["wave"]
    result = model.transcribe(wave, sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                              ignore_stop=True)
    return list(result.segments[0].token_ids)


def assert_same_checkpoint(loaded, original):
    assert loaded.config == original.config
    assert sorted(loaded.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        assert loaded.tensors[name].dtype == t.dtype and loaded.tensors[name].shape == t.shape, name
        np.testing.assert_array_equal(loaded.tensors[name].data, t.data, err_msg=name)


def write_with(layout: str, tiny_dir, folder, monkeypatch, method: str, key: str, value) -> Path:
    """The converter's file with one metadata value replaced as it is written."""
    original = getattr(gguf.GGUFWriter, method)

    def patched(self, k, v, *args, **kwargs):
        return original(self, k, value if k == key else v, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, method, patched)
        return LAYOUTS[layout].write(tiny_dir, folder)


def write_renaming(layout: str, tiny_dir, folder, monkeypatch, old: str, new: str) -> Path:
    """The converter's file with `old` replaced by `new` in every tensor name it writes."""
    original = gguf.GGUFWriter.add_tensor

    def renamed(self, name, *args, **kwargs):
        return original(self, name.replace(old, new), *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, "add_tensor", renamed)
        return LAYOUTS[layout].write(tiny_dir, folder)


# --- every layout ------------------------------------------------------------------------------------------

def test_tensors_and_config_equal_the_original_in_the_files_types(layout, tiny_checkpoint):
    spec, model, llm = layout
    loaded = load_checkpoint(model, llm=llm)
    assert loaded.config == tiny_checkpoint.config and loaded.source["format"] == spec.format
    expected = dict(tiny_checkpoint.tensors, **{name: tiny_checkpoint.tensors[TIED] for name in spec.extra})
    assert sorted(loaded.tensors) == sorted(expected)
    for name, t in expected.items():
        mine = loaded.tensors[name]
        assert mine.shape == t.shape, name
        if spec.same_types:
            assert mine.dtype == t.dtype, name
            np.testing.assert_array_equal(mine.data, t.data, err_msg=name)
        else:
            np.testing.assert_array_equal(widen(mine), in_stored_type(t, mine.dtype), err_msg=name)


@pytest.mark.parametrize("reference", ["funasr", "transformers"])
def test_greedy_ids_equal_the_original_in_the_files_types(layout, tiny_checkpoint, reference):
    spec, model, llm = layout
    ids = greedy_ids(nanoasr.load_model(str(model), llm=llm and str(llm), activations="exact"), reference)
    if spec.pinned_ids:  # the original's pinned ids (tests/test_engine.py holds it to them)
        expected = cases(REFS, reference)["short"]["greedy_ids"][:TOKENS].tolist()
    else:
        loaded = load_checkpoint(model, llm=llm)
        same_types = {name: as_stored(tiny_checkpoint.tensors[name], t.dtype)
                      for name, t in loaded.tensors.items() if name in tiny_checkpoint.tensors}
        original = Checkpoint(tiny_checkpoint.config, same_types, tiny_checkpoint.files)
        expected = greedy_ids(nanoasr.Model(original, activations="exact"), reference)
    assert ids == expected and len(set(ids)) > 5


@pytest.mark.parametrize("name, method, key, value, message", METADATA_EDITS)
def test_metadata_that_disagrees_is_named(tiny_dir, tmp_path, monkeypatch, name, method, key, value, message):
    path = write_with(name, tiny_dir, tmp_path, monkeypatch, method, key, value)
    with pytest.raises(ModelError, match=rf"{path.name}: " + message):
        load_checkpoint(path)


@pytest.mark.parametrize("name, key", [("transcribe_cpp", "stt.funasr_nano.adaptor.use_low_frame_rate"),
                                       ("crispasr", "funasr.use_low_frame_rate")])
def test_every_audio_frame_goes_to_the_decoder_when_the_file_says_so(tiny_dir, tmp_path, monkeypatch, name,
                                                                     key):
    path = write_with(name, tiny_dir, tmp_path, monkeypatch, "add_bool", key, False)
    assert load_checkpoint(path).config.adaptor.use_low_frame_rate is False


@pytest.mark.parametrize("name, old, new, message", [
    ("transcribe_cpp", "enc.tp_norm.", "enc.tp_final_norm.",
     r"unexpected tensor enc.tp_final_norm.weight \(not in transcribe"),
    ("crispasr", ".ffn.l2.", ".ffn.l3.", r"unexpected tensor funasr.enc.blk.0.ffn.l3.w \(not in CrispASR"),
])
def test_a_tensor_outside_the_layout_is_named(tiny_dir, tmp_path, monkeypatch, name, old, new, message):
    path = write_renaming(name, tiny_dir, tmp_path, monkeypatch, old, new)
    with pytest.raises(ModelError, match=message):
        load_checkpoint(path)


# --- FunASR's llama.cpp runtime pair ------------------------------------------------------------------------

@pytest.mark.parametrize("wtype, outtype", [("f32", "f32"), ("f32", "bf16"), ("f16", "bf16")])
def test_the_pair_holds_the_original_weights_and_config(tiny_dir, tiny_checkpoint, tmp_path, wtype, outtype):
    folder = funasr_llamacpp.write(tiny_dir, tmp_path, wtype, outtype)
    loaded = load_checkpoint(folder / ENCODER_FILE, llm=folder / DECODER_FILE)
    assert loaded.config == tiny_checkpoint.config
    assert sorted(loaded.tensors) == sorted(tiny_checkpoint.tensors)
    for name, t in tiny_checkpoint.tensors.items():
        mine = loaded.tensors[name]
        assert mine.shape == t.shape, name
        expected = widen(t)
        if mine.dtype == "f16":  # the export's own rounding of the float32 values
            expected = expected.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(widen(mine), expected, err_msg=name)


def test_a_directory_holding_both_files_loads(pair, tiny_checkpoint):
    loaded = load_checkpoint(pair)
    assert loaded.config == tiny_checkpoint.config and loaded.source["format"] == "funasr-llama.cpp"


def test_q8_0_encoder_blocks_equal_a_nanoasr_gguf_and_give_the_same_ids(tiny_dir, tiny_checkpoint, tmp_path):
    folder = funasr_llamacpp.write(tiny_dir, tmp_path / "pair", "q8_0", "bf16")
    loaded = load_checkpoint(folder)
    quantized = sorted(n for n, t in loaded.tensors.items() if t.dtype == "q8_0")
    assert quantized and all(n.startswith("model.audio_tower.") or "projector" in n for n in quantized)
    convert.write(tmp_path / "ours.gguf", tiny_checkpoint, "q8_0", report=False, progress=None)
    ours = load_checkpoint(tmp_path / "ours.gguf")
    for name in quantized:
        assert ours.tensors[name].dtype == "q8_0", name
        blocks = np.asarray(loaded.tensors[name].data)
        np.testing.assert_array_equal(blocks, np.asarray(ours.tensors[name].data), err_msg=name)
    mixed = dict(tiny_checkpoint.tensors, **{name: ours.tensors[name] for name in quantized})
    reference = nanoasr.Model(Checkpoint(tiny_checkpoint.config, mixed, tiny_checkpoint.files),
                              activations="exact")
    assert greedy_ids(nanoasr.Model(loaded, activations="exact")) == greedy_ids(reference)


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


def test_the_command_line_takes_the_pair_to_transcribe_and_to_convert(pair, tiny_checkpoint, tmp_path,
                                                                      capsys):
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
    assert converted.config == tiny_checkpoint.config
    for name, t in tiny_checkpoint.tensors.items():
        np.testing.assert_array_equal(widen(converted.tensors[name]), widen(t), err_msg=name)


def test_a_folder_of_ggufs_holds_one_model_or_says_what_it_found(pair, tiny_checkpoint, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    convert.write(one / "model.gguf", tiny_checkpoint, "f32", report=False, progress=None)
    assert load_checkpoint(one).config == tiny_checkpoint.config
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


# --- transcribe.cpp -----------------------------------------------------------------------------------------

def test_a_missing_tensor_is_named(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_tensor

    def dropping(self, name, *args, **kwargs):
        if name != "dec.layers.1.ffn.up.weight":
            original(self, name, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", dropping)
    path = transcribe_cpp.write(tiny_dir, tmp_path / "short.gguf")
    with pytest.raises(ModelError, match=r"missing, first model.language_model.layers.1.mlp.up_proj"):
        load_checkpoint(path)


# --- CrispASR -----------------------------------------------------------------------------------------------

def test_the_mistaken_adaptor_head_count_of_early_files_is_read_as_8(tiny_dir, tmp_path):
    path = crispasr.write(tiny_dir, tmp_path / "early.gguf", ada_n_heads=16)
    with pytest.warns(UserWarning, match=r"funasr.ada_n_heads is 16, a mistake of early CrispASR"):
        loaded = load_checkpoint(path)
    assert loaded.config.adaptor.num_attention_heads == 8


# --- audio.cpp ----------------------------------------------------------------------------------------------

def test_orig_keeps_every_tensor_and_embeds_the_checkpoint_files(tiny_dir, tiny_checkpoint, tmp_path):
    path = audiocpp.write(tiny_dir, tmp_path / "orig.gguf", "orig")
    physical = gguf_read.read_header(path).tensors
    assert any(info.name.startswith("_audiocpp.") for info in physical)  # names of 64 bytes or more
    loaded = load_checkpoint(path)
    assert loaded.config == tiny_checkpoint.config and loaded.source["format"] == "audio.cpp gguf"
    assert loaded.files["tokenizer.json"] == (tiny_dir / "tokenizer.json").read_text()
    assert sorted(loaded.tensors) == sorted(tiny_checkpoint.tensors)
    for name, t in tiny_checkpoint.tensors.items():
        assert loaded.tensors[name].dtype == t.dtype, name
        np.testing.assert_array_equal(loaded.tensors[name].data, t.data, err_msg=name)
    ref = cases(REFS, "funasr")["short"]
    model = nanoasr.load_model(str(path), activations="exact")
    assert greedy_ids(model) == ref["greedy_ids"][:TOKENS].tolist()


def test_q8_0_blocks_equal_a_nanoasr_gguf_and_give_the_same_ids(tiny_dir, tiny_checkpoint, tmp_path):
    loaded = load_checkpoint(audiocpp.write(tiny_dir, tmp_path / "q8.gguf", "q8_0"))
    quantized = sorted(n for n, t in loaded.tensors.items() if t.dtype == "q8_0")
    assert quantized and loaded.tensors["model.language_model.embed_tokens.weight"].dtype == "f16"
    convert.write(tmp_path / "ours.gguf", tiny_checkpoint, "q8_0", report=False, progress=None)
    ours = load_checkpoint(tmp_path / "ours.gguf")
    mixed = dict(tiny_checkpoint.tensors)
    for name in quantized:
        assert ours.tensors[name].dtype == "q8_0", name
        blocks = np.asarray(loaded.tensors[name].data)
        np.testing.assert_array_equal(blocks, np.asarray(ours.tensors[name].data), err_msg=name)
        mixed[name] = ours.tensors[name]
    embed = "model.language_model.embed_tokens.weight"
    np.testing.assert_array_equal(widen(loaded.tensors[embed]),
                                  widen(tiny_checkpoint.tensors[embed]).astype(np.float16).astype(np.float32))
    mixed[embed] = loaded.tensors[embed]
    reference = nanoasr.Model(Checkpoint(tiny_checkpoint.config, mixed, tiny_checkpoint.files),
                              activations="exact")
    assert greedy_ids(nanoasr.Model(loaded, activations="exact")) == greedy_ids(reference)


def test_a_namespaced_package_is_refused_by_name(tiny_dir, tmp_path, monkeypatch):
    original = gguf.GGUFWriter.add_key_value

    def namespaced(self, k, v, *args, **kwargs):
        if k == "audiocpp.tensor_names":
            v = ["model/" + name for name in v]
        return original(self, k, v, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", namespaced)
    path = audiocpp.write(tiny_dir, tmp_path / "packed.gguf", "orig")
    with pytest.raises(ModelError, match=r"namespaced \(packed\) audio.cpp GGUFs are not supported"):
        load_checkpoint(path)


# --- FunASR's model.pt folder -------------------------------------------------------------------------------

@pytest.mark.parametrize("container, module_prefix", [("state_dict", False), ("model", True),
                                                      (None, False), ("model_state_dict", True)])
def test_tensors_and_config_are_bit_identical_to_the_original(torch, tiny_checkpoint, tiny_dir, tmp_path,
                                                              container, module_prefix):
    folder = funasr_checkpoint.write(tiny_dir, tmp_path, container, module_prefix)
    assert_same_checkpoint(load_checkpoint(folder / "model.pt"), tiny_checkpoint)


def test_the_file_and_its_folder_both_load(funasr_dir, tiny_checkpoint):
    assert_same_checkpoint(load_checkpoint(funasr_dir), tiny_checkpoint)
    assert load_checkpoint(str(funasr_dir / "model.pt")).source["format"] == "model.pt"


def test_recognised_by_contents_not_by_name(funasr_dir, tiny_checkpoint, tmp_path):
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes((funasr_dir / "model.pt").read_bytes())
    for part in ("config.yaml", "Qwen3-0.6B"):
        (tmp_path / part).symlink_to(funasr_dir / part)
    assert_same_checkpoint(load_checkpoint(renamed), tiny_checkpoint)


def test_ctc_tensors_stay_readable_and_do_not_fail_the_load(torch, funasr_dir, tiny_checkpoint, tmp_path):
    state = torch.load(funasr_dir / "model.pt")["state_dict"]
    state["ctc.ctc_lo.weight"] = torch.ones(5, 32)
    state["ctc_decoder.blocks.0.norm1.weight"] = torch.ones(32)
    state["audio_encoder.encoders.0.norm1.num_batches_tracked"] = torch.tensor(7)  # an integer buffer
    copy = folder_copy(funasr_dir, tmp_path)
    torch.save({"state_dict": state}, copy / "model.pt")
    raw = torch_zip.read(copy / "model.pt")
    np.testing.assert_array_equal(raw["ctc.ctc_lo.weight"].data, np.ones((5, 32), np.float32))
    assert "audio_encoder.encoders.0.norm1.num_batches_tracked" not in raw
    assert_same_checkpoint(load_checkpoint(copy), tiny_checkpoint)


def folder_copy(funasr_dir, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    (out / "Qwen3-0.6B").symlink_to(funasr_dir / "Qwen3-0.6B")
    (out / "config.yaml").write_text((funasr_dir / "config.yaml").read_text())
    (out / "model.pt").write_bytes((funasr_dir / "model.pt").read_bytes())
    return out


def test_without_config_yaml_the_config_comes_from_shapes_with_a_warning(funasr_dir, tiny_checkpoint,
                                                                         tmp_path, monkeypatch):
    copy = folder_copy(funasr_dir, tmp_path)
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed: config.yaml cannot be read
    with pytest.warns(UserWarning, match=r"derived from tensor shapes.*adaptor\.num_attention_heads=8"):
        loaded = load_checkpoint(copy)
    # everything shapes determine matches; the adaptor's head count (2 in the tiny model) cannot be seen
    original = tiny_checkpoint.config
    assert loaded.config.audio == original.audio and loaded.config.text == original.text
    assert loaded.config.adaptor.num_attention_heads == 8


def test_config_yaml_values_are_checked(funasr_dir, tmp_path):
    copy = folder_copy(funasr_dir, tmp_path)
    yaml_path = copy / "config.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("attention_heads: 4", "attention_heads: four"))
    with pytest.raises(ModelError, match=r"config\.yaml: audio_encoder_conf\.attention_heads must be an "
                                         r"integer, found 'four'"):
        load_checkpoint(copy)
    yaml_path.write_text((funasr_dir / "config.yaml").read_text().replace("num_blocks: 3", "num_blocks: 4"))
    with pytest.raises(ModelError, match=r"model\.pt: \d+ tensor\(s\) missing, first model\.audio_tower"):
        load_checkpoint(copy)


def test_missing_tokenizer_is_named(funasr_dir, tmp_path):
    copy = tmp_path / "no_tokenizer"
    copy.mkdir()
    (copy / "model.pt").write_bytes((funasr_dir / "model.pt").read_bytes())
    with pytest.raises(ModelError, match=r"Qwen3-0\.6B/tokenizer\.json: missing"):
        load_checkpoint(copy)


def test_convert_writes_a_gguf_with_the_same_values(funasr_dir, tiny_checkpoint, tmp_path, capsys):
    from nanoasr.cli import main

    out = tmp_path / "tiny.gguf"
    assert main(["convert", str(funasr_dir / "model.pt"), "--type", "bf16", "-o", str(out)]) == 0
    converted = load_checkpoint(out)  # BF16 matrices; norms and biases widened to F32, values unchanged
    assert converted.config == tiny_checkpoint.config
    assert sorted(converted.tensors) == sorted(tiny_checkpoint.tensors)
    for name, t in tiny_checkpoint.tensors.items():
        np.testing.assert_array_equal(converted.tensors[name].numpy(), t.numpy(), err_msg=name)


def test_a_config_yaml_without_use_low_frame_rate_gives_the_decoder_every_audio_frame(funasr_dir, tmp_path,
                                                                                      monkeypatch):
    """FunASR reads audio_adaptor_conf.use_low_frame_rate with a default of false (Fun-ASR-MLT-Nano's
    config.yaml leaves it out): then all T adaptor rows go to the decoder, not fake_token_len(T)."""
    from nanoasr.model import prompt

    copy = folder_copy(funasr_dir, tmp_path)
    yaml_text = (copy / "config.yaml").read_text()
    (copy / "config.yaml").write_text(yaml_text.replace("  use_low_frame_rate: true\n", ""))
    model = nanoasr.load_model(str(copy))
    assert model.config.adaptor.use_low_frame_rate is False
    rows = []
    real = prompt.Template.ids
    monkeypatch.setattr(prompt.Template, "ids", lambda self, n: rows.append(n) or real(self, n))
    wave = cases(REFS, "funasr")["short"]["wave"]
    model.transcribe(wave, sample_rate=16000, reference="funasr", max_new_tokens=2, ignore_stop=True)
    n_frames = model.features(wave, "funasr").shape[0]
    assert rows == [n_frames] and prompt.n_audio_tokens(n_frames, "funasr") < n_frames


def test_the_mlt_package_gives_a_model_of_31_languages(funasr_dir, monkeypatch):
    from nanoasr import hub
    from nanoasr.errors import OptionError

    mlt = hub.get_package("fun_asr_mlt_nano_2512")
    with monkeypatch.context() as m:  # the package's files are the tiny folder
        m.setattr(hub, "resolve", lambda model, **kw: hub.Resolved(funasr_dir, mlt.repo, mlt.revision, mlt))
        model = nanoasr.load_model("fun_asr_mlt_nano_2512")
    assert model.checkpoint.source["variant"] == "fun-asr-mlt-nano-2512" and len(model.languages) == 31
    wave = cases(REFS, "funasr")["short"]["wave"]
    model.transcribe(wave, sample_rate=16000, language="Korean", max_new_tokens=1, ignore_stop=True)
    nano = nanoasr.load_model(str(funasr_dir))
    assert nano.languages == ("zh", "en", "ja")
    with pytest.raises(OptionError, match=r"not trained for it; its languages are zh, en, ja"):
        nano.transcribe(wave, sample_rate=16000, language="ko", max_new_tokens=1)
