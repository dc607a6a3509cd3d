"""nanoasr.ray and `nanoasr batch` on a local Ray runtime of 2 CPUs, started once for the module (the CLI runs
join it with --ray-address), with the tiny checkpoint and a few synthesized clips.

What the main command writes for the same inputs is the reference: the same files, token ids included.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import ray
import soundfile

from nanoasr.api import Model
from nanoasr.errors import OptionError
from nanoasr.ray import row_schema, to_transcript, transcribe_dataset
from tools.lib.synth import speech_like

ROOT = Path(__file__).resolve().parents[1]
SR = 16000
CORRUPT = b"RIFF\x10\x00\x00\x00WAVEfmt garbage"
SLOW = ("--max-new-tokens", "400")  # the random model never stops by itself: the repetition guard ends a clip


@pytest.fixture(scope="module")
def cluster() -> str:
    """The address of a local Ray runtime with 2 CPUs whose workers import this checkout's nanoasr."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT)  # the runtime's processes, and the workers they start, inherit it
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    """clips/{clip0..clip4.wav (1.5 to 3.5 s), sub/deep.flac, corrupt.wav}."""
    root = tmp_path_factory.mktemp("ray") / "clips"
    (root / "sub").mkdir(parents=True)
    for i in range(5):
        soundfile.write(root / f"clip{i}.wav", speech_like(1.5 + i % 3, seed=40 + i), SR)
    soundfile.write(root / "sub" / "deep.flac", speech_like(2.0, seed=45), SR)
    (root / "corrupt.wav").write_bytes(CORRUPT)
    return root


MANY = 12  # clips for the runs that are stopped or lose a worker on the way


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """MANY clips of 1 s, for the runs that are stopped or lose a worker on the way."""
    root = tmp_path_factory.mktemp("ray") / "many"
    root.mkdir()
    for i in range(MANY):
        soundfile.write(root / f"m{i:02d}.wav", speech_like(1.0, seed=60 + i), SR)
    return root


