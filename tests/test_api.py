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
from tools.lib.synth import speech_like

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


BAD_OPTIONS = [
    (dict(hotwords="abc"), "hotwords must be a list of strings, not one string"),
    (dict(hotwords=5), "hotwords must be a list of strings; got int"),
    (dict(hotwords=["a", 3]), r"hotwords must be strings; got 3 \(int\)"),
    (dict(hotwords=[b"a"]), r"hotwords must be strings; got b'a' \(bytes\)"),
    (dict(itn="no"), r"itn must be True or False; got 'no' \(str\)"),
    (dict(itn=0), r"itn must be True or False; got 0 \(int\)"),
    (dict(language=5), r"language must be a string or None; got 5 \(int\)"),
    (dict(context=["a"]), r"context must be a string or None; got \['a'\] \(list\)"),
    (dict(max_new_tokens=2.5), r"max_new_tokens must be a whole number or None; got 2.5 \(float\)"),
    (dict(max_new_tokens=True), r"max_new_tokens must be a whole number or None; got True \(bool\)"),
    (dict(max_new_tokens="8"), "max_new_tokens must be a whole number"),
    (dict(max_new_tokens=0), "max_new_tokens must be between 1 and 512; got 0"),
    (dict(ignore_stop="yes"), r"ignore_stop must be True or False; got 'yes' \(str\)"),
    (dict(reference=None), r"reference must be a string; got None \(NoneType\)"),
    (dict(reference="torch"), "reference must be one of funasr, transformers; got 'torch'"),
    (dict(language="klingon"), "unknown language 'klingon'"),
    (dict(hotwords=["x" * 60_000]), "a hotword is limited to 100 characters; got 60000"),
    (dict(hotwords=["w"] * 101), "at most 100 hotwords are accepted; got 101"),
    (dict(hotwords=["x" * 90] * 50), "hotwords are limited to 4096 characters in all; got 4500"),
    (dict(context="y" * 4097), "context is limited to 4096 characters; got 4097"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_bad_options_are_refused_before_any_audio_is_read(tiny_model, options, message):
    """An OptionError naming the option, what it accepts and what it got, not a TypeError from deep
    inside, and before the audio is touched: a missing file would otherwise raise AudioError first."""
    with pytest.raises(nanoasr.OptionError, match=message):
        tiny_model.transcribe("/nonexistent.wav", **options)


def test_options_at_their_limits_and_of_other_sequence_types_are_taken():
    from nanoasr.api import Options

    at_limits = Options(hotwords=["x" * 100] * 40 + ["y" * 96], context="z" * 4096,
                        max_new_tokens=np.int64(512))
    assert at_limits.max_new_tokens == 512 and type(at_limits.max_new_tokens) is int
    assert Options(hotwords=["a", "b"]).hotwords == Options(hotwords=(w for w in "ab")).hotwords == ("a", "b")


def test_the_prompt_token_limit_is_checked_before_any_audio_is_read(tiny_model):
    rare = "\U00013000" * 1500  # within the character limits; an Egyptian hieroglyph is three tokens
    with pytest.raises(nanoasr.OptionError, match="the prompt is limited to 4096 text tokens"):
        tiny_model.transcribe("/nonexistent.wav", context=rare)


def test_the_cache_row_size_is_what_a_cache_allocates(tiny_model):
    from nanoasr.model.decoder import KVCache, cache_bytes_per_position

    cfg = tiny_model.config.text
    cache = KVCache(cfg, batch=3, capacity=17)
    assert cache_bytes_per_position(cfg) * 3 * 17 == cache.k.nbytes + cache.v.nbytes


def test_long_prompts_decode_fewer_segments_at_once_with_the_same_ids(tiny_model, monkeypatch):
    from nanoasr import api
    from nanoasr.model import generate

    wave = speech_like(150.0, seed=3, silence_every_s=10)
    rows = []
    real_generate = generate.generate
    monkeypatch.setattr(generate, "generate",
                        lambda *a, **k: rows.append(k["rows"]) or real_generate(*a, **k))
    full = tiny_model.transcribe(wave, sample_rate=SR, context="a context " * 100, max_new_tokens=6)
    monkeypatch.setattr(api, "MAX_CACHE_BYTES", 1)  # smaller than any row: one row at a time
    narrow = tiny_model.transcribe(wave, sample_rate=SR, context="a context " * 100, max_new_tokens=6)
    assert rows == [api.BATCH_SIZE, 1] and len(full.segments) > api.BATCH_SIZE
    assert [s.token_ids for s in narrow.segments] == [s.token_ids for s in full.segments]


@pytest.mark.parametrize("batch_size, message", [
    (0, "batch_size must be at least 1; got 0"),
    (2.0, r"batch_size must be a whole number; got 2.0 \(float\)"),
    (True, r"batch_size must be a whole number; got True \(bool\)"),
    ("8", "batch_size must be a whole number")])
def test_a_bad_batch_size_is_refused_naming_it(tiny_model, batch_size, message):
    from nanoasr.api import Model

    with pytest.raises(nanoasr.OptionError, match=message):
        Model(tiny_model.checkpoint, batch_size=batch_size)


def test_batch_size_sets_the_segments_decoded_together_with_the_same_ids(tiny_dir, tiny_model, monkeypatch):
    from nanoasr.model import generate

    wave = speech_like(100.0, seed=4, silence_every_s=10)
    rows = []
    real_generate = generate.generate
    monkeypatch.setattr(generate, "generate",
                        lambda *a, **k: rows.append(k["rows"]) or real_generate(*a, **k))
    together = tiny_model.transcribe(wave, sample_rate=SR, max_new_tokens=6)
    three = nanoasr.load_model(str(tiny_dir), batch_size=3).transcribe(wave, sample_rate=SR, max_new_tokens=6)
    one = nanoasr.Model(tiny_model.checkpoint, batch_size=1).transcribe(wave, sample_rate=SR,
                                                                        max_new_tokens=6)
    assert rows == [min(8, len(together.segments)), 3, 1] and len(together.segments) > 3
    assert [s.token_ids for s in three.segments] == [s.token_ids for s in together.segments]
    assert [s.token_ids for s in one.segments] == [s.token_ids for s in together.segments]


def test_the_prompt_is_tokenized_once_per_call_not_once_per_segment(tiny_model, monkeypatch):
    pieces = []
    real_encode = tiny_model.tokenizer.encode
    monkeypatch.setattr(tiny_model.tokenizer, "encode", lambda text: pieces.append(text) or real_encode(text))
    result = tiny_model.transcribe(speech_like(100.0, seed=4, silence_every_s=10), sample_rate=SR,
                                   hotwords=["nanoasr"], max_new_tokens=2)
    assert len(result.segments) > 3
    assert len(pieces) == 2  # the text before the audio slot and the text after it


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


@pytest.mark.parametrize("options, field", [
    (dict(language="klingon"), "language"), (dict(itn="no"), "itn"), (dict(hotwords="abc"), "hotwords"),
    (dict(context=3), "context"), (dict(reference="whisper"), "reference"),
    (dict(max_new_tokens=2.5), "max_new_tokens"), (dict(hotwords=["x" * 101]), "hotwords"),
    (dict(context="x" * 5000), "context"), (dict(vad="webrtc"), "vad"),
])
def test_an_option_error_names_its_field(options, field):
    from nanoasr.api import Options
    from nanoasr.errors import OptionError

    with pytest.raises(OptionError) as refused:
        Options(**options)
    assert refused.value.field == field and field.rstrip("s") in str(refused.value)


def test_warm_up_runs_one_short_transcription_that_decodes_its_tokens(tiny_model, monkeypatch, caplog):
    """One call through the whole pipeline: one segment, the prefill and WARM_UP_TOKENS decoded tokens, and no
    warning for the budget it asked to reach."""
    from nanoasr import api
    from nanoasr.model import generate

    calls, real = [], generate.generate

    def counted(prompts, budgets, *rest, **options):
        done = real(prompts, budgets, *rest, **options)
        calls.append((budgets, [len(g.ids) for g in done]))
        return done
    monkeypatch.setattr(generate, "generate", counted)
    with caplog.at_level(logging.WARNING, logger="nanoasr"):
        assert tiny_model.warm_up() > 0
    assert calls == [([api.WARM_UP_TOKENS], [api.WARM_UP_TOKENS])] and caplog.records == []
    compiled = compiled_signatures()  # a long input, its segments decoded together, compiles nothing new
    tiny_model.transcribe(speech_like(40.0, seed=5, silence_every_s=10), sample_rate=SR, **FAST)
    assert len(calls) == 2 and len(calls[1][0]) >= 2 and compiled_signatures() == compiled


def compiled_signatures() -> dict:
    """Each numba function of nanoasr in this process and the signatures it has compiled."""
    import gc

    from numba.core.dispatcher import Dispatcher

    # type(), not isinstance: some objects (numpy's npz attribute bag) raise on any attribute, __class__ too
    return {d: list(d.signatures) for d in gc.get_objects()
            if issubclass(type(d), Dispatcher) and d.py_func.__module__.startswith("nanoasr.")}
