"""Hostile input, round two (issue 39): input names, manifests, files that are not regular, messages, and
the command line's default duration limit. The model-manager removal (item 1) and the hub's manifests
(item 7) are tested in test_hub.py beside the fake hub; the batch run through Ray in test_ray.py.

Every test here runs without Ray and without the real model: the command line gets a fake Model (or the
tiny checkpoint where its loading is the point), and each run is bounded in time.
"""
from __future__ import annotations

import inspect
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from nanoasr import cli, untrusted, writers
from nanoasr.audio import io as audio_io
from nanoasr.audio.io import DEFAULT_MAX_DURATION_S, SAMPLE_RATE, load_audio
from nanoasr.cli import batch, one_line, transcribe
from nanoasr.errors import AudioError
from tools.lib.synth import speech_like

ROOT = Path(__file__).resolve().parents[1]
# A newline, a tab and a byte that is not UTF-8 in one file name each (the last as os.fsdecode gives it)
HOSTILE_NAMES = {"newline": "new\nline", "tab": "tab\there", "not UTF-8": os.fsdecode(b"bad\xffbyte")}


class FakeModel:
    """Model.load and transcribe without a model: the transcript says "hi"."""

    def load(self, model, device, threads, llm=None, activations="auto", huge_pages=False):
        return self

    def check_options(self, language=None, word_timestamps=False):
        """Accepts every language and word timestamps."""

    def compile_beside(self):
        return False

    def transcribe(self, audio, **kwargs):
        from nanoasr.transcript import Segment, Transcript

        segment = Segment(0.0, audio.duration_s, "hi", "stop", (1, 2), -0.5)
        return Transcript("hi", (segment,), "en", audio.duration_s, {})


@pytest.fixture
def fake_model(monkeypatch):
    from nanoasr import api

    monkeypatch.setattr(api, "Model", FakeModel())


def wav(path: Path, seconds: float = 1.0) -> Path:
    soundfile.write(os.fsencode(path), speech_like(seconds, seed=3), SAMPLE_RATE, format="WAV")
    return path


def run_nanoasr(*args, stdin=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "nanoasr", *map(str, args)], stdin=stdin, env=env,
                          capture_output=True, timeout=timeout)


# --- item 6: names ---------------------------------------------------------------------------------------

def test_one_line_escapes_what_would_split_or_fail_a_line():
    assert one_line("a\nb\tc\x1bd\u2028e") == "a\\nb\\tc\\x1bd\\u2028e"
    assert one_line(os.fsdecode(b"x\xff.wav")) == "x\\xff.wav"
    assert one_line("plain é 中.wav") == "plain é 中.wav"


@pytest.mark.parametrize("kind", HOSTILE_NAMES)
def test_main_cli_writes_json_for_a_hostile_name(tmp_path, fake_model, capsys, kind):
    """-o DIR -f json gave a traceback and left an empty DIR/<name>.json (which --skip-existing then took
    for done): the name went into the JSON as it was, and UTF-8 cannot hold a byte that is not UTF-8."""
    name = HOSTILE_NAMES[kind]
    source = wav(tmp_path / f"{name}.wav")
    out = tmp_path / "out"
    assert cli.main([str(source), "-o", str(out), "-f", "json,txt", "-q"]) == 0
    written = json.loads((out / f"{name}.json").read_bytes())  # valid UTF-8 JSON
    assert written["source"] == str(source) and written["text"] == "hi"
    assert (out / f"{name}.txt").read_text() == "hi\n"
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{name}.json", f"{name}.txt"])  # no .partial
    capsys.readouterr()
    assert cli.main([str(source), "-o", str(out), "-f", "json", "--skip-existing", "-q"]) == 0
    assert capsys.readouterr().out == ""  # done, so skipped


@pytest.mark.parametrize("kind", HOSTILE_NAMES)
def test_an_error_about_a_hostile_name_is_one_line(tmp_path, fake_model, capsys, kind):
    bad = tmp_path / f"{HOSTILE_NAMES[kind]}.wav"
    bad.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage")
    good = wav(tmp_path / "good.wav")
    assert cli.main([str(bad), str(good), "-q"]) == 1
    out, err = capsys.readouterr()
    assert out == "hi\n"
    (line,) = err.splitlines()
    assert line.startswith(f"nanoasr: error: {one_line(bad)}: cannot be decoded") and line.isprintable()


