"""End-to-end CLI tests: `python -m nanoasr` in a subprocess on the tiny random checkpoint.

The random model's words mean nothing, so these check structure: exit codes, which files appear, stdout
and stderr lines, and that SRT/VTT/TSV/JSON files parse back (with parsers written here) to the same
segments. Each subprocess that loads the model costs a couple of seconds, so calls check several things.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import pty
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import soundfile

from nanoasr import cli
from nanoasr.audio.io import DecodedAudio
from nanoasr.cli import transcribe
from tools.lib.synth import speech_like

ROOT = Path(__file__).resolve().parents[1]
SR = 16000


def run(*args, stdin: bytes | None = None, cwd=None, stderr=subprocess.PIPE):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "nanoasr", *map(str, args)], input=stdin,
                          stdout=subprocess.PIPE, stderr=stderr, cwd=cwd, env=env, timeout=300)


def lines(data: bytes) -> list[str]:
    return [line for line in data.decode("utf-8").splitlines() if line.strip()]


def messages(stderr: bytes) -> list[str]:
    """stderr's lines less the line a process that compiles the kernels adds (where their disk cache is cold;
    test_a_process_that_compiles_the_kernels_says_so_once_unless_quiet checks it)."""
    return [line for line in lines(stderr) if not line.startswith("nanoasr: compiling kernels")]


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> Path:
    """audio/{one.wav, two.flac, notes.txt, .hidden.wav, sub/three.wav}, bad/{broken,empty}.wav, empty/."""
    root = tmp_path_factory.mktemp("cli")
    (root / "audio" / "sub").mkdir(parents=True)
    soundfile.write(root / "audio" / "one.wav", speech_like(7.0, seed=1), SR)
    soundfile.write(root / "audio" / "two.flac", speech_like(4.0, seed=2), SR)
    soundfile.write(root / "audio" / "sub" / "three.wav", speech_like(3.0, seed=3), SR)
    soundfile.write(root / "audio" / ".hidden.wav", speech_like(1.0, seed=4), SR)
    (root / "audio" / "notes.txt").write_text("not audio\n")
    (root / "bad").mkdir()
    (root / "bad" / "broken.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage")
    (root / "bad" / "empty.wav").write_bytes(b"")
    (root / "empty").mkdir()
    return root


# --- independent parsers for the subtitle formats ------------------------------------------------------

SRT_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)$")
VTT_TIME = re.compile(r"^(?:(\d\d+):)?(\d\d):(\d\d)\.(\d\d\d) --> (?:(\d\d+):)?(\d\d):(\d\d)\.(\d\d\d)$")


def _seconds(h, m, s, ms) -> float:
    return int(h or 0) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    """SRT: blocks separated by blank lines, each `index`, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, text lines."""
    cues = []
    for number, block in enumerate((b for b in text.strip("\n").split("\n\n") if b), 1):
        rows = block.split("\n")
        assert rows[0] == str(number), f"cue {number} is numbered {rows[0]!r}"
        match = SRT_TIME.match(rows[1])
        assert match, f"bad SRT timing line {rows[1]!r}"
        g = match.groups()
        assert len(rows) >= 3 and all(r.strip() for r in rows[2:]), f"cue {number} has no text"
        cues.append((_seconds(*g[:4]), _seconds(*g[4:]), "\n".join(rows[2:])))
    return cues


def parse_vtt(text: str) -> list[tuple[float, float, str]]:
    """WebVTT: a `WEBVTT` line, a blank line, then cues `[id]`, `[HH:]MM:SS.mmm --> ...`, text lines."""
    head, _, body = text.partition("\n\n")
    assert head.split(" ")[0] == "WEBVTT", f"missing WEBVTT header: {head!r}"
    cues = []
    for block in (b for b in body.strip("\n").split("\n\n") if b):
        rows = block.split("\n")
        if "-->" not in rows[0]:
            rows = rows[1:]  # a cue identifier
        match = VTT_TIME.match(rows[0])
        assert match, f"bad VTT timing line {rows[0]!r}"
        g = match.groups()
        text_rows = rows[1:]
        assert text_rows and all(r.strip() and "-->" not in r for r in text_rows), f"bad cue text {rows!r}"
        cues.append((_seconds(*g[:4]), _seconds(*g[4:]), "\n".join(text_rows)))
    return cues


def parse_tsv(text: str) -> list[tuple[float, float, str]]:
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["start", "end", "text"]
    assert all(len(r) == 3 and r[0].isdigit() and r[1].isdigit() for r in rows[1:]), rows
    return [(int(a) / 1000, int(b) / 1000, t) for a, b, t in rows[1:]]


def expected_cues(doc: dict) -> list[tuple[float, float, str]]:
    """Cues from a JSON transcript: segments with text, whitespace collapsed to single spaces."""
    out = []
    for s in doc["segments"]:
        text = " ".join(s["text"].split()).replace("-->", "->")
        if text:
            out.append((s["start"], s["end"], text))
    return out


def assert_same_cues(got, want):
    assert len(got) == len(want)
    for (a, b, text), (a2, b2, text2) in zip(got, want):
        assert abs(a - a2) <= 0.0005 and abs(b - b2) <= 0.0005 and text == text2
        assert a < b


def check_json(doc: dict, duration: float):
    assert isinstance(doc["text"], str) and doc["duration_s"] == pytest.approx(duration, abs=1e-3)
    starts = [s["start"] for s in doc["segments"]]
    assert starts == sorted(starts)
    for s in doc["segments"]:
        assert 0 <= s["start"] < s["end"] <= doc["duration_s"] + 1e-6
        assert s["finish_reason"] in ("stop", "length", "repetition")
        assert s["truncated"] == (s["finish_reason"] in ("length", "repetition"))


# --- usage, in-process (exit status 2 before any model is loaded) --------------------------------------

@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required"),
    (["a.wav", "--bogus"], "unrecognized arguments"),
    (["a.wav", "-f", "docx"], "-f/--output-format must be"),
    (["a.wav", "-f", "all"], "give -o DIR"),
    (["a.wav", "-f", "srt,vtt"], "give -o DIR"),
    (["a.wav", "--skip-existing"], "--skip-existing needs -o"),
    (["a.wav", "--threads", "0"], "argument --threads: must be a whole number greater than 0"),
    (["a.wav", "--threads", "two"], "invalid int value"),
    (["a.wav", "--language", "klingon"], "unknown language"),
    (["a.wav", "--max-new-tokens", "0"], "max_new_tokens must be between"),
    (["a.wav", "--reference", "whisper"], "invalid choice"),
    (["a.wav", "--device", "tpu"], "invalid choice"),
    (["a.wav", "--hotwords-file", "/nonexistent/hotwords.txt"], "--hotwords-file /nonexistent/hotwords.txt"),
    (["-", "-"], "'-' (stdin) can be given once only"),
    (["a.wav"] + ["--hotword=w%d" % i for i in range(101)], "at most 100 hotwords"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--language", "klingon"], ["--max-new-tokens", "0"],
                                  ["--context", "x" * 5000]])
def test_options_the_library_refuses_are_one_line_exit_2(argv, capsys):
    """api.Options checks them; the command prints its message as one line, without the usage."""
    assert cli.main(["a.wav", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("nanoasr: error: ")


def test_output_name_collision_is_a_usage_error(tmp_path, capsys):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "same.wav").write_bytes(b"")
    same = [str(tmp_path / "x" / "same.wav"), str(tmp_path / "y" / "same.wav")]
    assert cli.main([*same, "-o", str(tmp_path)]) == 2
    assert "would both write" in capsys.readouterr().err


class FakeModel:
    """Stands in for Model: records how the CLI loads it and calls transcribe."""

    def __init__(self):
        self.loads, self.calls = [], []

    def load(self, model, device, threads, llm, activations, huge_pages):
        self.loads.append(dict(model=model, device=device, threads=threads, llm=llm, activations=activations,
                               huge_pages=huge_pages))
        return self

    def check_options(self, language=None, word_timestamps=False):
        """Accepts every language and word timestamps."""

    def compile_beside(self):
        return False

    def transcribe(self, audio, **kwargs):
        from nanoasr.transcript import Segment, Transcript

        assert isinstance(audio, DecodedAudio)  # decoded once, by the command, and handed over as it is
        kwargs.pop("on_segment")(Segment(0.0, 0.5, "hi", "stop"))
        assert kwargs.pop("on_partial") is None  # partial text feeds only a progress bar on a terminal
        self.calls.append(kwargs)
        return Transcript("hi", (Segment(0.0, 0.5, "hi", "stop"),), None, audio.duration_s, {})


@pytest.fixture
def fake(monkeypatch):
    from nanoasr import api

    model = FakeModel()
    monkeypatch.setattr(api, "Model", model)
    return model


def test_every_transcription_option_reaches_the_model(tmp_path, fake, capsys):
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), SR)
    hotwords = tmp_path / "hotwords.txt"
    hotwords.write_text("# names\nAlice\n\n  Bob  \n", encoding="utf-8")
    code = cli.main([str(tmp_path / "a.wav"), "--model", "some/repo@abc", "--llm", "q.gguf",
                     "--device", "cpu", "--threads", "3", "--activations", "int8", "--language", "English",
                     "--no-itn", "--huge-pages",
                     "--hotword", "Carol", "--hotword", "Dave",
                     "--hotwords-file", str(hotwords), "--context", "a meeting",
                     "--reference", "transformers", "--max-new-tokens", "7", "--vad", "silero"])
    assert code == 0 and capsys.readouterr().out == "hi\n"
    assert fake.loads == [dict(model="some/repo@abc", device="cpu", threads=3, llm="q.gguf",
                               activations="int8", huge_pages=True)]
    assert fake.calls == [dict(language="English", itn=False,
                               hotwords=("Carol", "Dave", "Alice", "Bob"), context="a meeting",
                               reference="transformers", max_new_tokens=7, word_timestamps=False,
                               vad="silero")]


def test_defaults_reach_the_model(tmp_path, fake, capsys):
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), SR)
    assert cli.main([str(tmp_path / "a.wav"), str(tmp_path / "a.wav"), "--itn"]) == 0
    assert fake.loads == [dict(model=None, device="cpu", threads=None, llm=None,
                               activations="auto", huge_pages=False)]  # loaded once for all
    assert fake.calls == 2 * [dict(language=None, itn=True, hotwords=(), context=None,
                                   reference="funasr", max_new_tokens=None, word_timestamps=False,
                                   vad="energy")]
    assert capsys.readouterr().out == "hi\nhi\n"


def test_a_process_that_compiles_the_kernels_says_so_once_unless_quiet(tmp_path, fake, monkeypatch, capsys):
    """The kernels' notice (logged when the first of them compiles, kernels/jit.py) is one stderr line however
    many compile; -q leaves it out; the kernels' logger is put back as it was."""
    from nanoasr.kernels import jit

    transcribe = fake.transcribe

    def compiling(audio, **kwargs):  # two kernels compile in each call
        jit.compiling()
        jit.compiling()
        return transcribe(audio, **kwargs)
    monkeypatch.setattr(fake, "transcribe", compiling)
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), SR)
    before = (list(jit.log.handlers), jit.log.level)
    notice = f"nanoasr: {jit.COMPILING % (jit.COMPILE_S, jit.cache_place().root)}"
    for quiet, shown in ((False, [notice]), (True, [])):
        monkeypatch.setattr(jit, "_compiled", False)
        assert cli.main([str(tmp_path / "a.wav")] * 2 + ["-q"] * quiet) == 0
        assert capsys.readouterr().err.splitlines() == shown
        assert (list(jit.log.handlers), jit.log.level) == before


