"""Mutated WAV, FLAC, MP3, safetensors and GGUF files, FunASR's model.pt (zip and pickle), the other
runtimes' GGUF layouts, config.json and config.yaml: a NanoasrError, a transcript or a checkpoint, never
another exception, within a time and memory bound. Bounded by example count so the suite stays short;
NANOASR_FUZZ_EXAMPLES raises the count of the model-file fuzzers for a longer run."""
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import time
import traceback
import tracemalloc
import zipfile

import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoasr import convert
from nanoasr.api import Model
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import NanoasrError
from nanoasr.formats.gguf_read import read_header
from tools.reference import audiocpp, crispasr, funasr_checkpoint, funasr_llamacpp, transcribe_cpp

AUDIO_EXAMPLES, CHECKPOINT_EXAMPLES = 60, 25
MODEL_FILE_EXAMPLES = int(os.environ.get("NANOASR_FUZZ_EXAMPLES", "10"))  # each load reads an 18 MB tokenizer
SECONDS_PER_EXAMPLE = 60  # a hang, not a slow example, is what this bound catches
PEAK_MB = 400  # Python-visible allocations (numpy's included) while one example runs
CHILD_HEADROOM = 2 << 30  # address space a forked fuzzer may add to its parent's


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=SECONDS_PER_EXAMPLE * 1000, derandomize=True,
                    database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def speech_like(seconds=0.6, rate=16000):  # [N] float32: a few harmonics under a syllable-rate envelope
    t = np.arange(round(seconds * rate)) / rate
    voice = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 1100), 1))
    return (0.3 * voice * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def encoded(fmt: str) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speech_like(), 16000, format=fmt,
                    subtype={"WAV": "PCM_16", "FLAC": "PCM_16", "MP3": "MPEG_LAYER_III"}[fmt])
    return buf.getvalue()


