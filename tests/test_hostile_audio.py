"""Hostile audio input: playlists naming local files, decoders that never finish, decompression bombs,
duration limits and absurdly loud samples."""
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest
import soundfile
import soxr

from nanoasr import cli
from nanoasr.audio import io as audio_io
from nanoasr.audio.io import SAMPLE_RATE, load_audio
from nanoasr.audio.segment import MIN_POWER, frame_db, split
from nanoasr.errors import AudioError, AudioTooLongError, OptionError
from tools.lib.synth import speech_like

FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="ffmpeg is not on PATH")
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="named pipes and shell scripts")
HOUR_RATE = 8000  # the hour-long bomb is stored at 8 kHz, so decoding it also resamples
MB = 1e6


def sine(seconds, rate=SAMPLE_RATE, amp=0.5):  # [round(rate * seconds)] float32
    return (amp * np.sin(2 * np.pi * 440.0 * np.arange(round(rate * seconds)) / rate)).astype(np.float32)


def encoded(wave, rate, fmt="WAV", subtype="FLOAT"):
    buf = io.BytesIO()
    soundfile.write(buf, wave, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


# --- 1. playlists naming server-side files ------------------------------------------------------------

class FifoSentinel:
    """A named pipe standing in for a secret file: it records whether anyone opened it for reading, and
    then hands that reader real MP3 audio, so a decoder that follows the playlist would succeed."""

    def __init__(self, path, payload):
        os.mkfifo(path)
        self.path, self.payload = path, payload
        self.opened, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self.stop.is_set():
            try:  # a non-blocking open for writing succeeds only while a reader has the pipe open
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.005)
                continue
            self.opened.set()
            with os.fdopen(fd, "wb") as writer:
                os.set_blocking(fd, True)
                writer.write(self.payload)
            return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.fixture(scope="module")
def secret_mp3(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "secret.wav"
    soundfile.write(path, sine(2.0), SAMPLE_RATE)
    out = path.with_suffix(".mp3")
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(path), str(out)], check=True)
    return out.read_bytes()


PLAYLISTS = {
    "hls": "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{path}\n#EXT-X-ENDLIST\n",
    "hls-url": "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:{path}\n#EXT-X-ENDLIST\n",
    "hls-after-blank-lines": "\n\n#EXTM3U\n#EXTINF:10,\n{path}\n#EXT-X-ENDLIST\n",
    "concat": "ffconcat version 1.0\nfile '{path}'\n",
}


@needs_ffmpeg
@posix_only
@pytest.mark.parametrize("precheck", [True, False], ids=["refused-before-ffmpeg", "refused-by-ffmpeg"])
@pytest.mark.parametrize("kind", PLAYLISTS)
@pytest.mark.parametrize("given_as", ["path.m3u8", "path.wav", "path.m4a", "bytes", "file object"])
def test_a_playlist_never_opens_the_file_it_names(tmp_path, secret_mp3, monkeypatch, precheck, kind,
                                                  given_as):
    if not precheck:  # ffmpeg's own whitelists alone must stop it
        monkeypatch.setattr(audio_io, "PLAYLIST_MAGIC", ())
    monkeypatch.setattr(audio_io, "FFMPEG_TIMEOUT_FLOOR_S", 20.0)
    secret = tmp_path / "secret.mp3"
    playlist = PLAYLISTS[kind].format(path=secret).encode()
    upload = tmp_path / ("upload" + os.path.splitext(given_as)[1])
    upload.write_bytes(playlist)
    source = {"bytes": playlist, "file object": io.BytesIO(playlist)}.get(given_as, upload)
    with FifoSentinel(secret, secret_mp3) as sentinel, pytest.raises(AudioError) as caught:
        load_audio(source)
    assert not sentinel.opened.is_set(), "the decoder opened the file the playlist names"
    assert "did not finish" not in str(caught.value)
    if precheck and kind != "hls-url":
        assert "playlist" in str(caught.value) or "concat script" in str(caught.value)


