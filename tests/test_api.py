"""The library surface: what Model.transcribe takes, the Transcript it returns, batches, threads, imports."""
from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

import nanoasr
from nanoasr import Segment, Transcript
from tools.synth import speech_like

ROOT = Path(__file__).resolve().parents[1]
SR = 16000
FAST = dict(max_new_tokens=4)  # the random model's words mean nothing; short budgets keep this quick


@pytest.fixture(scope="module")
def wave():
    return speech_like(5.0, seed=11)


@pytest.fixture(scope="module")
def wav_bytes(wave):
    buf = io.BytesIO()
    soundfile.write(buf, wave, SR, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def test_every_input_kind_gives_the_same_transcript(tiny_model, wave, wav_bytes, tmp_path):
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes)
    results = [
        tiny_model.transcribe(str(path), **FAST),
        tiny_model.transcribe(path, **FAST),
        tiny_model.transcribe(wav_bytes, **FAST),
        tiny_model.transcribe(io.BytesIO(wav_bytes), **FAST),
        tiny_model.transcribe(wave, sample_rate=SR, **FAST),
        tiny_model.transcribe(wave.astype(np.float64), sample_rate=SR, **FAST),
    ]
    for r in results[1:]:
        assert r.text == results[0].text and r.segments == results[0].segments
    int16 = np.clip(np.round(wave * 32767), -32768, 32767).astype(np.int16)
    resampled = tiny_model.transcribe(int16[::2], sample_rate=8000, **FAST)  # other dtypes and rates work
    assert resampled.duration_s == pytest.approx(5.0, abs=1e-3)


def test_transcript_shape_and_json_round_trip(tiny_model, wave):
    r = tiny_model.transcribe(wave, sample_rate=SR, language="en", **FAST)
    assert isinstance(r, Transcript) and isinstance(r.text, str)
    assert r.language == "en" and r.duration_s == pytest.approx(5.0)
    assert r.segments and all(isinstance(s, Segment) for s in r.segments)
    for s in r.segments:
        assert 0 <= s.start < s.end <= r.duration_s
        assert s.finish_reason in ("stop", "length", "repetition") and len(s.token_ids) <= 4
        assert s.truncated == (s.finish_reason != "stop")
    assert {"frontend", "encoder", "adaptor", "prefill", "decode", "total"} <= set(r.timings)
    doc = json.loads(json.dumps(r.to_dict()))  # plain JSON types only, no numpy scalars
    assert doc == json.loads(r.to_json())
    assert doc["finish_reason"] == r.finish_reason
    assert [s["truncated"] for s in doc["segments"]] == [s.truncated for s in r.segments]
    assert Transcript.from_dict(doc) == r
    assert tiny_model.transcribe(wave, sample_rate=SR, **FAST).language is None  # automatic


def test_writers_on_the_transcript(tiny_model, wave, tmp_path):
    r = tiny_model.transcribe(wave, sample_rate=SR, **FAST)
    assert r.to_srt().startswith("1\n00:00:0") and r.to_vtt().startswith("WEBVTT\n\n")
    assert r.to_tsv().startswith("start\tend\ttext\n")
    for suffix in ("txt", "json", "srt", "vtt", "tsv"):
        r.write(tmp_path / f"a.{suffix}")
        assert (tmp_path / f"a.{suffix}").read_text(encoding="utf-8") == r.render(suffix)
    r.write(tmp_path / "subtitles", "srt")
    assert (tmp_path / "subtitles").read_text(encoding="utf-8") == r.to_srt()
    with pytest.raises(nanoasr.OptionError, match="cannot tell the output format"):
        r.write(tmp_path / "a.docx")


def test_batch_matches_one_by_one(tiny_model, wave, wav_bytes):
    other = speech_like(3.0, seed=12)
    batch = tiny_model.transcribe_batch([wav_bytes, (other, SR), (wave, SR)], **FAST)
    single = [tiny_model.transcribe(wav_bytes, **FAST), tiny_model.transcribe(other, sample_rate=SR, **FAST)]
    assert [b.segments for b in batch] == [single[0].segments, single[1].segments, single[0].segments]
    assert tiny_model.transcribe_batch([]) == []


def test_threads_get_the_same_results_as_sequential_calls(tiny_model):
    inputs = [speech_like(2.0 + i, seed=20 + i) for i in range(4)]
    sequential = [tiny_model.transcribe(w, sample_rate=SR, **FAST) for w in inputs]
    results = [None] * (2 * len(inputs))
    errors = []

    def work(i):
        try:
            results[i] = tiny_model.transcribe(inputs[i % len(inputs)], sample_rate=SR, **FAST)
        except Exception as exc:  # surfaced below; a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, r in enumerate(results):
        want = sequential[i % len(inputs)]
        assert r.text == want.text and r.segments == want.segments


def test_on_segment_sees_every_segment_in_order(tiny_model):
    seen = []
    r = tiny_model.transcribe(speech_like(40.0, seed=5, silence_every_s=10), sample_rate=SR,
                              on_segment=seen.append, **FAST)
    assert len(r.segments) >= 2 and tuple(seen) == r.segments


def test_segments_that_stop_early_are_logged(tiny_model, wave, caplog):
    with caplog.at_level(logging.WARNING, logger="nanoasr.api"):
        r = tiny_model.transcribe(wave, sample_rate=SR, max_new_tokens=1)
    cut = sum(s.truncated for s in r.segments)
    assert cut == len(r.segments) > 0  # one token never finishes a sentence
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{cut} of {len(r.segments)} segments stopped early")


def test_bad_input_and_options_raise_value_errors(tiny_model, wave):
    with pytest.raises(nanoasr.AudioError, match="sample_rate"):
        tiny_model.transcribe(wave)
    with pytest.raises(nanoasr.AudioError, match="no such file"):
        tiny_model.transcribe("/nonexistent.wav")
    with pytest.raises(nanoasr.OptionError, match="unknown language"):
        tiny_model.transcribe(wave, sample_rate=SR, language="klingon")
    assert issubclass(nanoasr.AudioError, ValueError) and issubclass(nanoasr.OptionError, ValueError)


def test_load_model_and_import_stay_light(tiny_dir):
    code = ("import sys, nanoasr\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'numba', 'cupy', 'torch', "
            "'transformers', 'huggingface_hub', 'tokenizers', 'soundfile', 'fastapi'})\n"
            "print(','.join(heavy))\n"
            "assert nanoasr.Model.__name__ == 'Model'\n"
            f"m = nanoasr.load_model({str(tiny_dir)!r})\n"
            "print(type(m).__name__, 'cupy' in sys.modules, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "", f"import nanoasr pulled in {first}"
    assert second == "Model False False"  # a CPU model needs neither CuPy nor torch
