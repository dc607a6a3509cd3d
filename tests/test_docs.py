"""A newcomer's walk through README.md and docs/*.md: every shell command in their code blocks runs as
written, one document at a time in a fresh folder, and exits 0 (or the status the text shows).

What stands in for the reader's world:
- the model: every model a command names (`--model` with a package name, a hub id or a folder the reader
  would have downloaded, or the source of `nanoasr convert`) is the tiny checkpoint of tests/fixtures, unless
  the name is a file an earlier command of the same document wrote (a GGUF it converted); a transcription
  without `--model` gets `--model` the tiny checkpoint, the documented way to choose a model;
- the audio: every audio file a command names is a few seconds of speech-like audio in that format, and
  `recordings/` a folder of them; `missing.wav` stays missing and `notes.txt` is text, as the text says;
- the machine: no network (HF_HUB_OFFLINE=1, an empty Hugging Face cache), `python` and `nanoasr` run this
  checkout, and the console scripts of this Python (gguf-dump) are on the PATH.

It runs in the ordinary test run, CI's included. Commands that need the network, a GPU, the full-size model,
a running server or a tool that is no dependency are listed in SKIPPED with the reason; every other command
runs, so a new command in the docs is either walked or given a reason here.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = {"python", "nanoasr", "pip", "cat", "ffmpeg", "gguf-dump", "curl", "ray", "modelscope",
            "tools/gpu_check.sh"}
AUDIO = re.compile(r"[\w.-]+\.(?:wav|mp3|flac|m4a|mkv|mp4)\b")

SKIPPED = [  # (pattern searched in the command, why it is not run)
    (r"^pip install \. && ", "installs this checkout into the environment, which the test run already has"),
    (r"^pip install", "installs packages from the index (.ci/run runs the README's install and tests)"),
    (r"\[(?:options|--|AUDIO|NAME)|\{f32|^python tools/convert_gguf\.py SRC|\.\.\.$|serve \.\.\.",
     "a synopsis with placeholders, not a command"),
    (r"nanoasr serve|^curl ", "a server that runs until stopped, and requests to it "
                              "(tests/test_server_live.py runs the server and the openai client against it)"),
    (r"nanoasr batch|^ray job submit", "starts a Ray runtime or needs a cluster "
                                       "(tests/test_ray.py runs `nanoasr batch` on the tiny model)"),
    (r"--device cuda|^tools/gpu_check\.sh", "needs an NVIDIA GPU"),
    (r"--word-timestamps", "needs FunASR's model.pt with its CTC branch, which the tiny checkpoint has not "
                           "(tests/test_timestamps.py covers word timestamps on a random CTC branch)"),
    (r"^modelscope ", "downloads from ModelScope"),
    (r"models download", "downloads a package (tests/test_hub.py runs downloads against a local fake hub)"),
    (r"\| jq ", "jq is not a dependency"),
    (r"stream --mic", "records from a microphone "
                      "(tests/test_cli_stream.py runs it on a stand-in sounddevice)"),
    (r"^python tools/bench/bench\.py --model",
     "times the full-size model against Transformers and llama.cpp"),
    (r"^python tools/bench/bench_realtime\.py", "streams simulated speakers for minutes "
                                                "(tests/test_bench_realtime.py checks its bookkeeping)"),
]
EXIT_STATUS = {"python -m nanoasr good.wav missing.wav notes.txt": 1}  # the text shows a failing run
NEEDS_FFMPEG = re.compile(r"\.(?:m4a|mkv|mp4)\b|^ffmpeg ")
MODEL_COMMANDS = ("models", "convert", "doctor", "serve", "batch")


def code_blocks(text: str):
    """(language, lines) of each fenced block and each indented block after a blank line."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)", lines[i])
        if fence:
            j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("```")), len(lines))
            yield fence.group(1), lines[i + 1:j]
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            yield "indented", [line[4:] for line in lines[i:j]]
            i = j
        else:
            i += 1


def shell_commands(path: Path) -> list[str]:
    """The commands of a document's shell blocks: continuation lines joined, comments and output left out."""
    commands = []
    for language, lines in code_blocks(path.read_text()):
        if language not in ("", "sh", "bash", "shell", "console", "indented"):
            continue
        joined, current = [], ""
        for line in lines:
            current = f"{current} {line.strip()}" if current else line.strip()
            if current.endswith("\\"):
                current = current[:-1].rstrip()
                continue
            joined.append(current)
            current = ""
        for command in joined:
            command = re.sub(r"^\$ ", "", command)
            words = command.split()
            if re.match(r"^nanoasr( \w+)?: ", command):  # a line of output: "nanoasr models: error: ..."
                continue
            program = words[1] if len(words) > 1 and "=" in words[0] else words[0] if words else ""
            if program in PROGRAMS:
                commands.append(re.sub(r"\s+#\s.*$", "", command))
    return commands


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED if re.search(pattern, command)), None)