@st.composite
def mutated(draw, seed: bytes, hot: int):
    """`seed` with a few byte flips, overwrites, insertions, deletions or a truncation, mostly in its first
    `hot` bytes (the headers, where parsing happens)."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        end = min(hot, len(data)) if draw(st.booleans()) or len(data) <= hot else len(data)
        at = draw(st.integers(0, max(end - 1, 0)))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "int"]))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[at:]
        elif op == "int" and at + 8 <= len(data):  # a length or count field set to an extreme value
            extreme = draw(st.sampled_from([0, 1, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 63 - 1, 2 ** 64 - 1]))
            data[at:at + 8] = struct.pack("<Q", extreme)
    return bytes(data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(node, prefix=()):  # every key path in a parsed JSON document
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


@st.composite
def json_mutated(draw, document):
    """A deep copy of `document` with one to three values replaced by JSON of another kind or range, or
    removed."""
    document = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(sorted(_paths(document), key=repr)))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.integers(0, 4)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON_VALUES)
    return document


def bounded(call):
    """Runs call() and asserts that it returned or raised a NanoasrError within the memory bound."""
    tracemalloc.start()
    try:
        call()
    except NanoasrError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_MB * 2 ** 20, f"peak {peak / 2 ** 20:.0f} MB"


def transcribe(model, data):
    model.transcribe(data, max_new_tokens=4, max_duration_s=60)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "MP3"])
def test_mutated_audio(tiny_model, fmt):
    seed = encoded(fmt)

    @fuzz(AUDIO_EXAMPLES)
    @given(data=mutated(seed, hot=256))
    def check(data):
        bounded(lambda: transcribe(tiny_model, data))

    check()


@pytest.fixture(scope="module")
def wave_bytes():
    return encoded("WAV")


def checkpoint_case(tiny_dir, tmp_path_factory, name: str, data: bytes):
    folder = tmp_path_factory.mktemp("fuzzed")
    for f in tiny_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, folder / f.name)
    (folder / name).write_bytes(data)
    return folder


def test_mutated_safetensors(tiny_dir, tmp_path_factory, wave_bytes):
    seed = (tiny_dir / "model.safetensors").read_bytes()
    hot = 8 + struct.unpack("<Q", seed[:8])[0]

    @fuzz(CHECKPOINT_EXAMPLES)
    @given(data=mutated(seed, hot=hot))
    def check(data):
        folder = checkpoint_case(tiny_dir, tmp_path_factory, "model.safetensors", data)
        bounded(lambda: transcribe(Model(load_checkpoint(folder)), wave_bytes))
        shutil.rmtree(folder)

    check()


def test_mutated_gguf(tiny_dir, tmp_path_factory, wave_bytes):
    path = tmp_path_factory.mktemp("seed") / "tiny-f16.gguf"
    convert.write(path, load_checkpoint(tiny_dir), "f16", report=False, progress=None)
    seed = path.read_bytes()
    hot = gguf_hot(path)

    @fuzz(CHECKPOINT_EXAMPLES)
    @given(data=mutated(seed, hot=hot))
    def check(data):
        target = tmp_path_factory.mktemp("fuzzed") / "model.gguf"
        target.write_bytes(data)
        bounded(lambda: transcribe(Model(load_checkpoint(target)), wave_bytes))
        target.unlink()

    check()


def safetensors_with_header(seed: bytes, header: dict) -> bytes:
    n = struct.unpack("<Q", seed[:8])[0]
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + seed[8 + n:]


def test_safetensors_headers_of_the_wrong_kind(tiny_dir, tmp_path_factory, wave_bytes):
    seed = (tiny_dir / "model.safetensors").read_bytes()
    header = json.loads(seed[8:8 + struct.unpack("<Q", seed[:8])[0]])

    @fuzz(CHECKPOINT_EXAMPLES)
    @given(changed=json_mutated(header))
    def check(changed):
        folder = checkpoint_case(tiny_dir, tmp_path_factory, "model.safetensors",
                                 safetensors_with_header(seed, changed))
        bounded(lambda: transcribe(Model(load_checkpoint(folder)), wave_bytes))
        shutil.rmtree(folder)

    check()


def test_configs_of_the_wrong_kind(tiny_dir, tmp_path_factory, wave_bytes):
    config = json.loads((tiny_dir / "config.json").read_text())

    @fuzz(CHECKPOINT_EXAMPLES)
    @given(changed=json_mutated(config))
    def check(changed):
        folder = checkpoint_case(tiny_dir, tmp_path_factory, "model.safetensors",
                                 (tiny_dir / "model.safetensors").read_bytes())
        (folder / "config.json").write_text(json.dumps(changed))
        bounded(lambda: transcribe(Model(load_checkpoint(folder)), wave_bytes))
        shutil.rmtree(folder)

    check()


# --- model files, fuzzed in a forked child under an address-space limit -------------------------------------

def in_limited_child(run, seconds: int) -> None:
    """run() in a forked child whose address space is limited (RLIMIT_AS: a bomb fails there, not here);
    its assertion or exception is this test's failure, and so is a crash or a run past `seconds`."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 0
        try:
            limit = address_space() + CHILD_HEADROOM
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            run()
        except BaseException:  # everything, so the child always exits here and never returns into pytest
            os.write(write_end, traceback.format_exc()[-20000:].encode())
            code = 1
        os._exit(code)
    os.close(write_end)
    try:
        report, status = _wait(pid, read_end, seconds)
    finally:
        os.close(read_end)
    assert status == 0, f"child exit status {status}: {report}"