def test_a_failed_write_leaves_no_file_and_is_not_skipped_later(tmp_path, fake_model, monkeypatch, capsys):
    """The CLI wrote its outputs in place: a failure left an empty or partial file that --skip-existing
    counted as done. Now each file is written whole beside its place, then renamed over it."""
    source = wav(tmp_path / "a.wav")
    out = tmp_path / "out"

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(writers.os, "replace", full_disk)
        assert cli.main([str(source), "-o", str(out), "-f", "json", "-q"]) == 1
    out_text, err = capsys.readouterr()
    assert err == f"nanoasr: error: {source}: cannot write its output: [Errno 28] No space left on device\n"
    assert list(out.iterdir()) == []  # neither a.json nor its temporary file
    assert cli.main([str(source), "-o", str(out), "-f", "json", "--skip-existing", "-q"]) == 0
    assert json.loads((out / "a.json").read_text())["text"] == "hi"  # transcribed, not skipped


def test_batch_names_that_ray_cannot_carry_are_error_rows_without_ray(tmp_path, capsys):
    """Each used to abort the whole batch run: Ray drops a tab, newline or carriage return from a path (it
    parses each as a URL) and then fails the job on the missing file, and Arrow cannot hold bytes that
    are not UTF-8. When every input is such a name, Ray is not even started."""
    files = [wav(tmp_path / f"{name}.wav") for name in HOSTILE_NAMES.values()]
    out = tmp_path / "out"
    started = time.monotonic()
    assert cli.main(["batch", *map(str, files), "-o", str(out), "-q"]) == 1
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.isprintable() for line in err)
    lines = [json.loads(line) for line in (out / batch.MANIFEST).read_bytes().splitlines()]
    assert {line["path"] for line in lines} == {str(f) for f in files}  # each name exactly, read back
    for line in lines:
        assert line["status"] == "error" and line["outputs"] == []
        assert f"nanoasr batch: error: {line['error']}" in err
        assert line["error"].startswith(one_line(line["path"]) + ": its name ")
        assert "rename it, or transcribe it with `nanoasr FILE`" in line["error"]


def test_ray_init_gets_a_command_line_it_can_send(monkeypatch):
    """ray.init sends this process's command line to Ray's runtime as a UTF-8 string: a file name on it
    that is not UTF-8 was a UnicodeEncodeError traceback from `nanoasr batch`."""
    ray = pytest.importorskip("ray")
    from nanoasr import ray as nanoasr_ray
    from ray._private import utils

    monkeypatch.setattr(utils, "get_entrypoint_name", lambda: "nanoasr batch " + os.fsdecode(b"\xff.wav"))
    seen = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(utils.get_entrypoint_name().encode()))
    nanoasr_ray.init_ray(address="local")
    assert seen == [b"nanoasr batch \\xff.wav"]
    assert utils.get_entrypoint_name() == "nanoasr batch " + os.fsdecode(b"\xff.wav")  # put back


# --- item 7: manifests that are deep or hold huge integers --------------------------------------------------

def test_a_deep_package_manifest_beside_the_model_does_not_stop_transcription(tiny_dir, tmp_path):
    """`nanoasr a.wav --model DIR` read DIR/nanoasr-package.json for provenance and died of a RecursionError
    on a deeply nested one."""
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    (model / "nanoasr-package.json").write_text('{"repo": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = run_nanoasr(wav(tmp_path / "a.wav"), "--model", model, "--max-new-tokens", 2, "-q")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize("line", [
    b'{"path": "/in/a.wav", "status": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError in json
    b'{"path": "/in/a.wav", "status": "ok", "seconds": ' + b"9" * 5000 + b"}",  # a plain ValueError
    b'{"path": "/in/a.wav", "status": ' + b"[" * 900 + b"]" * 900 + b"}",  # loads, but would not dump back
    b'{"path": ["/in/a.wav"], "status": "ok"}', b'"just a string"', b'{"path": "/in/\xff.wav"}',
])
def test_a_hostile_batch_manifest_line_is_dropped_as_damaged(tmp_path, line):
    good = {"path": "/in/b.wav", "status": "ok", "outputs": ["b.json"], "seconds": 1.0, "duration_s": 2.0,
            "error": None}
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / batch.MANIFEST).write_bytes(line + b"\n" + json.dumps(good).encode() + b"\n")
    manifest = batch.Manifest(tmp_path / batch.MANIFEST)
    assert manifest.damaged and list(manifest.lines) == ["/in/b.wav"]
    assert manifest.done("/in/b.wav", [tmp_path / "b.json"])
    manifest.forget(["/in/a.wav"])
    assert (tmp_path / batch.MANIFEST).read_text() == json.dumps(good) + "\n"


