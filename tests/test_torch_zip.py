"""torch.save archives (FunASR's model.pt) read by nanoasr.formats.torch_zip without torch and without running
pickle code.

The well-formed archive is written by torch.save itself (tools/reference/funasr_checkpoint.py) from the
committed tiny checkpoint; the hostile ones are built here from zip members and pickle opcodes. That the
archive's checkpoint equals the original is tests/test_layouts.py's.
"""
import pickle
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import ModelError
from nanoasr.formats import torch_zip
from tools.reference import funasr_checkpoint


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def funasr_dir(torch, tiny_dir, tmp_path_factory):
    """The tiny checkpoint as FunASR's folder: model.pt under `state_dict`, config.yaml, Qwen3-0.6B/."""
    return funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("funasr"))


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
