"""A newcomer's first hour: mistakes said before any model is loaded or downloaded, one line per failure, a
default model set once, and commands that end cleanly when their reader goes away."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
import test_hub
from test_hub import GGUF_OLD

from nanoasr import cli, hub
from nanoasr.cli import doctor
from nanoasr.errors import ModelError
from nanoasr.transcript import Segment, Transcript
from tools.lib.synth import speech_like

fake_hub, hf_env = test_hub.fake_hub, test_hub.hf_env  # bound here, however pytest collects test_hub
ROOT = Path(__file__).resolve().parents[1]
NANO, MLT = "fun-asr-nano-2512", "fun-asr-mlt-nano-2512"


@pytest.fixture(autouse=True)
def no_default_model(tmp_path, monkeypatch):
    """Neither the user's NANOASR_MODEL nor their config file reaches these tests."""
    monkeypatch.delenv(hub.MODEL_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def no_load(monkeypatch):
    """Model.load fails the test: what these commands check comes before it."""
    from nanoasr import api

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(api.Model, "load", load)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- before the model ------------------------------------------------------------------------------------

def test_a_missing_input_is_said_without_loading_or_fetching_a_model(hf_env, fake_hub, no_load, capsys):
    code, out, err = run(capsys, "nosuch.wav")
    assert (code, out, err) == (1, "", "nanoasr: error: nosuch.wav: no such file\n")
    assert run(capsys, "nosuch.wav", "--model", "q8") == (code, out, err)  # the same with --model
    assert not fake_hub.requests


def test_an_unwritable_output_folder_is_said_before_the_model(tmp_path, no_load, capsys):
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), 16000)
    (tmp_path / "taken").write_text("a file where the folder would go")
    code, out, err = run(capsys, tmp_path / "a.wav", "-o", tmp_path / "taken" / "out")
    assert code == 1 and not out and err.startswith(f"nanoasr: error: -o {tmp_path / 'taken' / 'out'}: "
                                                    "cannot create the folder")
    assert err.count("\n") == 1


@pytest.mark.parametrize("language, message", [
    ("ko", "language 'ko' (ko): the model was not trained for it; its languages are zh, en, ja "
           "(Fun-ASR-MLT-Nano-2512 has 31)"),
    ("englsh", "unknown language 'englsh' (did you mean 'english'?); accepted: ISO codes, English or Chinese "
               "names of zh, en, ja, or auto"),
])
def test_a_language_the_default_model_lacks_is_a_usage_error_before_the_load(
        hf_env, fake_hub, no_load, tmp_path, capsys, language, message):
    code, out, err = run(capsys, tmp_path / "a.wav", "--language", language)
    assert (code, out, err) == (2, "", f"nanoasr: error: {message}\n")
    assert not fake_hub.requests


def test_a_language_found_wrong_only_after_the_load_is_a_usage_error_too(tiny_dir, tmp_path, capsys):
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), 16000)
    code, out, err = run(capsys, tmp_path / "a.wav", "--model", tiny_dir, "--language", "ko")  # no name
    assert code == 2 and not out and err.startswith("nanoasr: error: language 'ko' (ko)")


def test_the_variant_comes_from_the_package_or_the_name(hf_env, tmp_path):
    assert hub.variant_of("mlt") == MLT and hub.variant_of("q8") == "fun-asr-nano-2512"
    assert hub.variant_of("FunAudioLLM/Fun-ASR-MLT-Nano-2512") == MLT  # a repo no package describes
    assert hub.variant_of("test/other") is None
    named = tmp_path / "Fun-ASR-Nano-2512-GGUF" / "model-q8_0.gguf"
    assert hub.variant_of(str(named)) == NANO
    assert hub.variant_of(str(tmp_path / "fun-asr-mlt-nano-q4_k_m.gguf")) == MLT
    assert hub.variant_of(str(tmp_path / "mine.gguf")) is None


def test_batch_checks_the_language_before_ray(hf_env, fake_hub, tmp_path, capsys):
    code, out, err = run(capsys, "batch", tmp_path, "-o", tmp_path / "out", "--model", "q8",
                         "--language", "ko")
    assert code == 2 and err.startswith("nanoasr batch: error: language 'ko' (ko)") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_safetensors_file_asks_for_its_folder(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match=f"give the folder \\({tmp_path}\\), not a file in it"):
        hub.resolve(str(tmp_path / "model.safetensors"))


# --- the default model -----------------------------------------------------------------------------------

def test_the_default_model_from_the_environment_or_the_config_file(tiny_dir, tmp_path, monkeypatch):
    config = tmp_path / "config" / "nanoasr" / "config.toml"
    assert hub.config_file() == config and hub.default_model() is None
    config.parent.mkdir(parents=True)
    config.write_text(f'model = "{tiny_dir}"\n', encoding="utf-8")
    assert hub.resolve(offline=True).path == tiny_dir
    monkeypatch.setenv(hub.MODEL_VARIABLE, "q8")  # the variable before the file
    assert hub.default_model() == "q8"
    monkeypatch.setenv(hub.MODEL_VARIABLE, str(tiny_dir / "nowhere"))
    with pytest.raises(ModelError, match="no such model directory"):
        hub.resolve()