def test_library_warnings_are_shown_once_through_the_command(caplog):
    from nanoasr.cli import library_warnings

    library, shown = logging.getLogger("nanoasr"), []
    before = (list(library.handlers), library.propagate, library.level)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as elsewhere:
        warnings.simplefilter("always")
        with library_warnings(shown.append):
            logging.getLogger("nanoasr.audio.io").warning("%s: loud", "x.wav")
            api_py = str(Path(cli.__file__).resolve().parents[1] / "api.py")
            warnings.warn_explicit("config derived from tensor shapes", UserWarning, api_py, 1)
            warnings.warn_explicit("not nanoasr's", UserWarning, "/elsewhere/module.py", 1)
    assert shown == ["x.wav: loud", "config derived from tensor shapes"]
    assert [str(w.message) for w in elsewhere] == ["not nanoasr's"]  # left to the handler it had
    assert caplog.records == []  # not passed on to the root logger's handlers as well
    assert (list(library.handlers), library.propagate, library.level) == before


def test_each_input_is_decoded_once_and_its_warning_shown_once(tiny_dir, tmp_path, monkeypatch, capsys):
    """In-process on the tiny model: the model takes the audio the command decoded, the library's truncation
    warning reaches stderr once, named after the input, and the library's loggers are left as they were."""
    from nanoasr.audio import io as audio_io

    wav = tmp_path / "a.wav"
    soundfile.write(wav, speech_like(3.0, seed=7), SR)
    decoded, decode = [], audio_io._decode
    monkeypatch.setattr(audio_io, "_decode",
                        lambda source, *rest: decoded.append(source) or decode(source, *rest))
    loggers = [logging.getLogger(name) for name in ("nanoasr", "nanoasr.api")]
    before = [(list(g.handlers), g.propagate, g.level, g.disabled) for g in loggers]
    assert cli.main([str(wav), "--model", str(tiny_dir), "--max-new-tokens", "1", "-q"]) == 0
    assert decoded == [str(wav)]
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"nanoasr: warning: {wav}: ") and "segments stopped early" in warning
    assert [(list(g.handlers), g.propagate, g.level, g.disabled) for g in loggers] == before


