"""Word timestamps from FunASR's CTC branch: the branch's log-probabilities against a torch reference of
FunASR's modules, the forced alignment against a brute-force search, the vocabulary against tiktoken, and
the words through the library, the writers, the command line and the server.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import soundfile

from nanoasr import cli, timestamps, writers
from nanoasr.checkpoints import ctc as ctc_checkpoint
from nanoasr.checkpoints.ctc_vocab import PATTERN, CtcVocabulary
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.errors import OptionError
from nanoasr.model import ctc
from nanoasr.transcript import Segment, Transcript, Word
import nanoasr
from tools.lib.synth import speech_like
from tools.reference import ctc_branch, funasr_checkpoint

SR = 16000


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ctc_dir(torch, tiny_dir, tmp_path_factory):
    """The tiny checkpoint as FunASR's folder, with a random CTC branch and a small vocabulary."""
    return ctc_branch.write(funasr_checkpoint.write(tiny_dir, tmp_path_factory.mktemp("ctc")))


@pytest.fixture(scope="module")
def ctc_model(ctc_dir):
    return nanoasr.load_model(str(ctc_dir), activations="exact")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.wav"
    soundfile.write(path, speech_like(7.0, seed=5), SR)
    return path


# --- the vocabulary --------------------------------------------------------------------------------------

TEXTS = ["hello world, the test!", "你好世界，我们的", "こんにちは  the\n\nend", "don't 3.14 <|zh|><|nospeech|>", ""]


def test_vocabulary_encodes_as_tiktoken_does(ctc_dir):
    tiktoken = pytest.importorskip("tiktoken")
    vocab = CtcVocabulary.read(ctc_dir / ctc_checkpoint.VOCAB_FILE)
    reference = tiktoken.Encoding(name="ctc", pat_str=PATTERN, mergeable_ranks=vocab.ranks, special_tokens={})
    for text in TEXTS:
        ids = vocab.encode(text)
        assert ids == reference.encode(text, disallowed_special=()), text
        assert vocab.decode(ids) == text


def test_branch_config_follows_config_yaml_and_funasr_defaults(ctc_model):
    cfg = ctc_model.ctc.config
    assert (cfg.input_size, cfg.hidden_size, cfg.projector_hidden_size) == (32, 32, 48)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads) == (2, 4)
    assert cfg.vocab_size == ctc_model.ctc.vocabulary.n_ranks + ctc_branch.N_SPECIAL
    assert cfg.blank_id == cfg.vocab_size - 1


# --- the branch against FunASR's modules -----------------------------------------------------------------

def test_log_probs_match_the_torch_reference(torch, ctc_dir, ctc_model, clip):
    wave = soundfile.read(clip, dtype="float32")[0][:3 * SR]
    enc = ctc_model.encode(ctc_model.features(wave, "funasr"))  # [T, 32]
    got = ctc.log_probs(enc, ctc_model.ctc_weights, ctc_model.ctc.config)
    state = torch.load(ctc_dir / "model.pt")["state_dict"]
    want = ctc_branch.log_probs(enc, state, layers=2, heads=4)
    assert got.shape == want.shape == (enc.shape[0], ctc_model.ctc.config.vocab_size)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


# --- forced alignment against every alignment -------------------------------------------------------------

