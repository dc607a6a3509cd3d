"""FunASR's original model.pt: read without torch and without running pickle code.

The well-formed archives are written by torch.save itself (tools/reference/funasr_checkpoint.py) from the
committed tiny checkpoint; the hostile ones are built here from zip members and pickle opcodes.
"""
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.formats import torch_zip
import nanoasr
from tools.lib.parity import cases
from tools.reference import funasr_checkpoint

REFS = np.load(Path(__file__).parent / "fixtures" / "tiny" / "reference.npz")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def funasr_dir(torch, tiny_dir, tmp_path_factory):
    """The tiny checkpoint as FunASR's folder: model.pt under `state_dict`, config.yaml, Qwen3-0.6B/."""
    return funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("funasr"))


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_checkpoint(tiny_dir)


def assert_same_checkpoint(loaded, original):
    assert loaded.config == original.config
    assert sorted(loaded.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        assert loaded.tensors[name].dtype == t.dtype and loaded.tensors[name].shape == t.shape, name
        np.testing.assert_array_equal(loaded.tensors[name].data, t.data, err_msg=name)


@pytest.mark.parametrize("container, module_prefix", [("state_dict", False), ("model", True),
                                                      (None, False), ("model_state_dict", True)])
def test_tensors_and_config_are_bit_identical_to_the_original(torch, original, tiny_dir, tmp_path, container,
                                                              module_prefix):
    folder = funasr_checkpoint.write(tiny_dir, tmp_path, container, module_prefix)
    assert_same_checkpoint(load_checkpoint(folder / "model.pt"), original)


def backed_by_memmap(array) -> bool:
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return True
        array = array.base
    return False


def test_weights_are_views_of_the_archive_with_shared_storage_kept_shared(funasr_dir):
    raw = torch_zip.read(funasr_dir / "model.pt")
    head, embed = raw["llm.lm_head.weight"], raw["llm.model.embed_tokens.weight"]
    assert head.data.ctypes.data == embed.data.ctypes.data  # one storage, read once
    assert backed_by_memmap(embed.data)
    assert embed.dtype == "bf16" and not embed.data.flags.writeable


TOKENS = 16  # a prefix of the pinned greedy ids: enough to tell models apart, quick to decode


@pytest.mark.parametrize("reference", ["transformers", "funasr"])
def test_greedy_ids_through_load_model_equal_the_original(funasr_dir, reference):
    ref = cases(REFS, reference)["short"]  # the original's pinned ids (tests/test_engine.py holds it to them)
    model = nanoasr.load_model(str(funasr_dir))
    result = model.transcribe(ref["wave"], sample_rate=16000, reference=reference, max_new_tokens=TOKENS,
                              ignore_stop=True)
    ids = list(result.segments[0].token_ids)
    assert ids == ref["greedy_ids"][:TOKENS].tolist() and len(set(ids)) > 5


def test_the_file_and_its_folder_both_load(funasr_dir, original):
    assert_same_checkpoint(load_checkpoint(funasr_dir), original)
    assert load_checkpoint(str(funasr_dir / "model.pt")).source["format"] == "model.pt"


def test_recognised_by_contents_not_by_name(funasr_dir, original, tmp_path):
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes((funasr_dir / "model.pt").read_bytes())
    for part in ("config.yaml", "Qwen3-0.6B"):
        (tmp_path / part).symlink_to(funasr_dir / part)
    assert_same_checkpoint(load_checkpoint(renamed), original)


def test_ctc_tensors_stay_readable_and_do_not_fail_the_load(torch, funasr_dir, original, tmp_path):
    state = torch.load(funasr_dir / "model.pt")["state_dict"]
    state["ctc.ctc_lo.weight"] = torch.ones(5, 32)
    state["ctc_decoder.blocks.0.norm1.weight"] = torch.ones(32)
    state["audio_encoder.encoders.0.norm1.num_batches_tracked"] = torch.tensor(7)  # an integer buffer
    copy = folder_copy(funasr_dir, tmp_path)
    torch.save({"state_dict": state}, copy / "model.pt")
    raw = torch_zip.read(copy / "model.pt")
    np.testing.assert_array_equal(raw["ctc.ctc_lo.weight"].data, np.ones((5, 32), np.float32))
    assert "audio_encoder.encoders.0.norm1.num_batches_tracked" not in raw
    assert_same_checkpoint(load_checkpoint(copy), original)


def folder_copy(funasr_dir, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    (out / "Qwen3-0.6B").symlink_to(funasr_dir / "Qwen3-0.6B")
    (out / "config.yaml").write_text((funasr_dir / "config.yaml").read_text())
    (out / "model.pt").write_bytes((funasr_dir / "model.pt").read_bytes())
    return out


def test_without_config_yaml_the_config_comes_from_shapes_with_a_warning(funasr_dir, original, tmp_path,
                                                                         monkeypatch):
    copy = folder_copy(funasr_dir, tmp_path)
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed: config.yaml cannot be read
    with pytest.warns(UserWarning, match=r"derived from tensor shapes.*adaptor\.num_attention_heads=8"):
        loaded = load_checkpoint(copy)
    # everything shapes determine matches; the adaptor's head count (2 in the tiny model) cannot be seen
    assert loaded.config.audio == original.config.audio and loaded.config.text == original.config.text
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


def test_convert_writes_a_gguf_with_the_same_values(funasr_dir, original, tmp_path, capsys):
    from nanoasr.cli import main

    out = tmp_path / "tiny.gguf"
    assert main(["convert", str(funasr_dir / "model.pt"), "--type", "bf16", "-o", str(out)]) == 0
    converted = load_checkpoint(out)  # BF16 matrices; norms and biases widened to F32, values unchanged
    assert converted.config == original.config and sorted(converted.tensors) == sorted(original.tensors)
    for name, t in original.tensors.items():
        np.testing.assert_array_equal(converted.tensors[name].numpy(), t.numpy(), err_msg=name)


# --- hostile archives, built without torch -----------------------------------------------------------------

SENTINEL_NAME = "ran.txt"


def archive(path, pickled: bytes, members=None, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/byteorder", b"little")
        for name, data in (members or {}).items():
            z.writestr(f"archive/data/{name}", data, compress_type=compress)
        z.writestr("archive/version", b"3\n")
    return path


def tensor_pickle(storage_type: str, numel: int, offset: int, shape: tuple, stride=None) -> bytes:
    """{'w': _rebuild_tensor_v2(storage, offset, shape, stride (contiguous by default))} in pickle opcodes."""
    stride = stride or tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    ints = lambda xs: b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"  # noqa: E731
    return (b"\x80\x02}X\x01\x00\x00\x00w"
            b"ctorch._utils\n_rebuild_tensor_v2\n("
            + b"(X\x07\x00\x00\x00storagec" + b"torch\n" + storage_type.encode() + b"\n"
            + b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpu" + b"J" + struct.pack("<i", numel) + b"tQ"
            + b"J" + struct.pack("<i", offset) + ints(shape) + ints(stride) + b"\x89}t" + b"Rs.")


def test_handmade_archive_reads(tmp_path):
    data = np.arange(6, dtype=np.float32)
    path = archive(tmp_path / "ok.pt", tensor_pickle("FloatStorage", 6, 2, (2, 2)), {"0": data.tobytes()})
    np.testing.assert_array_equal(torch_zip.read(path)["w"].data, [[2, 3], [4, 5]])


class RunsACommand:
    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.sentinel}",)


def test_a_pickle_that_calls_os_system_is_refused_before_it_runs(tmp_path):
    sentinel = tmp_path / SENTINEL_NAME
    path = archive(tmp_path / "model.pt", pickle.dumps({"w": RunsACommand(sentinel)}, protocol=2))
    with pytest.raises(ModelError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "calls posix.system" in message or "calls nt.system" in message
    assert "refused before running it" in message
    assert not sentinel.exists()
    pickle.loads(pickle.dumps(RunsACommand(sentinel), protocol=2))  # the payload is real: it would run
    assert sentinel.exists()


@pytest.mark.parametrize("module, name", [("builtins", "eval"), ("subprocess", "Popen"),
                                          ("torch._utils", "_rebuild_from_type_v2")])
def test_other_globals_are_refused_by_name(tmp_path, module, name):
    pickled = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x01\x00\x00\x00x\x85R."
    path = archive(tmp_path / "model.pt", pickled)
    with pytest.raises(ModelError, match=rf"calls {module}\.{name}, which a plain state dict never needs"):
        torch_zip.read(path)


def hostile(tmp_path, case):
    data = np.zeros(4, np.float32).tobytes()
    if case == "truncated":
        good = archive(tmp_path / "good.pt", tensor_pickle("FloatStorage", 4, 0, (4,)), {"0": data})
        blob = good.read_bytes()
        (tmp_path / "model.pt").write_bytes(blob[:len(blob) - 30])
        return tmp_path / "model.pt"
    if case == "no data.pkl":
        with zipfile.ZipFile(tmp_path / "model.pt", "w") as z:
            z.writestr("archive/data/0", data)
        return tmp_path / "model.pt"
    pickled, members, compress = tensor_pickle("FloatStorage", 4, 0, (4,)), {"0": data}, zipfile.ZIP_STORED
    if case == "unknown storage":
        pickled = tensor_pickle("ComplexFloatStorage", 4, 0, (4,))
    if case == "beyond storage":
        pickled = tensor_pickle("FloatStorage", 4, 2, (4,))
    if case == "zero stride":  # an expanded view: a copy could be made any size
        pickled = tensor_pickle("FloatStorage", 4, 0, (1000, 1000), stride=(0, 0))
    if case == "storage shorter than claimed":
        members = {"0": data[:8]}
    if case == "deflated":
        compress = zipfile.ZIP_DEFLATED
    if case == "missing storage":
        members = {}
    return archive(tmp_path / "model.pt", pickled, members, compress)


HOSTILE = {
    "truncated": r"not a readable zip archive .*perhaps truncated",
    "no data.pkl": r"expected one <dir>/data\.pkl in the zip .*found 0",
    "unknown storage": r"storage type torch\.ComplexFloatStorage is not supported",
    "beyond storage": r"tensor w: data reach element 6 but its storage 0 holds 4",
    "zero stride": r"tensor w: 1000000 elements from a storage of 4; expected a tensor that owns its",
    "storage shorter than claimed": r"storage 0: expected 16 bytes \(4 x FloatStorage\), found 8",
    "deflated": r"storage archive/data/0 is compressed or encrypted .*expected it stored uncompressed",
    "missing storage": r"storage archive/data/0 is missing from the archive",
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_malformed_archives_give_one_error_line(tmp_path, case):
    path = hostile(tmp_path, case)
    with pytest.raises(ModelError, match=HOSTILE[case]) as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_file_that_is_neither_gguf_nor_zip_is_named(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x02}q\x00.")  # the pre-1.6 torch.save format: a bare pickle
    with pytest.raises(ModelError, match=r"expected a GGUF file or a torch\.save archive"):
        load_checkpoint(path)


def test_strided_views_are_read_as_their_values(tmp_path):
    data = np.arange(12, dtype=np.float32)  # a transposed [3, 4] -> [4, 3] view, as torch.save keeps it
    path = archive(tmp_path / "t.pt", tensor_pickle("FloatStorage", 12, 0, (4, 3), stride=(1, 4)),
                   {"0": data.tobytes()})
    np.testing.assert_array_equal(torch_zip.read(path)["w"].data, data.reshape(3, 4).T)


@st.composite
def mutated_pickle(draw, seed: bytes):
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[max(at, 1):]
    return bytes(data)


def test_mutated_pickles_give_a_model_error_or_a_checkpoint(funasr_dir, tmp_path):
    with zipfile.ZipFile(funasr_dir / "model.pt") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    pkl = next(n for n in members if n.endswith("/data.pkl"))
    for name in ("config.yaml", "Qwen3-0.6B"):
        (tmp_path / name).symlink_to(funasr_dir / name)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=mutated_pickle(members[pkl]))
    def check(data):
        with zipfile.ZipFile(tmp_path / "model.pt", "w") as z:
            for name, blob in members.items():
                z.writestr(name, data if name == pkl else blob)
        try:
            load_checkpoint(tmp_path / "model.pt")
        except ModelError as exc:
            assert "\n" not in str(exc)

    check()


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
    n_frames = model.features([wave], "funasr")[0].shape[1]
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