# --- item 9: inputs that are not regular files --------------------------------------------------------------

def test_a_device_path_is_refused_unread():
    started = time.monotonic()
    with pytest.raises(AudioError, match=r"^/dev/zero: is a character device, not an audio file$"):
        load_audio("/dev/zero")  # was read whole: all memory
    assert time.monotonic() - started < 5


def endless_pipe(chunk: bytes = b"\0" * 65536):
    """The read end of a pipe a thread writes `chunk` into until the reader closes it."""
    read_fd, write_fd = os.pipe()

    def write():
        try:
            while True:
                os.write(write_fd, chunk)
        except OSError:  # the reader closed: EPIPE
            pass
        finally:
            os.close(write_fd)

    threading.Thread(target=write, daemon=True).start()
    return open(read_fd, "rb")


def test_a_pipe_without_end_is_read_up_to_the_cap(monkeypatch):
    monkeypatch.setattr(audio_io, "STREAM_MAX_BYTES", 4 << 20)
    with endless_pipe() as pipe:
        with pytest.raises(AudioError, match=r"more than the 4 MiB that may be read from it; give a file's"):
            load_audio(pipe)


def test_a_fifo_without_end_is_read_up_to_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(audio_io, "STREAM_MAX_BYTES", 4 << 20)
    fifo = tmp_path / "audio.wav"
    os.mkfifo(fifo)

    def write():
        try:
            with open(fifo, "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
        except OSError:
            pass

    threading.Thread(target=write, daemon=True).start()
    with pytest.raises(AudioError, match=rf"^{fifo}: the pipe holds more than the 4 MiB that may be read"):
        load_audio(fifo)


def test_a_pipe_with_real_audio_still_decodes(tmp_path):
    data = io.BytesIO()
    soundfile.write(data, speech_like(1.0, seed=1), SAMPLE_RATE, format="WAV")
    read_fd, write_fd = os.pipe()
    threading.Thread(target=lambda: (os.write(write_fd, data.getvalue()), os.close(write_fd)),
                     daemon=True).start()
    with open(read_fd, "rb") as pipe:
        assert len(load_audio(pipe)) == SAMPLE_RATE


def test_the_cli_refuses_stdin_from_a_device(tiny_dir):
    with open("/dev/zero", "rb") as zero:
        done = run_nanoasr("-", "--model", tiny_dir, "-q", stdin=zero, timeout=120)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "nanoasr: error: <stdin>: is a character device, not audio; pipe or redirect an audio file into it"]


def test_the_cli_reads_an_endless_stdin_up_to_the_cap(fake_model, monkeypatch, capsys):
    monkeypatch.setattr(audio_io, "STREAM_MAX_BYTES", 4 << 20)
    with endless_pipe() as pipe:
        pipe.raw.name = "<stdin>"  # as sys.stdin's is
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(pipe))
        assert cli.main(["-", "-q"]) == 1
    assert capsys.readouterr().err == ("nanoasr: error: <stdin>: the input holds more than the 4 MiB that "
                                       "may be read from it; give a file's path to decode a larger file from "
                                       "disk\n")