def test_load_model_takes_the_default_model(tiny_dir, monkeypatch):
    import nanoasr

    monkeypatch.setenv(hub.MODEL_VARIABLE, str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the default package would not be fetched either
    assert nanoasr.load_model().checkpoint.source.get("repo") is None  # the local folder, not a download


@pytest.mark.parametrize("text, message", [("model = [", "cannot read it as TOML"),
                                           ("model = 3", "model must be a non-empty string")])
def test_a_broken_config_file_is_one_line_naming_it(tmp_path, capsys, text, message):
    config = tmp_path / "config" / "nanoasr" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(text, encoding="utf-8")
    with pytest.raises(ModelError, match=message):
        hub.default_model()
    code, _, err = run(capsys, tmp_path / "a.wav", "--language", "en")
    assert code == 1 and err.startswith(f"nanoasr: error: {config}: ") and err.count("\n") == 1


# --- noise -----------------------------------------------------------------------------------------------

def test_the_hub_retry_warnings_give_way_to_one_line(hf_env, fake_hub, monkeypatch):
    import huggingface_hub
    from huggingface_hub import errors

    retries = logging.getLogger("huggingface_hub.utils._http")

    def unreachable(*args, **kwargs):
        retries.warning("Retrying in 1s [Retry 1/5].")
        raise errors.LocalEntryNotFoundError("cannot reach the hub")

    shown = []
    handler = logging.Handler()
    handler.emit = shown.append
    retries.addHandler(handler)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    try:
        with pytest.raises(ModelError) as err:
            hub.resolve("q8", progress=False)
    finally:
        retries.removeHandler(handler)
    level = logging.getLogger("huggingface_hub").level
    assert not shown and level != logging.CRITICAL  # silenced for the fetch alone
    assert "check the network (or HF_ENDPOINT), then: python -m nanoasr models download q8" in str(err.value)
    with pytest.raises(ModelError, match=r"check the network \(or HF_ENDPOINT\), then run this again$"):
        hub.download("q8", progress=False)


def test_doctor_does_not_claim_offline_mode(hf_env, fake_hub, capsys):
    code, out, _ = run(capsys, "doctor", "--model", "q8")
    assert code == 0 and "is not downloaded: missing m-q8_0.gguf" in out and "HF_HUB_OFFLINE)" not in out


def test_doctor_reads_a_gguf_files_quant_and_license(tiny_dir, tmp_path):
    from nanoasr import convert
    from nanoasr.checkpoints.load import load_checkpoint

    path = tmp_path / "q8.gguf"
    convert.write(path, load_checkpoint(tiny_dir), "q8_0", report=False, progress=None)
    found = doctor.model(str(path))
    assert found["resolved"] and found["quant"] == "q8_0" and found["package"] is None
    assert found["license"] == hub.default_package().license


def test_models_list_shows_every_package_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code, out, _ = run(capsys, "models", "list")
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:] if line.startswith("fun_asr")}
    assert code == 0 and len(rows) == len(hub.list_packages()) and "?" not in rows.values()
    assert rows[hub.default_package().name] == "~1.60"  # GB: the BF16 safetensors


def test_the_budget_hint_is_not_shown_to_who_set_the_budget(tiny_model, caplog):
    audio = speech_like(4.0, seed=2)
    with caplog.at_level(logging.WARNING, logger="nanoasr"):
        tiny_model.transcribe(audio, sample_rate=16000, max_new_tokens=2)
    (record,) = [r for r in caplog.records if "stopped early" in r.getMessage()]
    assert "at the token budget" in record.getMessage() and "max_new_tokens" not in record.getMessage()


@pytest.mark.parametrize("command, required", [("convert", "the .gguf file to write"),
                                               ("batch", "manifest.jsonl go, created if missing")])
def test_required_options_show_no_default(capsys, command, required):
    code, out, _ = run(capsys, command, "--help")
    text = " ".join(out.split())
    assert code == 0 and required in text and f"{required} (default" not in text
    assert "(default: None)" not in text


def test_serve_help_names_the_default_model_once(capsys):
    code, out, _ = run(capsys, "serve", "--help")
    text = " ".join(out.split())
    assert code == 0 and "(default: $NANOASR_MODEL or the config file's model, else the default package)" \
        in text
    assert "(default: None)" not in text and "package) (default" not in text


# --- small breakages -------------------------------------------------------------------------------------

def test_writing_into_a_missing_folder_creates_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Transcript("hi", (Segment(0.0, 1.0, "hi", "stop"),), "en", 1.0, {}).write("out/talk.vtt")
    assert (tmp_path / "out" / "talk.vtt").read_text(encoding="utf-8").startswith("WEBVTT")


class ClosedPipe:
    """A stdout whose reader is gone."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_a_closed_stdout_stops_transcribing(tmp_path, monkeypatch, capsys):
    from nanoasr import api
    from test_cli import FakeModel

    fake = FakeModel()
    monkeypatch.setattr(api, "Model", fake)
    soundfile.write(tmp_path / "a.wav", speech_like(1.0), 16000)
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main([str(tmp_path / "a.wav")] * 3) == cli.EXIT_BROKEN_PIPE
    assert len(fake.calls) == 1 and capsys.readouterr().err == ""  # no more work, and no traceback


def test_models_list_into_a_closed_pipe_ends_without_a_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_CACHE=str(tmp_path / "hub"))
    process = subprocess.Popen([sys.executable, "-m", "nanoasr", "models", "list", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # `| head` that has read all it wants
    err = process.stderr.read()
    assert process.wait(timeout=120) == cli.EXIT_BROKEN_PIPE and err == b""


def test_a_download_is_announced_with_its_size(hf_env, fake_hub, capsys):
    hub.resolve("q8")
    assert capsys.readouterr().err.startswith(f"nanoasr: downloading q8 (test/gguf@{test_hub.OLD[:12]}, "
                                              f"{len(GGUF_OLD)} bytes) to ")
    hub.resolve("q8")
    assert capsys.readouterr().err == ""  # here already: nothing to say