def env() -> dict:
    """This process's environment (after ray.init, which sets how to authenticate to its runtime), with
    this checkout's nanoasr first."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


def nanoasr(*args) -> subprocess.Popen:
    """`nanoasr ARGS` with Ctrl-C's default handling: a suite started in the background (`cmd &`) runs with
    SIGINT ignored, which its children would inherit, and a stopped run would then never stop."""
    return subprocess.Popen([sys.executable, "-m", "nanoasr", *map(str, args)], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=300)
    return process.returncode, err.decode()


def manifest_of(out: Path) -> list[dict]:
    path = out / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def wait_for_lines(out: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while len(manifest_of(out)) < count:
        assert process.poll() is None, finish(process)[1]
        assert time.monotonic() < deadline, "no manifest lines"
        time.sleep(0.02)


def title(process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # it ended since it was listed
        return ""


def same_except_timings(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "timings"} == {k: v for k, v in b.items() if k != "timings"}


# --- without Ray -------------------------------------------------------------------------------------------

def test_ray_is_imported_only_for_a_dataset():
    code = ("import sys, nanoasr, nanoasr.cli, nanoasr.ray, nanoasr.cli.batch\n"
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


def test_missing_extra_is_named_with_its_install_command(tmp_path):
    (tmp_path / "a.wav").write_bytes(CORRUPT)
    code = ("import sys\nsys.modules['ray'] = None  # as if Ray were not installed\n"
            "from nanoasr.ray import transcribe_dataset\n"
            "try:\n    transcribe_dataset(None)\nexcept ImportError as exc:\n    print(exc)\n"
            "from nanoasr.cli import main\n"
            f"sys.exit(main(['batch', {str(tmp_path / 'a.wav')!r}, '-o', {str(tmp_path / 'out')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, timeout=120)
    hint = 'pip install ".[ray]" in the nanoasr checkout'
    assert hint in done.stdout.decode()
    assert done.returncode == 1 and hint in done.stderr.decode()


def test_batch_usage_errors(tmp_path):
    for args, message in [(["-", "-o", tmp_path], "stdin"), (["x.wav"], "-o/--output-dir"),
                          (["x.wav", "-o", tmp_path, "--workers", "0"], "--workers"),
                          (["x.wav", "-o", tmp_path, "-f", "doc"], "--output-format")]:
        code, err = finish(nanoasr("batch", *args))
        assert code == 2 and message in err, (args, err)
    code, err = finish(nanoasr("batch", "x.wav", "-o", tmp_path, "--language", "klingon"))
    assert code == 2 and err.startswith("nanoasr batch: error: ") and "klingon" in err


def test_a_missing_input_is_an_error_line_without_starting_ray(tmp_path):
    code, err = finish(nanoasr("batch", tmp_path / "gone.wav", "-o", tmp_path / "out"))
    assert code == 1, err
    assert err.splitlines()[0] == f"nanoasr batch: error: {tmp_path / 'gone.wav'}: no such readable file"
    assert len(err.splitlines()) == 2 and "0 transcribed, 1 failed, 0 done before" in err  # nothing from Ray
    (line,) = manifest_of(tmp_path / "out")
    assert line["path"] == str(tmp_path / "gone.wav") and line["status"] == "error"


def test_manifest_keeps_one_line_per_input_and_drops_a_cut_line(tmp_path):
    from nanoasr.cli.batch import Manifest

    (tmp_path / "a.json").write_text("{}")
    done = {"path": "/in/a.wav", "status": "ok", "outputs": ["a.json"]}
    failed = {"path": "/in/b.wav", "status": "error", "outputs": []}
    missing = {"path": "/in/c.wav", "status": "ok", "outputs": ["c.json"]}  # its file was deleted since
    text = "".join(json.dumps(line) + "\n" for line in (done, failed, missing)) + '{"path": "/in/d.w'
    (tmp_path / "manifest.jsonl").write_text(text)  # the last line cut short by a killed run
    manifest = Manifest(tmp_path / "manifest.jsonl")
    inputs = [f"/in/{name}.wav" for name in "abcd"]
    assert [manifest.done(key, [tmp_path / f"{Path(key).stem}.json"]) for key in inputs] == [
        True, False, False, False]
    manifest.forget(inputs[1:])
    assert (tmp_path / "manifest.jsonl").read_text() == json.dumps(done) + "\n"
    manifest.add("/in/b.wav", "ok", ["b.json"], 1.25, 3.0)
    added = dict(path="/in/b.wav", status="ok", outputs=["b.json"], seconds=1.25, duration_s=3.0, error=None)
    assert manifest_of(tmp_path) == [done, added]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "manifest.jsonl"]


def test_write_whole_leaves_the_old_file_when_interrupted(tmp_path, monkeypatch):
    from nanoasr.cli import batch

    target = tmp_path / "out" / "a.txt"
    batch.write_whole(target, "first\n")
    assert target.read_text() == "first\n"

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(batch.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        batch.write_whole(target, "second\n")
    assert target.read_text() == "first\n" and [p.name for p in target.parent.iterdir()] == ["a.txt"]


# --- the library -------------------------------------------------------------------------------------------

def test_transcribe_dataset_rows_match_model_transcribe(cluster, clips, tiny_dir):
    options = dict(language="en", itn=False, max_new_tokens=24, max_duration_s=3.2)
    audio = ray.data.read_binary_files(str(clips), include_paths=True)  # its reads take a CPU each
    rows = transcribe_dataset(audio, model=tiny_dir, **options)  # the default pool must leave them one
    assert rows.schema().base_schema == row_schema()
    by_name = {Path(row["path"]).name: row for row in rows.take_all()}
    assert set(by_name) == {f"clip{i}.wav" for i in range(5)} | {"deep.flac", "corrupt.wav"}
    reference = Model.load(str(tiny_dir), threads=1)
    del options["max_duration_s"]
    for path in sorted(clips.rglob("clip[0134].wav")) + [clips / "sub" / "deep.flac"]:
        row = by_name[path.name]
        assert row["path"] == str(path) and row["error"] is None
        expected = reference.transcribe(str(path), **options)
        got = to_transcript(row)
        assert got.token_ids and got.language == "en"
        assert dataclasses.replace(got, timings={}) == dataclasses.replace(expected, timings={})
        assert set(got.timings) == set(expected.timings)
    for name, message in [("corrupt.wav", "cannot be decoded"), ("clip2.wav", "3.2 s duration limit")]:
        row = by_name[name]
        assert row["error"].startswith(str(clips / name) + ": ") and message in row["error"]
        assert row["text"] == "" and row["segments"] == [] and row["duration_s"] is None


def test_word_timestamps_come_through_the_rows(tiny_dir, tmp_path):
    """The actor's class called here, in this process: words and the CTC fields survive the row schema."""
    pytest.importorskip("torch")  # the CTC checkpoint is written with it (CI installs it: no skip there)
    import pyarrow as pa

    from nanoasr.ray import Transcriber
    from tools.reference import ctc_branch, funasr_checkpoint

    ctc_dir = ctc_branch.write(funasr_checkpoint.write(tiny_dir, tmp_path / "ctc"))
    clip = tmp_path / "clip.wav"
    soundfile.write(clip, speech_like(7.0, seed=5), SR)
    options = dict(max_new_tokens=4, word_timestamps=True)
    transcriber = Transcriber(dict(model=str(ctc_dir), llm=None, threads=1), options)
    (row,) = transcriber(pa.table({"path": [str(clip)], "bytes": [clip.read_bytes()]})).to_pylist()
    expected = Model.load(str(ctc_dir), threads=1).transcribe(str(clip), **options)
    assert any(segment.words for segment in expected.segments)
    got = to_transcript(row)
    assert dataclasses.replace(got, timings={}) == dataclasses.replace(expected, timings={})
    assert set(got.timings) == set(expected.timings)