def test_progress_bar_redraws_one_line_and_clears_it():
    stream = io.StringIO()
    progress = transcribe.Progress(stream, bar=True, verbose=False)
    progress.begin(1, 2, "a.wav")
    progress.start(10.0)
    progress.draw(5.0)
    progress.line("nanoasr: error: b.wav: no such file")
    progress.clear()
    text = stream.getvalue()
    assert "\n" not in text.replace("nanoasr: error: b.wav: no such file\n", "")
    assert "[1/2] a.wav |############------------|  50% 00:05/00:10" in text
    assert text.endswith("no such file\n")  # the bar was wiped before the line, nothing drawn after


def test_help_lists_every_option_with_its_default():
    done = run("--help")
    assert done.returncode == 0 and done.stderr == b""
    text = done.stdout.decode()
    options = [a for a in transcribe.build_parser()._actions
               if a.option_strings and a.dest not in ("help", "version")]
    assert len(options) >= 16
    entries = []  # an option's entry starts on a line "  -x, --xx ..." and runs until the next
    for line in text.partition("\n\n")[2].splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries and line.startswith("   "):
            entries[-1] += " " + line.strip()
    for action in options:
        name = max(action.option_strings, key=len)
        (entry,) = [e for e in entries if name in re.findall(r"-{1,2}[a-z][\w-]*", e.strip().split("  ")[0])]
        assert "(default:" in entry, f"{name} lists no default: {entry!r}"
    assert run("--version").stdout.decode().startswith("nanoasr ")


