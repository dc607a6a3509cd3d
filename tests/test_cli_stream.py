"""nanoasr stream on the tiny model: finals equal `Model.transcribe` of each utterance's audio, raw PCM from a
pipe and a WAV file alike; the terminal rendering of partials; usage errors and pacing."""
import io
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import soundfile as sf
import soxr

from nanoasr import realtime as rt
from nanoasr.cli import main
from nanoasr.cli.stream import Printer
from tests.test_realtime import utterances_clip

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