def test_transcribe_dataset_checks_its_options_before_running(cluster, clips):
    audio = ray.data.read_binary_files(str(clips), include_paths=True)
    for bad in [dict(langauge="en"), dict(language="klingon"), dict(max_new_tokens=0),
                dict(max_duration_s=-1), dict(workers=0), dict(threads_per_worker=1.5)]:
        with pytest.raises(OptionError):
            transcribe_dataset(audio, model="never-loaded", **bad)


# --- the command line --------------------------------------------------------------------------------------

def test_batch_writes_what_the_main_command_writes(cluster, clips, tiny_dir, tmp_path):
    options = ["-r", "-f", "all", "--model", tiny_dir, "--language", "en", "--max-duration", 3.2]
    main = nanoasr(clips, "-o", tmp_path / "main", "--threads", 1, *options)
    code, err = finish(nanoasr("batch", clips, "-o", tmp_path / "batch", "--workers", 2,
                               "--threads-per-worker", 1, "--ray-address", cluster, *options))
    assert code == 1, err
    errors = sorted(line for line in err.splitlines() if line.startswith("nanoasr batch: error: "))
    assert len(errors) == 2, err
    assert errors[0].startswith(f"nanoasr batch: error: {clips / 'clip2.wav'}: the audio is 3.5 s long")
    assert errors[1].startswith(f"nanoasr batch: error: {clips / 'corrupt.wav'}: cannot be decoded")
    assert finish(main)[0] == 1
    expected = sorted(p.relative_to(tmp_path / "main") for p in (tmp_path / "main").rglob("*.*"))
    got = sorted(p.relative_to(tmp_path / "batch") for p in (tmp_path / "batch").rglob("*.*"))
    assert got == sorted(expected + [Path("manifest.jsonl")]) and len(expected) == 5 * 5
    for name in expected:
        main_text, batch_text = ((tmp_path / side / name).read_text() for side in ("main", "batch"))
        if name.suffix == ".json":
            assert same_except_timings(json.loads(main_text), json.loads(batch_text)), name
            assert json.loads(batch_text)["segments"][0]["token_ids"], name
        else:
            assert main_text == batch_text, name
    lines = {line["path"]: line for line in manifest_of(tmp_path / "batch")}
    assert len(lines) == len(manifest_of(tmp_path / "batch")) == 7
    assert set(lines) == {str(p) for p in clips.rglob("*.*")}
    for name, message in zip(["clip2.wav", "corrupt.wav"], errors):
        line = lines.pop(str(clips / name))
        assert line["status"] == "error" and line["outputs"] == []
        assert line["error"] == message.removeprefix("nanoasr batch: error: ")
    for path, line in lines.items():
        stem = Path(path).relative_to(clips).with_suffix("")
        assert line["status"] == "ok" and line["error"] is None and line["duration_s"] > 1
        assert line["outputs"] == [f"{stem.as_posix()}.{fmt}" for fmt in ("txt", "json", "srt", "vtt", "tsv")]