# --- end to end on the tiny checkpoint ------------------------------------------------------------------

def test_all_formats_mixed_good_and_bad_inputs(audio, tiny_dir, tmp_path):
    out = tmp_path / "out"
    hotwords = tmp_path / "hotwords.txt"
    hotwords.write_text("Alice\nBob\n", encoding="utf-8")
    bad = [audio / "bad" / "broken.wav", audio / "bad" / "empty.wav", audio / "missing.wav", audio / "empty"]
    done = run(audio / "audio" / "one.wav", *bad[:2], audio / "audio" / "two.flac", *bad[2:],
               "--model", tiny_dir, "-f", "all", "-o", out, "--language", "en", "--no-itn",
               "--hotword", "Carol", "--hotwords-file", hotwords, "--context", "a test",
               "--reference", "transformers", "--max-new-tokens", "3", "--threads", "1", "--device", "cpu")
    assert done.returncode == 1
    errors = [line for line in messages(done.stderr) if line.startswith("nanoasr: error: ")]
    warnings = [line for line in messages(done.stderr) if line.startswith("nanoasr: warning: ")]
    assert len(errors) == len(bad) and len(messages(done.stderr)) == len(bad) + len(warnings)
    for path in bad:
        assert sum(str(path) in line for line in errors) == 1, (path, errors)
    assert len(lines(done.stdout)) == 2  # the two good inputs' text, one line each, nothing else
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}.{fmt}" for stem in ("one", "two")
                                                           for fmt in ("txt", "json", "srt", "vtt", "tsv"))
    n_cut = n_files_cut = 0
    for stem, duration in (("one", 7.0), ("two", 4.0)):
        doc = json.loads((out / f"{stem}.json").read_text(encoding="utf-8"))
        check_json(doc, duration)
        assert doc["source"] == str(audio / "audio" / f"{stem}{'.wav' if stem == 'one' else '.flac'}")
        assert all(len(s["token_ids"]) <= 3 for s in doc["segments"])
        cues = expected_cues(doc)
        assert cues, "speech-like audio gives at least one segment with text"
        assert_same_cues(parse_srt((out / f"{stem}.srt").read_text(encoding="utf-8")), cues)
        assert_same_cues(parse_vtt((out / f"{stem}.vtt").read_text(encoding="utf-8")), cues)
        assert_same_cues(parse_tsv((out / f"{stem}.tsv").read_text(encoding="utf-8")), cues)
        assert (out / f"{stem}.txt").read_text(encoding="utf-8").splitlines() == [c[2] for c in cues]
        cut = sum(s["truncated"] for s in doc["segments"])
        told = [w for w in warnings if w.startswith(f"nanoasr: warning: {doc['source']}: ")]
        assert len(told) == (cut > 0), told  # the library's warning for this input, shown once
        if cut:
            assert told[0].startswith(f"nanoasr: warning: {doc['source']}: {cut} of {len(doc['segments'])} "
                                      "segments stopped early") and "finish_reason" in told[0]
        n_cut += cut
        n_files_cut += cut > 0
    assert n_cut > 0 and len(warnings) == n_files_cut


