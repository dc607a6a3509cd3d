"""nanoasr stream on the tiny model: finals equal `Model.transcribe` of each utterance's audio, raw PCM from a
pipe and a WAV file alike; the terminal rendering of partials; usage errors and pacing."""
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import types

import numpy as np
import soundfile as sf
import soxr

from nanoasr import realtime as rt
from nanoasr.api import Options
from nanoasr.batching import DecodeScheduler
from nanoasr.cli import main
from nanoasr.cli.stream import Printer, _run
from tests.test_batching import held_at_first_step, wait_until
from tests.test_realtime import TONES, utterances_clip

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_cli(args, stdin: bytes):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "nanoasr", "stream", *args], input=stdin, cwd=ROOT, env=env,
                          capture_output=True, timeout=600)


def test_raw_pcm_from_a_pipe_as_json_lines(tiny_dir, fast_model):
    clip, _ = utterances_clip()
    at_24k = soxr.resample(clip, 16000, 24000, "HQ")
    raw = (np.clip(at_24k, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
    done = run_cli(["-", "--format", "s16le", "--rate", "24000", "--model", str(tiny_dir), "--threads", "1",
                    "--json", "--silence-ms", "500", "--no-partials", "--vad", "energy"], raw)  # tones
    assert done.returncode == 0, done.stderr.decode()
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    wave = soxr.resample(np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0, 24000, 16000, "HQ")
    finals = [e for e in events if e["type"] == "completed"]
    assert len(finals) == 3 and [e["type"] for e in events[:2]] == ["speech_started", "speech_stopped"]
    for final in finals:
        audio = wave[round(final["start"] * 1000) * 16:round(final["end"] * 1000) * 16]
        assert final["text"] == fast_model.transcribe(audio, sample_rate=16000).text


def test_a_wav_file_into_a_pipe_prints_finals_only(tiny_dir, fast_model, tmp_path, capsys):
    clip, _ = utterances_clip(seeds=(8,), gap_s=0.3)
    path = tmp_path / "one.wav"
    sf.write(path, clip, 16000, subtype="FLOAT")
    assert main(["stream", str(path), "--model", str(tiny_dir), "--threads", "1", "--manual",
                 "--no-partials"]) == 0
    assert capsys.readouterr().out == fast_model.transcribe(clip, sample_rate=16000).text + "\n"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_partials_are_rewritten_in_place_on_a_terminal():
    out = Terminal()
    printer = Printer(False, out)
    printer.show([rt.SpeechStarted(0, 0), rt.Delta(0, "hello"), rt.Delta(0, " wor")])
    printer.show([rt.SpeechStopped(0, 900), rt.Committed(0, 0, 900), rt.Delta(0, "ld"),
                  rt.Completed(0, "hello world", (), 0.9)])
    assert out.getvalue() == "\r\x1b[Khello\r\x1b[Khello wor\r\x1b[Khello world\r\x1b[Khello world\n"


def test_usage_errors_and_missing_input(tiny_dir, capsys):
    assert main(["stream", "-", "--model", str(tiny_dir), "--threshold", "2"]) == 2
    assert "threshold must be a number between 0 and 1" in capsys.readouterr().err
    assert main(["stream", "/nonexistent.wav", "--model", str(tiny_dir)]) == 1
    assert main(["stream", "--format", "s16le", "--rate", "0"]) == 2


def test_realtime_paces_the_input(tiny_dir):
    quiet = np.zeros(16000, "<i2").tobytes()  # 1 s of silence: nothing to decode, only the pacing remains
    started = time.monotonic()
    done = run_cli(["-", "--format", "s16le", "--model", str(tiny_dir), "--realtime"], quiet)
    assert done.returncode == 0 and done.stdout == b""
    assert time.monotonic() - started >= 0.9


class FakeSoundDevice(types.ModuleType):
    """sounddevice's surface that `--mic` uses, recording `pcm` (int16 at `rate`) in blocks on its own thread
    and then pressing Ctrl-C, as a person at a microphone would."""

    class PortAudioError(Exception):
        pass

    def __init__(self, pcm: bytes, rate: int):
        super().__init__("sounddevice")
        self.pcm, self.rate, self.opened = pcm, rate, []

    def query_devices(self, device, kind):
        if device == "nosuch":
            raise ValueError("No input device matching 'nosuch'")
        return {"default_samplerate": float(self.rate)}

    def RawInputStream(self, samplerate, channels, dtype, device, blocksize, callback):
        assert (samplerate, channels, dtype) == (self.rate, 1, "int16")
        self.opened.append(device)
        return FakeStream(self.pcm, blocksize * 2, callback)


class FakeStream:
    def __init__(self, pcm, block_bytes, callback):
        self.thread = threading.Thread(target=self.record, args=(pcm, block_bytes, callback))

    def record(self, pcm, block_bytes, callback):
        for at in range(0, len(pcm), block_bytes):
            callback(pcm[at:at + block_bytes], block_bytes // 2, None, None)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join()


def without_deltas(json_lines: str) -> list[dict]:
    return [e for e in map(json.loads, json_lines.splitlines()) if e["type"] != "delta"]


def test_a_microphone_until_ctrl_c_gives_the_events_of_the_same_pcm_from_a_pipe(tiny_dir, fast_model,
                                                                                monkeypatch, capsys):
    clip, _ = utterances_clip()
    at_48k = soxr.resample(clip, 16000, 48000, "HQ")
    raw = (np.clip(at_48k, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
    options = ["--model", str(tiny_dir), "--threads", "1", "--json", "--silence-ms", "500", "--vad", "energy"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert main(["stream", "-", "--format", "s16le", "--rate", "48000", *options]) == 0
    piped = capsys.readouterr().out
    device = FakeSoundDevice(raw, 48000)
    monkeypatch.setitem(sys.modules, "sounddevice", device)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: xdist ignores it
    try:
        assert main(["stream", "--mic", "--input-device", "2", *options]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back after the recording
    finally:
        signal.signal(signal.SIGINT, before)
    assert device.opened == [2]
    recorded = capsys.readouterr().out
    # the microphone's partials decode beside the listening, so its deltas depend on timing; the rest not
    assert without_deltas(recorded) == without_deltas(piped)
    finals = [json.loads(line) for line in recorded.splitlines() if '"completed"' in line]
    wave = soxr.resample(np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0, 48000, 16000, "HQ")
    assert len(finals) == 3
    for final in finals:
        audio = wave[round(final["start"] * 1000) * 16:round(final["end"] * 1000) * 16]
        assert final["text"] == fast_model.transcribe(audio, sample_rate=16000).text


def test_the_microphone_is_checked_before_the_model_loads(monkeypatch, capsys, tmp_path):
    missing_model = str(tmp_path / "no-model-here")
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # not installed
    assert main(["stream", "--mic", "--model", missing_model]) == 1
    assert 'the \'mic\' extra (sounddevice): pip install ".[mic]"' in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "sounddevice", FakeSoundDevice(b"", 16000))
    assert main(["stream", "--mic", "--input-device", "nosuch", "--model", missing_model]) == 1
    err = capsys.readouterr().err
    assert "no microphone to record from (No input device matching 'nosuch')" in err and "model" not in err
    assert main(["stream", "clip.wav", "--mic"]) == 2
    assert main(["stream", "--input-device", "1"]) == 2


def test_the_partial_interval_reaches_the_session_and_past_the_window_stops_before_the_model_loads(
        tiny_dir, tmp_path, capsys):
    from nanoasr.cli.stream import _session, build_parser

    session = _session(build_parser().parse_args(["--model", str(tiny_dir), "--partial-interval", "2.5"]))
    assert session.limits.partial_interval_s == 2.5
    assert _session(build_parser().parse_args(["--model", str(tiny_dir)])).limits.partial_interval_s == 0.48
    assert main(["stream", "--partial-interval", "9", "--model", str(tmp_path / "no-model-here")]) == 2
    err = capsys.readouterr().err
    assert "--partial-interval must be at most 8 s" in err and "model" not in err


class Collected:
    def __init__(self):
        self.events = []

    def show(self, events):
        self.events += events


def test_live_input_goes_on_listening_while_a_partial_decodes(fast_model, monkeypatch):
    """Live input (a scheduler): the first partial, held at its first decode step, does not hold up the
    listening: the utterance's end is heard and its final queued, the partial stops for it, and the events
    but the partial's deltas are those of the stream decoded in turn."""
    clip, _ = utterances_clip(seeds=(1,))
    chunks = [clip[i:i + 1600] for i in range(0, len(clip), 1600)]
    options, limits = Options(max_new_tokens=8, ignore_stop=True), rt.Limits(vad=TONES)
    in_turn = Collected()
    _run(rt.LiveSession(fast_model, options, limits=limits), chunks, in_turn, realtime=False)
    _, stepping, go = held_at_first_step(monkeypatch)
    scheduler = DecodeScheduler(fast_model)
    session = rt.LiveSession(fast_model, options, limits=limits, scheduler=scheduler)
    deadline = time.monotonic() + 120  # a final never queued fails below instead of hanging here
    release = threading.Thread(target=lambda: (wait_until(lambda: any(r.final for r in scheduler._queue)
                                                          or time.monotonic() > deadline), go.set()))
    release.start()
    beside = Collected()
    try:
        _run(session, chunks, beside, realtime=False)
    finally:
        go.set()
        release.join()
        scheduler.close()
    assert stepping.is_set() and scheduler.stopped == 1
    assert [e for e in beside.events if not isinstance(e, rt.Delta)] == \
        [e for e in in_turn.events if not isinstance(e, rt.Delta)]