def address_space() -> int:
    """This process's virtual size (VmSize), in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


def _wait(pid: int, read_end: int, seconds: int) -> tuple[str, int]:
    chunks, deadline = [], time.monotonic() + seconds
    while True:
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(read_end, 65536) if ready else b""
        if ready and chunk:
            chunks.append(chunk)
            continue
        if not ready:  # past the deadline: a hang
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"no result within {seconds} s", -1
        _, status = os.waitpid(pid, 0)
        return b"".join(chunks).decode(errors="replace"), status


def fuzz_loading(seed: bytes, hot: int, write, target):
    """MODEL_FILE_EXAMPLES mutations of `seed` written by write(data), each loaded from target() in the
    limited child: a NanoasrError or a checkpoint, within the memory bound."""
    @fuzz(MODEL_FILE_EXAMPLES)
    @given(data=mutated(seed, hot=hot))
    def check(data):
        write(data)
        bounded(lambda: load_checkpoint(*target()))

    in_limited_child(check, seconds=MODEL_FILE_EXAMPLES * SECONDS_PER_EXAMPLE)


def gguf_hot(path) -> int:
    """Where the tensor data starts: the mutations land in the header before it. nanoasr's own header walk,
    as gguf's reader takes minutes over the megabytes of a byte array (audio.cpp's embedded files)."""
    return min(t.start for t in read_header(path).tensors)


@pytest.fixture(scope="module")
def funasr_folder(tiny_dir, tmp_path_factory):
    pytest.importorskip("torch")
    return funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("funasr"))


def linked_copy(folder, tmp_path_factory):
    """`folder` with every entry a link, so a case replaces one file without touching the seed."""
    out = tmp_path_factory.mktemp("fuzzed")
    for f in folder.iterdir():
        (out / f.name).symlink_to(f)
    return out


def replaced(folder, name: str):
    def write(data: bytes):
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_bytes(data)
    return write


def test_mutated_model_pt(funasr_folder, tmp_path_factory):
    folder = linked_copy(funasr_folder, tmp_path_factory)
    seed = (funasr_folder / "model.pt").read_bytes()
    fuzz_loading(seed, len(seed), replaced(folder, "model.pt"), lambda: (folder,))


def test_mutated_data_pkl(funasr_folder, tmp_path_factory):
    folder = linked_copy(funasr_folder, tmp_path_factory)
    with zipfile.ZipFile(funasr_folder / "model.pt") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    pkl = next(n for n in members if n.endswith("/data.pkl"))

    def write(data: bytes):
        (folder / "model.pt").unlink(missing_ok=True)
        with zipfile.ZipFile(folder / "model.pt", "w") as z:
            for name, blob in members.items():
                z.writestr(name, data if name == pkl else blob)

    fuzz_loading(members[pkl], len(members[pkl]), write, lambda: (folder,))


def test_mutated_config_yaml(funasr_folder, tmp_path_factory):
    folder = linked_copy(funasr_folder, tmp_path_factory)
    seed = (funasr_folder / "config.yaml").read_bytes()
    fuzz_loading(seed, len(seed), replaced(folder, "config.yaml"), lambda: (folder,))


def test_mutated_config_json(tiny_dir, tmp_path_factory):
    folder = linked_copy(tiny_dir, tmp_path_factory)
    seed = (tiny_dir / "config.json").read_bytes()
    fuzz_loading(seed, len(seed), replaced(folder, "config.json"), lambda: (folder,))


@pytest.mark.parametrize("which", ["encoder", "decoder"])
def test_mutated_funasr_llamacpp_pair(tiny_dir, tmp_path_factory, which):
    pair = funasr_llamacpp.write(tiny_dir, tmp_path_factory.mktemp("pair"), "f32", "bf16")
    name = {"encoder": funasr_llamacpp.ENCODER_FILE, "decoder": funasr_llamacpp.DECODER_FILE}[which]
    folder = linked_copy(pair, tmp_path_factory)
    fuzz_loading((pair / name).read_bytes(), gguf_hot(pair / name), replaced(folder, name), lambda: (folder,))


@pytest.mark.parametrize("layout", ["transcribe_cpp", "crispasr", "audiocpp"])
def test_mutated_runtime_gguf(tiny_dir, tmp_path_factory, layout):
    seed_path = tmp_path_factory.mktemp("seed") / "model.gguf"
    {"transcribe_cpp": lambda: transcribe_cpp.write(tiny_dir, seed_path),
     "crispasr": lambda: crispasr.write(tiny_dir, seed_path),
     "audiocpp": lambda: audiocpp.write(tiny_dir, seed_path, "orig")}[layout]()
    target = tmp_path_factory.mktemp("fuzzed") / "model.gguf"
    fuzz_loading(seed_path.read_bytes(), gguf_hot(seed_path), replaced(target.parent, target.name),
                 lambda: (target,))