def test_stdin_directories_recursive_and_json_lines(audio, tiny_dir, tmp_path):
    two = (audio / "audio" / "two.flac").read_bytes()
    done = run("-", audio / "audio", "--model", tiny_dir, "-f", "json", stdin=two)
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in lines(done.stdout)]
    assert [d["source"] for d in docs] == ["<stdin>", str(audio / "audio" / "one.wav"),
                                           str(audio / "audio" / "two.flac")]  # sorted, no subdir, no .hidden
    check_json(docs[0], 4.0)
    assert docs[0]["segments"] == docs[2]["segments"] and docs[0]["text"] == docs[2]["text"]  # deterministic
    assert all(line.startswith("nanoasr: warning: ") for line in messages(done.stderr))  # no progress, piped

    out = tmp_path / "out"
    done = run("-", audio / "audio", "--recursive", "--model", tiny_dir, "-f", "json,srt", "-o", out,
               stdin=two)
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(f"{stem}.{fmt}" for stem in ("stdin", "one", "two", "sub/three")
                             for fmt in ("json", "srt"))
    assert len(lines(done.stdout)) == 4
    doc = json.loads((out / "sub" / "three.json").read_text(encoding="utf-8"))
    check_json(doc, 3.0)
    assert_same_cues(parse_srt((out / "sub" / "three.srt").read_text(encoding="utf-8")), expected_cues(doc))


def test_skip_existing_and_overwrite(audio, tiny_dir, tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    for stem in ("one", "two", "sub/three"):
        for fmt in ("txt", "srt"):
            (out / f"{stem}.{fmt}").write_text("kept\n")
    (out / "two.srt").unlink()
    done = run(audio / "audio", "-r", "--model", tiny_dir, "-f", "txt,srt", "-o", out, "--skip-existing",
               "-v")
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert err.count("skipped, its outputs exist") == 2 and "model loaded" in err
    assert re.search(r"^\[\d\d:\d\d --> \d\d:\d\d\] ", err, re.M)  # --verbose logs each segment
    assert (out / "one.txt").read_text() == "kept\n" and (out / "sub" / "three.srt").read_text() == "kept\n"
    assert (out / "two.txt").read_text() != "kept\n"  # an input that is transcribed replaces its files
    parse_srt((out / "two.srt").read_text(encoding="utf-8"))
    assert len(lines(done.stdout)) == 1

    # Nothing left to do: the model is not even loaded, so a model that does not exist is no error.
    done = run(audio / "audio", "-r", "--model", tmp_path / "no-model", "-f", "txt,srt", "-o", out,
               "--skip-existing")
    assert done.returncode == 0 and done.stdout == b"" and done.stderr == b""


def test_model_that_does_not_load_exits_1_with_one_line(audio, tmp_path):
    done = run(audio / "audio" / "one.wav", "--model", tmp_path / "no-model")
    assert done.returncode == 1 and done.stdout == b""
    (line,) = lines(done.stderr)
    assert line.startswith("nanoasr: error: ") and str(tmp_path / "no-model") in line


def test_progress_bar_on_a_terminal(audio, tiny_dir):
    master, slave = pty.openpty()
    try:
        done = run(audio / "audio" / "one.wav", audio / "audio" / "two.flac", "--model", tiny_dir,
                   "--max-new-tokens", "2", stderr=slave)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    err = b"".join(chunks).decode("utf-8", "replace")
    assert done.returncode == 0
    assert "[1/2] " in err and "[2/2] " in err and "\r\x1b[K" in err and "100%" in err
    assert len(lines(done.stdout)) == 2


# --- the README's library example, with the tiny checkpoint in place of the official one -----------------
# (tests/test_docs.py runs the README's shell commands)

def test_readme_library_example(tiny_dir, tmp_path):
    soundfile.write(tmp_path / "meeting.mp3", speech_like(4.0, seed=31), SR)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (python,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert "nanoasr.load_model()" in python
    code = python.replace("nanoasr.load_model()", f"nanoasr.load_model({str(tiny_dir)!r})")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    parse_srt((tmp_path / "meeting.srt").read_text(encoding="utf-8"))