@needs_ffmpeg
def test_ffmpeg_reads_stdin_only_with_whitelists(tmp_path, monkeypatch):
    path = tmp_path / "sine.m4a"
    soundfile.write(tmp_path / "src.wav", sine(1.0), SAMPLE_RATE)
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(tmp_path / "src.wav"), str(path)],
                   check=True)
    commands = []
    real_popen = subprocess.Popen

    def recording_popen(command, **kwargs):
        commands.append(command)
        return real_popen(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    assert len(load_audio(path)) >= SAMPLE_RATE
    (command,) = commands
    assert command[command.index("-i") + 1] == "pipe:0"
    assert not any(str(path) in arg for arg in command)
    assert command[command.index("-protocol_whitelist") + 1] == "pipe"
    allowed = command[command.index("-format_whitelist") + 1].split(",")
    assert not {"hls", "concat", "image2", "image2pipe", "dash"} & set(allowed)


@needs_ffmpeg
def test_an_mp4_with_its_index_after_the_audio_decodes_from_a_path(tmp_path):
    soundfile.write(tmp_path / "src.wav", sine(20.0), SAMPLE_RATE)
    path = tmp_path / "late-index.m4a"  # ffmpeg writes the moov box after the audio unless told otherwise
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(tmp_path / "src.wav"), str(path)],
                   check=True)
    data = path.read_bytes()
    assert data.index(b"moov") > data.index(b"mdat")
    wave = load_audio(path)  # a pipe cannot seek back to the index; the file itself, with mov alone, can
    assert 20 * SAMPLE_RATE <= len(wave) <= 20 * SAMPLE_RATE + 2048  # AAC pads to whole 1024-sample frames
    assert np.sqrt(np.mean(wave[SAMPLE_RATE:-SAMPLE_RATE] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.05)


# --- 2. a decoder that never finishes -----------------------------------------------------------------

def fake_ffmpeg(tmp_path, monkeypatch, body):
    """An `ffmpeg` first on PATH that runs `body` with SIGTERM ignored, writing its pid to a file."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "ffmpeg"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\ntrap '' TERM\nexec {body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "pid"


def assert_reaped(pid_file):
    with pytest.raises(ProcessLookupError):  # killed and waited for: not even a zombie is left
        os.kill(int(pid_file.read_text()), 0)


NOT_AUDIO = b"\x00" * 300_000  # libsndfile refuses it; larger than a pipe's buffer, so the feeder blocks


@posix_only
def test_a_hung_ffmpeg_is_killed_at_the_timeout(tmp_path, monkeypatch):
    pid_file = fake_ffmpeg(tmp_path, monkeypatch, "sleep 600")
    monkeypatch.setattr(audio_io, "FFMPEG_TIMEOUT_FLOOR_S", 2.0)  # time enough for the script to start
    start = time.monotonic()
    with pytest.raises(AudioError, match=r"<bytes>: cannot be decoded: .*did not finish within 2 s"):
        load_audio(NOT_AUDIO)
    assert time.monotonic() - start < 10.0
    assert_reaped(pid_file)


def test_the_timeout_grows_with_the_input():
    assert audio_io.ffmpeg_timeout_s(0) == audio_io.FFMPEG_TIMEOUT_FLOOR_S >= 30.0
    # a gigabyte of compressed audio (about 17 hours at 128 kbit/s) gets over a quarter of an hour
    assert audio_io.ffmpeg_timeout_s(10 ** 9) > 900.0


@posix_only
def test_an_interrupted_decode_kills_ffmpeg(tmp_path, monkeypatch):
    pid_file = fake_ffmpeg(tmp_path, monkeypatch, "sleep 600")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)  # ffmpeg is waiting by then
        with pytest.raises(KeyboardInterrupt):
            load_audio(NOT_AUDIO)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_reaped(pid_file)


@posix_only
def test_endless_ffmpeg_output_stops_at_the_duration_limit(tmp_path, monkeypatch):
    pid_file = fake_ffmpeg(tmp_path, monkeypatch, "cat /dev/zero")
    start = time.monotonic()
    with pytest.raises(AudioTooLongError, match=r"<bytes>: the audio is longer than the 2 s duration limit"):
        load_audio(NOT_AUDIO, max_duration_s=2)
    assert time.monotonic() - start < 10.0
    assert_reaped(pid_file)


@needs_ffmpeg
def test_a_live_playlist_is_refused_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr(audio_io, "PLAYLIST_MAGIC", ())  # so that ffmpeg sees it
    monkeypatch.setattr(audio_io, "FFMPEG_TIMEOUT_FLOOR_S", 20.0)
    (tmp_path / "seg.mp3").write_bytes(b"")
    live = f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{tmp_path / 'seg.mp3'}\n".encode()
    with pytest.raises(AudioError) as caught:
        load_audio(live)
    assert "did not finish" not in str(caught.value)


# --- 3. decompression bombs and the duration limit ----------------------------------------------------

@pytest.fixture(scope="module")
def silent_hour(tmp_path_factory):
    """One hour of digital silence as FLAC, written a minute at a time: a few hundred KB on disk."""
    path = tmp_path_factory.mktemp("bomb") / "hour.flac"
    with soundfile.SoundFile(path, "w", HOUR_RATE, 1, format="FLAC", subtype="PCM_16") as file:
        minute = np.zeros(60 * HOUR_RATE, np.int16)
        for _ in range(60):
            file.write(minute)
    return path


def test_an_hour_of_flac_decodes_and_segments_in_bounded_memory(silent_hour):
    assert silent_hour.stat().st_size < 1_000_000
    output_bytes = 4 * SAMPLE_RATE * 3600  # the float32 16 kHz samples themselves: 230.4 MB
    tracemalloc.start()
    try:
        wave = load_audio(silent_hour)
        spans = split(wave)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wave.shape == (SAMPLE_RATE * 3600,) and spans == []
    # the output plus O(block): before block-wise decoding this was about 36 bytes a sample (2 GB)
    assert peak < output_bytes + 16 * MB, f"peak {peak / MB:.1f} MB"


def test_the_duration_limit_refuses_the_hour_before_decoding(silent_hour):
    tracemalloc.start()
    try:
        with pytest.raises(AudioTooLongError, match=r"hour\.flac: the audio is 3600 s long, longer than "
                                                    r"the 600 s duration limit"):
            load_audio(silent_hour, max_duration_s=600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 * MB, f"peak {peak / MB:.1f} MB"
    assert issubclass(AudioTooLongError, AudioError)


def flac_without_length(wave, rate):  # FLAC whose STREAMINFO total-samples field says "unknown" (0)
    data = bytearray(encoded(wave, rate, "FLAC", "PCM_16"))
    assert data[:4] == b"fLaC"
    data[21] &= 0xF0  # the 36-bit count: the low 4 bits of STREAMINFO byte 13, then 4 bytes
    data[22:26] = bytes(4)
    return bytes(data)


def test_the_limit_is_counted_while_decoding_a_file_that_states_no_length():
    data = flac_without_length(sine(3.0), SAMPLE_RATE)
    assert soundfile.info(io.BytesIO(data)).frames >= audio_io.SF_COUNT_MAX
    np.testing.assert_array_equal(load_audio(data), load_audio(encoded(sine(3.0), SAMPLE_RATE, "FLAC",
                                                                       "PCM_16")))
    with pytest.raises(AudioTooLongError, match=r"<bytes>: the audio is longer than the 2\.5 s duration"):
        load_audio(data, max_duration_s=2.5)
    assert len(load_audio(data, max_duration_s=3.0)) == 3 * SAMPLE_RATE


@pytest.mark.parametrize("seconds, limit, refused", [(3.0, 2.9, True), (3.0, 3.0, False), (3.0, 60, False)])
def test_the_limit_on_every_input_kind(tmp_path, seconds, limit, refused):
    wave = sine(seconds, 44100)
    path = tmp_path / "a.wav"
    soundfile.write(path, wave, 44100)
    for source, kw in [(path, {}), (path.read_bytes(), {}), (io.BytesIO(path.read_bytes()), {}),
                       (wave, {"sample_rate": 44100})]:
        if refused:
            with pytest.raises(AudioTooLongError, match=f"is 3 s long, longer than the {limit:g} s duration"):
                load_audio(source, max_duration_s=limit, **kw)
        else:
            assert len(load_audio(source, max_duration_s=limit, **kw)) == 3 * SAMPLE_RATE


@needs_ffmpeg
def test_the_limit_applies_to_what_ffmpeg_decodes(tmp_path):
    soundfile.write(tmp_path / "src.wav", sine(2.0), SAMPLE_RATE)
    path = tmp_path / "a.m4a"
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(tmp_path / "src.wav"), str(path)],
                   check=True)
    with pytest.raises(AudioTooLongError, match=r"a\.m4a: the audio is longer than the 1 s duration limit"):
        load_audio(path, max_duration_s=1)
    assert len(load_audio(path, max_duration_s=3)) >= 2 * SAMPLE_RATE


@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), float("inf"), "600", True, [600]])
def test_bad_duration_limits(bad):
    with pytest.raises(OptionError, match="max_duration_s must be a positive number of seconds"):
        load_audio(sine(1.0), sample_rate=SAMPLE_RATE, max_duration_s=bad)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000, 16001])
@pytest.mark.parametrize("block", [1000, 4096, 1 << 18])
def test_streamed_resampling_equals_one_shot(monkeypatch, rate, block):
    monkeypatch.setattr(audio_io, "BLOCK_VALUES", block)
    rng = np.random.default_rng(rate)
    stereo = (0.3 * rng.standard_normal((3 * rate + 7, 2))).astype(np.float32)
    mono = stereo.mean(axis=1, dtype=np.float32)  # for 2 channels, the same as a float64 mean rounded once
    one_shot = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    np.testing.assert_array_equal(load_audio(stereo, sample_rate=rate), one_shot)
    np.testing.assert_array_equal(load_audio(encoded(stereo, rate)), one_shot)


def test_output_grows_past_the_room_reserved(monkeypatch):
    data = encoded(sine(2.0, 22050), 22050)
    expected = load_audio(data)
    monkeypatch.setattr(audio_io, "MAX_PREALLOC", 1000)  # as if the header had understated the length
    np.testing.assert_array_equal(load_audio(data), expected)
    np.testing.assert_array_equal(load_audio(sine(2.0, 22050), sample_rate=22050), expected)


def frame_db_whole(wave, frame, hop):  # the formula over the whole wave at once, as before blocks
    x = wave.astype(np.float64)
    total = np.concatenate(([0.0], np.cumsum(x)))
    total_sq = np.concatenate(([0.0], np.cumsum(x * x)))
    starts = np.arange(1 + (len(wave) - frame) // hop) * hop
    mean = (total[starts + frame] - total[starts]) / frame
    mean_sq = (total_sq[starts + frame] - total_sq[starts]) / frame
    return 10.0 * np.log10(np.maximum(mean_sq - mean * mean, MIN_POWER))


@pytest.mark.parametrize("n", [400, 401, 560, 123_457, 1024 * 160 + 240, 1024 * 160 + 400, 700_001])
def test_frame_db_in_blocks_matches_the_whole_wave_formula(n):
    wave = (0.1 * np.random.default_rng(n).standard_normal(n)).astype(np.float32)
    np.testing.assert_allclose(frame_db(wave, 400, 160), frame_db_whole(wave, 400, 160), rtol=0, atol=1e-9)


def test_frame_db_in_blocks_on_ten_minutes():
    rng = np.random.default_rng(3)
    n = 600 * SAMPLE_RATE
    levels = 10 ** rng.uniform(-4, 0, n // 160 + 1).repeat(160)[:n]  # -80 to 0 dB, changing every frame
    wave = (rng.standard_normal(n) * levels).astype(np.float32)
    blocked, whole = frame_db(wave, 400, 160), frame_db_whole(wave, 400, 160)
    # Both round; the whole-wave running sums lose ~1e-12 absolute power over ten minutes, the blocks less.
    np.testing.assert_allclose(10 ** (blocked / 10), 10 ** (whole / 10), rtol=0, atol=1e-10)
    loud = whole > -40
    np.testing.assert_allclose(blocked[loud], whole[loud], rtol=0, atol=1e-5)


# --- 4. absurdly loud samples -------------------------------------------------------------------------

@pytest.mark.parametrize("peak, dtype", [(1e30, np.float64), (1e39, np.float64), (1e30, np.float32),
                                         (9.0, np.float32)])
def test_loud_arrays_are_scaled_to_peak_one(caplog, peak, dtype):
    wave = (speech_like(2.0, seed=1).astype(np.float64) / 0.5 * peak).astype(dtype)
    with caplog.at_level(logging.WARNING, logger="nanoasr.audio.io"):
        out = load_audio(wave, sample_rate=SAMPLE_RATE)
    assert np.isfinite(out).all() and np.abs(out).max() <= 1.0
    true_peak = np.abs(wave.astype(np.float64)).max()
    np.testing.assert_allclose(out, wave / true_peak, rtol=1e-6, atol=1e-7)
    (record,) = caplog.records
    assert record.getMessage().startswith(f"<array>: the audio peaks at {true_peak:.3g}, far beyond")


def test_loud_float_wav_files(tmp_path, caplog):
    wave = speech_like(2.0, seed=2)
    for subtype, peak in [("FLOAT", 1e30), ("DOUBLE", 1e39), ("DOUBLE", 1e300)]:
        path = tmp_path / f"{subtype.lower()}.wav"
        loud = wave.astype(np.float64) / np.abs(wave).max() * peak
        soundfile.write(path, loud, SAMPLE_RATE, subtype=subtype)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nanoasr.audio.io"):
            out = load_audio(path)
        assert np.isfinite(out).all() and np.abs(out).max() == 1.0
        (record,) = caplog.records
        assert record.getMessage().startswith(f"{path}: the audio peaks at {peak:.3g}")


def test_float_audio_a_little_past_full_scale_is_kept(caplog):
    wave = sine(1.0, amp=1.5)
    with caplog.at_level(logging.WARNING, logger="nanoasr.audio.io"):
        np.testing.assert_array_equal(load_audio(encoded(wave, SAMPLE_RATE)), wave)
    assert caplog.records == []


def test_loud_audio_transcribes(tiny_model, tmp_path):
    wave = speech_like(3.0, seed=4).astype(np.float64)
    path = tmp_path / "loud.wav"
    soundfile.write(path, (wave * 1e30).astype(np.float32), SAMPLE_RATE, subtype="FLOAT")
    for source, kw in [(wave * 1e39, {"sample_rate": SAMPLE_RATE}), (path, {})]:
        transcript = tiny_model.transcribe(source, max_new_tokens=4, **kw)
        assert transcript.segments and transcript.duration_s == pytest.approx(3.0)


# --- the limit through the library and the command line -----------------------------------------------

def test_transcribe_passes_the_limit_on(tiny_model):
    wave = speech_like(3.0, seed=5)
    with pytest.raises(AudioTooLongError, match="is 3 s long, longer than the 2 s duration limit"):
        tiny_model.transcribe(wave, sample_rate=SAMPLE_RATE, max_duration_s=2)
    with pytest.raises(AudioTooLongError):
        tiny_model.transcribe_batch([(wave, SAMPLE_RATE)], max_duration_s=2)
    with pytest.raises(OptionError, match="max_duration_s"):
        tiny_model.transcribe(wave, sample_rate=SAMPLE_RATE, max_duration_s=-1)
    assert tiny_model.transcribe(wave, sample_rate=SAMPLE_RATE, max_duration_s=3, max_new_tokens=2).segments


class FakeModel:
    def load(self, model, device, threads, llm=None, activations="auto", huge_pages=False):
        return self

    def check_options(self, language=None, word_timestamps=False):
        """Accepts every language and word timestamps."""

    def compile_beside(self):
        return False

    def transcribe(self, audio, **kwargs):
        from nanoasr.transcript import Transcript

        return Transcript("hi", (), None, audio.duration_s, {})


def test_cli_max_duration_refuses_each_long_file_with_one_line(tmp_path, monkeypatch, capsys):
    from nanoasr import api

    monkeypatch.setattr(api, "Model", FakeModel())
    soundfile.write(tmp_path / "long.wav", sine(3.0), SAMPLE_RATE)
    soundfile.write(tmp_path / "short.wav", sine(1.0), SAMPLE_RATE)
    code = cli.main([str(tmp_path / "long.wav"), str(tmp_path / "short.wav"), "--max-duration", "2", "-q"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "hi\n"
    assert err.splitlines() == [f"nanoasr: error: {tmp_path / 'long.wav'}: the audio is 3 s long, "
                                "longer than the 2 s duration limit"]
    assert cli.main([str(tmp_path / "long.wav"), "-q"]) == 0  # the default limit is an hour


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "ten"])
def test_cli_bad_max_duration_is_a_usage_error(bad, capsys):
    assert cli.main(["a.wav", "--max-duration", bad]) == 2
    assert "--max-duration" in capsys.readouterr().err