def test_read_regular_refuses_a_fifo_without_waiting_for_a_writer(tmp_path):
    """The shared helper (nanoasr.untrusted) that model loaders can use for config.json and the like."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(untrusted.ReadRefused, match=r"^is a FIFO \(named pipe\), not a regular file$"):
        untrusted.read_regular(fifo, 1 << 20)  # open() would wait for a writer for ever
    assert untrusted.not_regular(fifo) == "is a FIFO (named pipe), not a regular file"
    with pytest.raises(untrusted.ReadRefused, match="is a character device"):
        untrusted.read_regular("/dev/zero", 1 << 20)
    (tmp_path / "big.json").write_bytes(b" " * 2048)
    with pytest.raises(untrusted.ReadRefused, match="is 2048 bytes, more than the 1 KiB it may be"):
        untrusted.read_regular(tmp_path / "big.json", 1024)
    assert untrusted.read_regular(tmp_path / "big.json", 2048) == b" " * 2048
    with endless_pipe() as pipe, pytest.raises(untrusted.ReadRefused, match="more than the 1 MiB"):
        untrusted.read_capped(pipe, 1 << 20)


# --- item 10: messages -------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"])
def test_a_utf16_playlist_is_one_right_reason_and_no_library_chatter(tmp_path, capfd, encoding):
    """libsndfile took the UTF-16 byte-order mark FF FE for an MPEG frame: three lines of libmpg123 notes
    on stderr, then "a truncated or corrupt MP3 file"."""
    path = tmp_path / "list.m3u8"
    path.write_bytes("#EXTM3U\n#EXTINF:10,\n/etc/passwd\n#EXT-X-ENDLIST\n".encode(encoding))
    capfd.readouterr()
    with pytest.raises(AudioError) as err:
        load_audio(path)
    width = "32" if "32" in encoding else "16"
    assert str(err.value) == (f"{path}: is an HLS/M3U playlist (UTF-{width} text), not audio; playlists "
                              "are refused, since they name other files or URLs and only the bytes given "
                              "are decoded")
    assert capfd.readouterr().err == ""  # nothing from libmpg123


def test_other_utf16_text_is_called_text(tmp_path, capfd):
    path = tmp_path / "notes.wav"
    path.write_bytes("these are my notes, not audio\n".encode("utf-16"))
    capfd.readouterr()
    with pytest.raises(AudioError, match=r"notes\.wav: is UTF-16 text, not audio$"):
        load_audio(path)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_finite_float64_near_its_maximum_is_loud_audio_not_nan(tmp_path, channels, caplog):
    """The channels' sum overflowed to Inf, and the message said "NaN or Inf" though every sample was
    finite. It is loud audio, scaled to peak 1.0 with a warning, as any audio beyond 8x full scale is."""
    wave = np.repeat(speech_like(1.0, seed=2).astype(np.float64)[:, None], channels, axis=1)
    huge = wave / np.abs(wave).max() * 1.7e308
    path = tmp_path / "huge.wav"
    soundfile.write(path, huge, SAMPLE_RATE, subtype="DOUBLE")
    samples = load_audio(path)
    assert np.isfinite(samples).all() and 0.99 < np.abs(samples).max() <= 1.01
    np.testing.assert_allclose(samples, load_audio(wave[:, 0] / np.abs(wave).max(), SAMPLE_RATE), atol=1e-6)
    assert "peaks at 1.7e+308, far beyond full scale (1.0); it is scaled to peak 1.0" in caplog.text
    nan = huge.copy()
    nan[100] = np.nan
    soundfile.write(path, nan, SAMPLE_RATE, subtype="DOUBLE")
    with pytest.raises(AudioError, match="the audio contains NaN or Inf samples"):
        load_audio(path)


# --- the command line's default duration limit -----------------------------------------------------------

def flac_claiming(seconds: float, tmp_path: Path) -> Path:
    """A 1 s FLAC whose STREAMINFO states `seconds` of audio: a long file's header, without its bytes."""
    path = tmp_path / "long.flac"
    soundfile.write(path, speech_like(1.0, seed=6), SAMPLE_RATE, format="FLAC")
    data = bytearray(path.read_bytes())
    total = int(seconds * SAMPLE_RATE)  # the 36-bit count: low 4 bits of byte 21, then bytes 22-25
    data[21] = (data[21] & 0xF0) | (total >> 32)
    data[22:26] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    assert soundfile.info(path).duration == pytest.approx(seconds)
    return path


def test_the_cli_refuses_a_long_file_by_default_before_decoding(tmp_path, fake_model, monkeypatch, capsys):
    """A 1.9 MB ten-hour FLAC took 4.5 GB in `nanoasr` (no limit): now the header's length is refused."""
    path = flac_claiming(10 * 3600, tmp_path)
    monkeypatch.setattr(audio_io, "_gather", lambda *a, **k: pytest.fail("decoded despite the limit"))
    assert cli.main([str(path), "-q"]) == 1
    assert capsys.readouterr().err == (f"nanoasr: error: {path}: the audio is 36000 s long, longer than the "
                                       "3600 s duration limit\n")


def test_one_default_limit_for_the_cli_batch_and_the_server():
    assert DEFAULT_MAX_DURATION_S == 3600
    assert transcribe.build_parser().parse_args(["a.wav"]).max_duration == DEFAULT_MAX_DURATION_S
    assert batch.build_parser().parse_args(["a.wav", "-o", "out"]).max_duration == DEFAULT_MAX_DURATION_S
    assert transcribe.build_parser().parse_args(["a.wav", "--max-duration", "36000"]).max_duration == 36000
    fastapi = pytest.importorskip("fastapi")  # noqa: F841  (the server extra)
    from nanoasr.server.app import create_app

    assert inspect.signature(create_app).parameters["max_duration_s"].default == DEFAULT_MAX_DURATION_S