def brute_force(target_logp, blank_logp, targets):
    """The best of every CTC path (states blank, t1, blank, ..., blank), by enumeration; None if none fits."""
    frames, states = len(blank_logp), 2 * len(targets) + 1
    emit = [blank_logp if s % 2 == 0 else target_logp[:, s // 2] for s in range(states)]
    best, best_path = -np.inf, None
    for path in itertools.product(range(states), repeat=frames):
        if path[0] > 1 or path[-1] < states - 2:
            continue
        steps = [b - a for a, b in zip(path, path[1:])]
        if any(d not in (0, 1, 2) for d in steps):
            continue
        if any(d == 2 and (b % 2 == 0 or targets[b // 2] == targets[b // 2 - 1])
               for d, b in zip(steps, path[1:])):
            continue
        score = sum(emit[s][t] for t, s in enumerate(path))
        if score > best:
            best, best_path = score, path
    return best_path


@pytest.mark.parametrize("seed", range(40))
def test_viterbi_path_is_the_best_alignment(seed):
    rng = np.random.default_rng(seed)
    frames, n = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    targets = rng.integers(0, 3, n).tolist()  # small ids: repeats, which need a blank between them, happen
    logp = np.log(rng.dirichlet(np.ones(4), frames)).astype(np.float32)  # [T, 4], blank is id 3
    target_logp, blank_logp = logp[:, targets], logp[:, 3]
    want = brute_force(target_logp, blank_logp, targets)
    got = timestamps.viterbi(target_logp, blank_logp, targets)
    if want is None:
        assert got is None and timestamps.token_spans(target_logp, blank_logp, targets) is None
        return
    assert got.tolist() == list(want)
    spans = timestamps.token_spans(target_logp, blank_logp, targets)
    for j, span in enumerate(spans):  # FunASR's items: the frames of each token, its best frame's probability
        frames_j = [t for t, s in enumerate(want) if s == 2 * j + 1]
        assert (span.start, span.end) == (frames_j[0], frames_j[-1] + 1)
        assert span.probability == pytest.approx(max(np.exp(target_logp[t, j]) for t in frames_j))


def test_a_long_transcript_aligns_where_its_tokens_peak():
    """Hundreds of states (past int8): frame 3j + 1 is token j's, every other frame the blank's."""
    n, rng = 150, np.random.default_rng(0)
    targets = rng.integers(0, 50, n).tolist()
    target_logp = np.full((3 * n, n), -9.0, np.float32)
    target_logp[3 * np.arange(n) + 1, np.arange(n)] = -0.01
    blank_logp = np.full(3 * n, -0.01, np.float32)
    blank_logp[3 * np.arange(n) + 1] = -9.0
    spans = timestamps.token_spans(target_logp, blank_logp, targets)
    assert [(s.start, s.end) for s in spans] == [(3 * j + 1, 3 * j + 2) for j in range(n)]


def test_tokens_that_cannot_fit_have_no_alignment():
    logp = np.log(np.full((3, 2), 0.5, np.float32))
    assert timestamps.token_spans(logp[:, [0, 0]], logp[:, 1], [0, 0]) is not None  # a, blank, a
    assert timestamps.token_spans(logp[:, [0, 0, 0]], logp[:, 1], [0, 0, 0]) is None  # needs 5 frames


# --- words -----------------------------------------------------------------------------------------------

def spans_of(n):
    return [timestamps.TokenSpan(2 * i, 2 * i + 1, 0.5 + i / 100) for i in range(n)]


def test_words_are_characters_in_chinese_and_words_elsewhere(ctc_dir):
    vocab = CtcVocabulary.read(ctc_dir / ctc_checkpoint.VOCAB_FILE)
    text = "你好，世界 the world"
    ids = vocab.encode(text)  # "你好" is one token: its two characters share its frames
    pieces = [vocab.token_bytes(i) for i in ids]
    got = timestamps.words(text, pieces, spans_of(len(ids)))
    assert [w for w, *_ in got] == ["你好，", "世界", "the", "world"]
    starts, ends = [a for _, a, _, _ in got], [b for _, _, b, _ in got]
    assert starts == sorted(starts) and all(b <= a for b, a in zip(ends, starts[1:]))
    assert got[0][1] == 0 and got[-1][2] == 2 * len(ids) - 1


def test_agreement_is_one_minus_the_edit_distance_rate():
    assert timestamps.agreement("Hello, world!", "hello world") == 1.0
    assert timestamps.agreement("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert timestamps.agreement("你好世界", "你好") == 0.5
    assert timestamps.agreement("", "") == 1.0 and timestamps.agreement("abc", "") == 0.0


# --- through the library ---------------------------------------------------------------------------------

def test_words_lie_in_order_inside_their_segment(ctc_model, clip):
    result = ctc_model.transcribe(str(clip), max_new_tokens=2, word_timestamps=True)
    timed = [s for s in result.segments if s.words]
    assert timed, "no segment was aligned"
    for s in result.segments:
        assert isinstance(s.ctc_text, str) and 0.0 <= s.ctc_agreement <= 1.0
        for w in s.words:
            assert s.start <= w.start < w.end <= s.end + 1e-9 and 0.0 <= w.probability <= 1.0
            frames = (w.start - s.start) / ctc.FRAME_S
            assert abs(frames - round(frames)) < 1e-3  # whole frames of 60 ms from the segment's start
        assert all(a.end <= b.start for a, b in zip(s.words, s.words[1:]))
    doc = json.loads(json.dumps(result.to_dict()))
    assert Transcript.from_dict(doc) == result and "words" in doc["segments"][0]


def test_a_text_longer_than_its_frames_gets_no_word_times(ctc_model, caplog):
    """FunASR's forced_align gives no items then; the words stay empty rather than spread evenly."""
    wave = speech_like(1.0, seed=6)  # 17 frames; four random decoder tokens spell many more CTC tokens
    result = ctc_model.transcribe(wave, sample_rate=SR, max_new_tokens=4, word_timestamps=True)
    (segment,) = result.segments
    assert len(ctc_model.ctc.vocabulary.encode(segment.text)) > 17
    assert segment.words == () and isinstance(segment.ctc_text, str)
    assert "do not fit in its 17 frames" in caplog.text


def test_without_word_timestamps_nothing_changes(ctc_model, clip):
    result = ctc_model.transcribe(str(clip), max_new_tokens=2)
    assert all(s.words is None and s.ctc_text is None for s in result.segments)
    assert "words" not in result.to_dict()["segments"][0] and "ctc" not in result.timings


def test_a_checkpoint_without_the_branch_says_which_ones_have_it(tiny_model):
    holders = r"ModelScope copy of FunAudioLLM/Fun-ASR-Nano-2512's model\.pt"
    with pytest.raises(OptionError, match=holders) as err:
        tiny_model.transcribe(np.zeros(SR, np.float32), sample_rate=SR, word_timestamps=True)
    message = str(err.value)
    assert err.value.field == "word_timestamps" and "\n" not in message
    assert message.endswith("this model: its format (not FunASR's model.pt) has no CTC branch")


def test_a_partial_branch_is_no_branch(torch, tiny_dir, tmp_path):
    """The Hugging Face copy of model.pt holds ctc_decoder.blocks.{0,1} and no ctc.ctc_lo."""
    folder = funasr_checkpoint.write(tiny_dir, tmp_path)
    saved = torch.load(folder / "model.pt")
    full = ctc_branch.random_state(32, 48, 2, 300, seed=1)
    saved["state_dict"].update({n: t for n, t in full.items() if n.startswith("ctc_decoder.blocks.")})
    torch.save(saved, folder / "model.pt")
    checkpoint = load_checkpoint(folder)
    assert checkpoint.ctc is None and "partial CTC branch" in checkpoint.ctc_absent
    model = nanoasr.load_model(str(folder))
    with pytest.raises(OptionError, match=r"this model: it has a partial CTC branch"):
        model.transcribe(np.zeros(SR, np.float32), sample_rate=SR, word_timestamps=True)


def test_a_missing_vocabulary_file_is_named(ctc_dir, tmp_path):
    for name in ("model.pt", "config.yaml", "Qwen3-0.6B"):
        (tmp_path / name).symlink_to(ctc_dir / name)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.ctc is None and "multilingual.tiktoken is missing" in checkpoint.ctc_absent


def test_a_malformed_vocabulary_file_is_named(ctc_dir, tmp_path):
    for name in ("model.pt", "config.yaml", "Qwen3-0.6B"):
        (tmp_path / name).symlink_to(ctc_dir / name)
    (tmp_path / ctc_checkpoint.VOCAB_FILE).write_text("aGVsbG8= 0\nnot base64!\n")
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.ctc is None and "line 2: expected 'base64-token rank'" in checkpoint.ctc_absent


def test_word_timestamps_need_the_funasr_profile():
    with pytest.raises(OptionError, match="reference='funasr'"):
        nanoasr.api.Options(reference="transformers", word_timestamps=True)


# --- writers, command line, server -----------------------------------------------------------------------

WORDS = (Word("The", 1.0, 1.2, 0.9), Word("quick", 1.2, 1.5, 0.8), Word("brown", 1.6, 1.9, 0.7),
         Word("fox", 2.0, 2.3, 0.9), Word("jumps.", 2.4, 2.9, 0.6))
TIMED = Transcript("The quick brown fox jumps. 你好", (
    Segment(0.5, 3.0, "The quick brown fox jumps.", "stop", words=WORDS),
    Segment(3.0, 4.0, "你好", "stop", words=(Word("你", 3.1, 3.3, 1.0), Word("好", 3.3, 3.6, 1.0)))), "en", 4.0)


def test_cues_split_at_word_boundaries_within_width_and_count():
    srt = writers.render(TIMED, "srt", max_line_width=10, max_line_count=2)
    assert srt.split("\n\n")[:3] == ["1\n00:00:01,000 --> 00:00:02,300\nThe quick\nbrown fox",
                                     "2\n00:00:02,400 --> 00:00:02,900\njumps.",
                                     "3\n00:00:03,100 --> 00:00:03,600\n你好"]
    unlimited = writers.render(TIMED, "srt", max_line_width=10)  # lines break, cues stay whole segments
    assert "00:00:01,000 --> 00:00:02,900\nThe quick\nbrown fox\njumps." in unlimited
    vtt = writers.render(TIMED, "vtt")  # without limits: a cue per segment, timed by its words
    assert "00:00:01.000 --> 00:00:02.900\nThe quick brown fox jumps." in vtt


def test_tsv_has_a_row_per_word():
    rows = writers.render(TIMED, "tsv").splitlines()
    assert rows[0] == "start\tend\ttext" and rows[1:3] == ["1000\t1200\tThe", "1200\t1500\tquick"]
    assert len(rows) == 1 + 7


def test_command_line_cues_take_the_alignment_times(ctc_dir, clip, tmp_path, capsys):
    code = cli.main([str(clip), "--model", str(ctc_dir), "--word-timestamps", "--max-new-tokens", "2",
                     "-f", "json,srt,tsv", "-o", str(tmp_path), "--max-line-width", "8", "-q"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "clip.json").read_text())
    words = [w for s in doc["segments"] for w in s["words"]]
    assert words and all("ctc_text" in s for s in doc["segments"])
    cues = [block.splitlines() for block in (tmp_path / "clip.srt").read_text().strip().split("\n\n")]
    times = [(w["start"], w["end"]) for w in words]
    for cue in cues:
        start, end = (writers_seconds(t) for t in cue[1].split(" --> "))
        assert any(abs(start - a) < 1e-3 for a, _ in times) and any(abs(end - b) < 1e-3 for _, b in times)
        assert all(len(line) <= 8 or " " not in line for line in cue[2:])
    tsv = (tmp_path / "clip.tsv").read_text().splitlines()[1:]
    assert [(int(r.split("\t")[0]), int(r.split("\t")[1])) for r in tsv] == [
        (round(a * 1000), round(b * 1000)) for a, b in times]


def writers_seconds(clock: str) -> float:
    h, m, s = clock.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def test_command_line_without_the_branch_fails_once(tiny_dir, clip, capsys):
    assert cli.main([str(clip), str(clip), "--model", str(tiny_dir), "--word-timestamps", "-q"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "word timestamps need FunASR's CTC branch" in errors[0]


@pytest.mark.parametrize("argv, message", [
    (["--max-line-width", "20"], "give --word-timestamps"),
    (["--word-timestamps", "--max-line-count", "2"], "--max-line-count needs --max-line-width"),
])
def test_line_options_need_word_timestamps(argv, message, capsys):
    assert cli.main(["a.wav", *argv]) == 2 and message in capsys.readouterr().err


class StandIn:
    """A model with the CTC branch (returns TIMED), or without it (refuses word timestamps as Model does)."""

    def __init__(self, has_branch: bool):
        self.has_branch, self.kwargs = has_branch, None

    def check_options(self, language=None, word_timestamps=False):
        if word_timestamps and not self.has_branch:
            raise OptionError("word timestamps need FunASR's CTC branch", "word_timestamps")

    def transcribe(self, audio, on_segment=None, **kwargs):
        self.kwargs = kwargs
        self.check_options(kwargs.get("language"), kwargs.get("word_timestamps", False))
        return TIMED


def test_server_gives_words_with_the_word_granularity(clip):
    pytest.importorskip("fastapi")
    import httpx

    from nanoasr.server import create_app
    from tests.serverutil import running

    def post(base, granularities, response_format="verbose_json"):
        data = {"model": "m", "response_format": response_format, "timestamp_granularities[]": granularities}
        return httpx.post(base + "/v1/audio/transcriptions", data=data, timeout=30,
                          files={"file": ("clip.wav", clip.read_bytes(), "audio/wav")})

    model = StandIn(has_branch=True)
    with running(create_app(model)) as base:
        body = post(base, ["word"]).json()
        assert model.kwargs["word_timestamps"] is True and "segments" not in body
        assert body["words"][:2] == [{"word": "The", "start": 1.0, "end": 1.2},
                                     {"word": "quick", "start": 1.2, "end": 1.5}]
        both = post(base, ["word", "segment"]).json()
        assert both["words"] == body["words"] and len(both["segments"]) == 2
        plain = post(base, ["segment"]).json()
        assert "words" not in plain and "word_timestamps" not in model.kwargs
        assert post(base, ["word"], "json").json()["error"]["param"] == "timestamp_granularities"
    without = StandIn(has_branch=False)
    with running(create_app(without)) as base:
        refused = post(base, ["word"])
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "timestamp_granularities"
        assert without.kwargs is None  # refused before the upload was queued and decoded
        assert httpx.get(base + "/health").json()["served"] == 0