def test_names_ray_cannot_carry_are_error_rows_and_the_rest_is_done(cluster, many, tiny_dir, tmp_path):
    """Issue 39, item 6: a tab, newline or non-UTF-8 byte in one input's name aborted the whole run (Ray drops
    the first from a path and Arrow cannot hold the last), and a non-UTF-8 name on the command line made
    ray.init fail with a UnicodeEncodeError traceback."""
    names = [b"new\nline.wav", b"tab\there.wav", b"bad\xffbyte.wav"]
    hostile = [tmp_path / os.fsdecode(name) for name in names]
    for path in hostile:
        path.write_bytes((many / "m00.wav").read_bytes())
    out = tmp_path / "out"
    code, err = finish(nanoasr("batch", many / "m01.wav", *hostile, "-o", out, "-f", "json", "--model",
                               tiny_dir, "--workers", 1, "--max-new-tokens", 2, "--ray-address", cluster,
                               "-q"))
    assert code == 1 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("nanoasr batch: error: ")]
    assert len(errors) == 3, err
    assert all("rename it, or transcribe it with `nanoasr FILE`" in line for line in errors), err
    lines = {line["path"]: line for line in manifest_of(out)}
    assert lines[str(many / "m01.wav")]["status"] == "ok" and (out / "m01.json").is_file()
    assert all(lines[str(path)]["status"] == "error" for path in hostile)


def test_a_model_that_does_not_load_fails_the_job_with_one_line(cluster, many, tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    code, err = finish(nanoasr("batch", many / "m00.wav", "-o", tmp_path / "out", "--model", missing,
                               "--workers", 1, "--ray-address", cluster, "-q"))
    assert code == 1, err
    (line,) = err.splitlines()
    assert line.startswith("nanoasr batch: error: the Ray job failed: ") and str(missing) in line, err
    assert line.endswith(f"(Ray's log: {tmp_path / 'out' / 'ray.log'})"), err
    assert manifest_of(tmp_path / "out") == []


def test_batch_resumes_a_stopped_run(cluster, many, tiny_dir, tmp_path):
    out = tmp_path / "out"
    command = ["batch", many, "-o", out, "-f", "json", "--model", tiny_dir, "--workers", 2, *SLOW,
               "--ray-address", cluster]
    first = nanoasr(*command)
    wait_for_lines(out, 2, first)
    first.send_signal(signal.SIGINT)  # Ctrl-C
    code, err = finish(first)
    assert code == 130, err
    done = manifest_of(out)
    assert 2 <= len(done) < MANY, "the run was not stopped halfway"
    assert not list(out.glob(".*")), "a partial file was left behind"
    written = {}
    for line in done:
        assert line["status"] == "ok"
        (output,) = line["outputs"]
        json.loads((out / output).read_text())  # whole
        written[output] = (out / output).stat().st_mtime_ns
    assert len(list(out.glob("*.json"))) == len(done)

    code, err = finish(nanoasr(*command))
    assert code == 0, err
    assert f"{MANY - len(done)} transcribed, 0 failed, {len(done)} done before" in err
    lines = manifest_of(out)
    assert sorted(line["path"] for line in lines) == sorted(str(p) for p in many.iterdir())
    assert lines[:len(done)] == done
    assert {name: (out / name).stat().st_mtime_ns for name in written} == written, "an input was done twice"


def test_batch_survives_a_killed_worker(cluster, many, tiny_dir, tmp_path):
    out = tmp_path / "out"
    run = nanoasr("batch", many, "-o", out, "-f", "json", "--model", tiny_dir, "--workers", 2, *SLOW,
                  "--ray-address", cluster)
    wait_for_lines(out, 1, run)
    actors = [p for p in psutil.Process().children(recursive=True)  # the other may not have started yet
              if "MapBatches(Transcriber)" in title(p)]
    assert actors, "no actor process found"
    actors[0].kill()
    assert len(manifest_of(out)) < MANY, "the run ended before a worker was killed"
    code, err = finish(run)
    assert code == 0, err
    lines = manifest_of(out)
    assert sorted(line["path"] for line in lines) == sorted(str(p) for p in many.iterdir())
    assert all(line["status"] == "ok" for line in lines)
    for line in lines:
        json.loads((out / line["outputs"][0]).read_text())


def test_quiet_batch_prints_its_error_lines_alone(cluster, clips, tiny_dir, tmp_path):
    code, err = finish(nanoasr("batch", clips, "-r", "-q", "-o", tmp_path, "--model", tiny_dir,
                               "--max-duration", 3.2, "--workers", 1, "--threads-per-worker", 1,
                               "--ray-address", cluster))
    lines = err.splitlines()
    assert code == 1 and len(lines) == 2, err  # clip2.wav too long, corrupt.wav: nothing else from Ray
    assert all(line.startswith("nanoasr batch: error: ") for line in lines), err
    # what Ray's C++ core writes to the process's stderr itself (an actor whose constructor arguments are in
    # the object store, as Ray Data's are) is kept in the log
    assert "core_worker.cc" in (tmp_path / "ray.log").read_text(), err