def with_tiny_model(command: str, folder: Path, tiny: Path) -> str:
    """The command with the tiny checkpoint for every model it names that an earlier command did not write."""
    def model(value: str) -> str:
        return value if (folder / os.path.expanduser(value)).exists() else str(tiny)

    command = re.sub(r"--model (\S+)", lambda m: f"--model {model(m.group(1))}", command)
    command = re.sub(r"((?:convert_gguf\.py|nanoasr convert) )(\S+)",
                     lambda m: m.group(1) + model(m.group(2)), command)
    parts = command.split(" | ")
    for i, part in enumerate(parts):
        call = re.search(r"(?:^|\s)(?:python -m )?nanoasr(?=\s|$)", part)
        rest = part[call.end():].split() if call else []
        if call and "--model" not in part and rest and rest[0] == "stream":  # its own --model
            at = part.index("stream", call.end()) + len("stream")
            parts[i] = f"{part[:at]} --model {tiny}{part[at:]}"
        elif call and "--model" not in part and not (rest and rest[0] in MODEL_COMMANDS):
            parts[i] = f"{part[:call.end()]} --model {tiny}{part[call.end():]}"
    return " | ".join(parts)


def make_inputs(command: str, folder: Path) -> None:
    """The audio files the command names, a recordings/ tree and the text files the docs use."""
    import soundfile

    from tools.lib.synth import speech_like

    wave = speech_like(2, seed=1)
    for name in set(AUDIO.findall(command)) - {"missing.wav"}:
        path = folder / name
        if path.exists():
            continue
        if path.suffix in (".m4a", ".mkv", ".mp4"):
            soundfile.write(folder / "source.wav", wave, 16000)
            subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(folder / "source.wav"),
                            str(path)], check=True)
        else:
            soundfile.write(path, wave, 16000)
    for name in ("recordings/a.wav", "recordings/day2/b.flac"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if not (folder / name).exists():
            soundfile.write(folder / name, wave, 16000)
    (folder / "team-names.txt").write_text("Kubernetes\nZhang Wei\n")
    (folder / "notes.txt").write_text("not audio\n")


def environment(tmp_path: Path) -> dict:
    """No network, this checkout's `python` and `nanoasr` first on the PATH, then this Python's scripts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, line in (("python", f'exec "{sys.executable}" "$@"'),
                       ("nanoasr", f'exec "{sys.executable}" -m nanoasr "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT),
               PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]))
    return env


def test_every_command_is_walked_or_skipped_with_a_reason():
    commands = [c for path in DOCS for c in shell_commands(path)]
    assert any(c.startswith("python -m nanoasr meeting.mp3") for c in commands)  # the extraction sees them
    walked = [c for c in commands if skip_reason(c) is None]
    assert len(walked) >= 20, walked


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(line for line in ci.splitlines() if line.startswith("pip install torch=="))
    assert "\npython -m pytest -n 2\n" in ci
    command = f"{install} && python -m pytest -n 2"
    for doc in (ROOT / "README.md", ROOT / "docs" / "development.md"):
        assert command in shell_commands(doc), doc


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_commands_of_a_document_run_as_written(doc, tiny_dir, tmp_path):
    commands = [c for c in shell_commands(doc) if skip_reason(c) is None]
    if not commands:
        return
    folder = tmp_path / "walk"
    folder.mkdir()
    (folder / "tools").symlink_to(ROOT / "tools")
    shutil.copytree(ROOT / "docs", folder / "docs")  # a page the docs regenerate must come out the same
    pages = {page: page.read_text() for page in (folder / "docs").glob("*.md")}
    env = environment(tmp_path)
    left_out, ran = [], set()
    for command in commands:
        if NEEDS_FFMPEG.search(command) and shutil.which("ffmpeg") is None:
            left_out.append(command)
            continue
        make_inputs(command, folder)
        run = with_tiny_model(command, folder, tiny_dir)
        if run in ran:  # commands that differ only in the model they name run once
            continue
        ran.add(run)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", run], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=300)
        expected = EXIT_STATUS.get(command, 0)
        assert done.returncode == expected, f"{doc.name}: {command}\nran: {run}\n{done.stderr[-3000:]}"
    for page, text in pages.items():
        assert page.read_text() == text, f"docs/{page.name} is out of date: run the command it ends with"
    if left_out:
        pytest.skip(f"ffmpeg is not installed; left out: {left_out}")


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_docs_names_a_file_that_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "tools" / "README.md"]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"^[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken
