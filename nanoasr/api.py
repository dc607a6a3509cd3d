"""Model: load a checkpoint, transcribe(path | bytes | file | array) -> Transcript. No math here.

Calls are serialised by a lock, so one Model may be shared by several threads: each call runs whole,
one at a time, and gives the same result it gives alone.
"""
from __future__ import annotations

import dataclasses
import logging
import numbers
import reprlib
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from nanoasr import backend as backend_mod
from nanoasr import timestamps
from nanoasr.audio import SAMPLE_RATE
from nanoasr.audio.fbank import check_reference
from nanoasr.audio.segment import DEFAULT_SEGMENT_VAD, SEGMENT_VADS
from nanoasr.backend import host
from nanoasr.checkpoints import ctc
from nanoasr.checkpoints.checkpoint import Checkpoint
from nanoasr.checkpoints.load import load_checkpoint
from nanoasr.checkpoints.spec import expected_tensors
from nanoasr.errors import OptionError
from nanoasr.model import adaptor, decoder, encoder, generate, prompt
from nanoasr.model.tokenizer import Tokenizer
from nanoasr.transcript import Segment, Transcript

FUNASR_ADAPTOR_EPS = 1e-12  # the authors' adaptor LayerNorm eps (DESIGN §2)
MAX_SEGMENT_S = 30.0
SILENCE_MARK = "/sil"
BATCH_SIZE = 8  # segments decoded together, by default (Model's batch_size)
# The KV cache of the segments decoded together stays under this (one row at least): a prompt near its token
# limit makes a row about 1 GB on the full-size model, so long prompts decode fewer segments at once.
MAX_CACHE_BYTES = 2 << 30
MAX_CONTEXT_CHARS = prompt.MAX_CONTEXT_CHARS  # the context option's limit, for the edges that state it
# Model.warm_up: seconds of noise, a few tokens decoded. A kernel is typed by the stored types and the
# activations, not by lengths, but the element-wise ones split their rows over threads from SPLIT_VALUES
# values on (backend/cpu.py): 8 s makes the full-size model's encoder, adaptor and prefill rows pass it.
WARM_UP_S = 8.0
WARM_UP_TOKENS = 4
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    context: str | None = None
    reference: str = "funasr"
    max_new_tokens: int | None = None
    ignore_stop: bool = False  # decode exactly the budget (reference comparisons and benchmarks)
    word_timestamps: bool = False  # words timed by the CTC branch, and its greedy text (ModelScope model.pt)
    vad: str = DEFAULT_SEGMENT_VAD  # the segmenter's speech detector: "silero" or "energy"

    def __post_init__(self):
        """Every option is checked here, before any audio is decoded. `hotwords` may come as any sequence of
        strings (it is kept as a tuple); the prompt's length limits are nanoasr.model.prompt's."""
        _check_type("language", self.language, (str, type(None)), "a string or None")
        _check_type("itn", self.itn, bool, "True or False")
        _check_type("context", self.context, (str, type(None)), "a string or None")
        _check_type("reference", self.reference, str, "a string")
        _check_type("ignore_stop", self.ignore_stop, bool, "True or False")
        _check_type("word_timestamps", self.word_timestamps, bool, "True or False")
        if self.word_timestamps and self.reference != "funasr":
            raise OptionError("word timestamps follow FunASR's CTC branch, which reads the encoder output of "
                              f"reference='funasr'; got reference={self.reference!r}", "word_timestamps")
        budget = self.max_new_tokens
        if budget is not None:
            object.__setattr__(self, "max_new_tokens", _whole_number("max_new_tokens", budget, "or None"))
        object.__setattr__(self, "hotwords", _hotword_tuple(self.hotwords))
        if self.vad not in SEGMENT_VADS:
            raise OptionError(f"vad must be one of {', '.join(SEGMENT_VADS)}; got {reprlib.repr(self.vad)}",
                              "vad")
        check_reference(self.reference)
        if self.max_new_tokens is not None and not 1 <= self.max_new_tokens <= generate.MAX_NEW_TOKENS:
            raise OptionError(f"max_new_tokens must be between 1 and {generate.MAX_NEW_TOKENS}; "
                              f"got {self.max_new_tokens}", "max_new_tokens")
        # language, hotwords and context, and their length limits
        prompt.instruction(self.language, self.itn, self.hotwords, self.context)

    @property
    def language_code(self) -> str | None:
        """The ISO code of `language` (given as code, English or Chinese name); None for automatic."""
        return prompt.language_code(self.language)

    def prompt_options(self) -> dict:
        return dict(language=self.language, itn=self.itn, hotwords=self.hotwords, context=self.context)


def check_language(language: str | None, variant: str | None) -> None:
    """OptionError for a language unknown, or one the model `variant` was not trained for (naming its
    languages); with `variant` None (not known yet), any language some variant knows passes. The CLI asks
    before loading a model whose variant its name tells; Model.check_options asks of the loaded model."""
    prompt.language_code(language, prompt.VARIANT_LANGUAGES.get(variant))


def _check_type(name: str, value, types, accepted: str) -> None:
    if not isinstance(value, types):
        raise OptionError(f"{name} must be {accepted}; got {reprlib.repr(value)} ({type(value).__name__})",
                          name)


def _whole_number(name: str, value, alternative: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionError(f"{name} must be a whole number{' ' + alternative if alternative else ''}; got "
                          f"{reprlib.repr(value)} ({type(value).__name__})", name)
    return int(value)


def _hotword_tuple(hotwords) -> tuple[str, ...]:
    if isinstance(hotwords, (str, bytes)):  # tuple("abc") would make three hotwords of it
        raise OptionError(f"hotwords must be a list of strings, not one string: give [word] for a single "
                          f"hotword; got {reprlib.repr(hotwords)}", "hotwords")
    try:
        words = tuple(hotwords)
    except TypeError:
        raise OptionError(f"hotwords must be a list of strings; got {type(hotwords).__name__}",
                          "hotwords") from None
    for word in words:
        if not isinstance(word, str):
            raise OptionError(f"hotwords must be strings; got {reprlib.repr(word)} ({type(word).__name__})",
                              "hotwords")
    return words


class Timer:
    """Milliseconds spent in each named stage, summed over a call (Transcript.timings)."""

    def __init__(self):
        self.ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        yield
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3


class Model:
    def __init__(self, checkpoint: Checkpoint, device: str = "cpu", threads: int | None = None,
                 batch_size: int = BATCH_SIZE, activations: str = "auto", huge_pages: bool = False):
        """`batch_size`: segments of one call decoded together, at most (each in its own KV-cache row);
        `activations`: "auto" (int8 against Q8_0/Q4_K/Q6_K where the CPU has AVX2 or AVX512-VNNI, bf16
        against BF16 where it has AMX or AVX512-BF16, float32 elsewhere), "exact" (float32 rows), "int8"
        (rows quantized per block against Q8_0, Q4_K and Q6_K weights, as ggml does) or "bf16" (rows rounded
        to bf16 against BF16 weights and in the encoder's and prefill's attention, on AMX tiles where the CPU
        has them); see nanoasr.backend.ACTIVATIONS. `huge_pages`: on the CPU, read the weight matrices into a
        private copy in 2 MiB pages, from which decoding streams them faster, instead of reading them through
        the checkpoint's file mapping (shared with other processes that load the same file, no copy), where
        the page cache holds the file in 4 KiB pages (nanoasr/formats/mapping.py)."""
        self.batch_size = _whole_number("batch_size", batch_size)
        if self.batch_size < 1:
            raise OptionError(f"batch_size must be at least 1; got {self.batch_size}", "batch_size")
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.backend = backend_mod.with_activations(backend_mod.resolve(device), activations, huge_pages)
        self.threads = threads
        self.tokenizer = Tokenizer(checkpoint.files["tokenizer.json"], self.config.audio_token_id,
                                   checkpoint.source.get("path", "tokenizer.json"))
        vectors = {name for name, (_, kind) in expected_tensors(self.config).items() if kind != "matrix"}
        self.weights = self.backend.place(checkpoint.tensors, vectors)
        self._numba_products = self.backend.numba_products(self.weights)  # for thread_scope, once
        self.plan = self.backend.plan(self.weights, threads)
        self.ctc = checkpoint.ctc
        if self.ctc is not None:
            self.ctc_weights = self.backend.place(self.ctc.tensors, ctc.vector_names(self.ctc))
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model=None, device: str = "cpu", threads: int | None = None, batch_size: int = BATCH_SIZE,
             llm=None, activations: str = "auto", huge_pages: bool = False, **resolve_options) -> "Model":
        """`model`: a checkpoint directory or .gguf path, a hub id `org/repo[@rev]`, or a package name;
        `llm`: the decoder GGUF when `model` is the encoder file of FunASR's llama.cpp runtime."""
        from nanoasr import hub

        resolved = hub.resolve(model, **resolve_options)
        checkpoint = load_checkpoint(resolved.path, llm)
        source = dict(checkpoint.source, repo=resolved.repo, revision=resolved.revision)
        if resolved.package is not None:
            source.update(license=resolved.package.license, package=resolved.package.name)
            source.setdefault("variant", resolved.package.variant)
        return cls(dataclasses.replace(checkpoint, source=source), device, threads, batch_size, activations,
                   huge_pages)

    def thread_scope(self, threads: int | None = None):
        """A context in which this model's stages compute with its CPU threads (numba's and BLAS's; see
        Backend.numba_products), or with `threads` of them where given (a caller sharing the cores out)."""
        return host.threads(threads or self.threads, self._numba_products)

    def check_options(self, language: str | None = None, word_timestamps: bool = False) -> None:
        """OptionError for what this model cannot do, before any audio is read: a language it was not trained
        for (naming its languages), or word timestamps without FunASR's CTC branch (naming the checkpoints
        that have it)."""
        check_language(language, self._variant)
        if word_timestamps and self.ctc is None:
            raise OptionError(f"word timestamps need FunASR's CTC branch (ctc_decoder.* and ctc.ctc_lo.*): "
                              f"{ctc.HOLDERS}; this model: {self.checkpoint.ctc_absent}", "word_timestamps")

    @property
    def languages(self) -> tuple[str, ...]:
        """ISO codes of the languages the loaded model was trained for (those of its variant)."""
        return prompt.VARIANT_LANGUAGES[self._variant]

    @property
    def _variant(self) -> str:  # the variant the checkpoint's source names, else the default one
        return self.checkpoint.source.get("variant") or prompt.DEFAULT_VARIANT

    # --- stages (also used by the parity tests) -------------------------------------------------------

    def features(self, wave, reference: str):  # [N] -> [T, 560] on the model's device (computed on the host)
        from nanoasr.audio.fbank import features

        return self.backend.xp.asarray(features(wave, reference)[0])

    def encode(self, feats, taps=None):  # [T, 560] -> [T, 512]
        return encoder.encode(feats, self.weights, self.config.audio, taps)

    def adapt(self, enc, reference: str, taps=None):  # [T, 512] -> [T, 1024]
        eps = FUNASR_ADAPTOR_EPS if reference == "funasr" else self.config.adaptor.layer_norm_eps
        return adaptor.adapt(enc, self.weights, self.config.adaptor, eps, taps)

    def prompt_embeds(self, audio_rows, options: Options):  # [n, H] -> ([L, H], ids [L])
        return self._fill_prompt(audio_rows, prompt.template(self.tokenizer, **options.prompt_options()))

    def _fill_prompt(self, audio_rows, template: prompt.Template):  # [n, H] -> ([L, H], ids [L])
        ids, start = template.ids(len(audio_rows))
        embeds = decoder.embed(ids, self.weights)
        embeds[start:start + len(audio_rows)] = audio_rows
        return embeds, ids

    # --- transcription --------------------------------------------------------------------------------

    def _segment_prompts(self, wave, spans, options: Options, template: prompt.Template, timer: Timer,
                         encodings: dict | None = None):
        """Prompt embeddings [L, H] for the spans of `wave`, in order, each computed when the decoder asks for
        it. Spans go through the encoder one at a time, so no work is spent on padding them to a common
        length; each fills the audio slot of the call's one tokenized `template`. With `encodings`, each
        span's encoder output [T, 512] is kept there by index, for the CTC branch."""
        for index, (a, b) in enumerate(spans):
            with timer.stage("frontend"):
                feats = self.features(wave[a:b], options.reference)
            with timer.stage("encoder"):
                enc = self.encode(feats)
            if encodings is not None:
                encodings[index] = enc
            with timer.stage("adaptor"):
                audio = self.adapt(enc, options.reference)
            low_frame_rate = self.config.adaptor.use_low_frame_rate
            n = prompt.n_audio_tokens(feats.shape[0], options.reference, low_frame_rate)
            yield self._fill_prompt(audio[:n], template)[0]

    def transcribe(self, audio, *, sample_rate: int | None = None, language: str | None = None,
                   itn: bool = True, hotwords=(), context: str | None = None, reference: str = "funasr",
                   max_new_tokens: int | None = None, ignore_stop: bool = False,
                   max_duration_s: float | None = None, on_segment=None,
                   word_timestamps: bool = False, on_partial=None,
                   vad: str = DEFAULT_SEGMENT_VAD, draft=None) -> Transcript:
        """Transcribe a path, encoded bytes, a binary file object, an array (with `sample_rate`), or a
        DecodedAudio from nanoasr.audio.io.decode_audio (taken as it is, not decoded again).

        `on_segment(segment)`, when given, is called as each segment is finished, in order.
        `on_partial(segment)`, when given, is called as the decoder settles more tokens of the earliest
        unfinished segment: a Segment with finish_reason "decoding" whose `text` only grows, each a prefix of
        the finished segment's text (whole characters, nothing a stopping rule takes back).
        `max_duration_s` refuses longer audio with AudioTooLongError (default: no limit).
        `word_timestamps` gives each segment `words`, `ctc_text` and `ctc_agreement` from FunASR's CTC branch;
        a checkpoint without one refuses it with OptionError. `vad` picks the segmenter's speech detector.
        `draft`: token ids the transcript of audio that is one segment (30 s or less) is expected to have,
        such as an earlier decode of the same speech: they are verified in the prompt's forward and kept as
        far as greedy decoding chooses them, so the result is the same with any draft, and sooner with a
        right one (nanoasr.model.generate). Ignored for longer audio and on the GPU.
        """
        options = Options(language, itn, hotwords, context, reference, max_new_tokens, ignore_stop,
                          word_timestamps, vad)
        draft = self._check_draft(draft)
        return self._transcribe(audio, sample_rate, options, on_segment, max_duration_s, on_partial, draft)

    def _check_draft(self, draft) -> list[int] | None:
        if draft is None:
            return None
        if isinstance(draft, (str, bytes)) or not hasattr(draft, "__iter__"):
            raise OptionError(f"draft must be a list of token ids; got {type(draft).__name__}", "draft")
        ids = list(draft)
        vocab = self.config.text.vocab_size
        bad = [t for t in ids
               if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab]
        if bad:
            raise OptionError(f"draft must hold token ids from 0 to {vocab - 1}; got {reprlib.repr(bad)}",
                              "draft")
        return [int(t) for t in ids]

    def compile_beside(self) -> bool:
        """On a first run (the disk cache lacks them), start compiling the decode step's layer kernels, the
        slowest to compile, in child processes, so that they compile while this process compiles and runs the
        encoder; its first decode step waits for them and loads them. True when any child was started; never
        where fewer than two CPUs are usable, or on a device without compiled layers. The command line calls
        it after loading a model; a library user may."""
        if host.usable_cpus() < 2:
            return False
        with self._lock, self.thread_scope():
            return decoder.compile_step_beside(self.weights, self.config.text)

    def warm_up(self) -> float:
        """Transcribe WARM_UP_S seconds of seeded noise (one segment), decoding WARM_UP_TOKENS tokens (with
        the CTC branch's word timestamps where the model has it), so that numba compiles this model's kernels,
        or loads them from its disk cache, before a first real call; returns the seconds it took. A server
        runs it before it accepts requests."""
        start = time.perf_counter()
        noise = np.random.default_rng(0).standard_normal(int(WARM_UP_S * SAMPLE_RATE)).astype(np.float32)
        options = Options(max_new_tokens=WARM_UP_TOKENS, ignore_stop=True,
                          word_timestamps=self.ctc is not None)
        self._transcribe(0.1 * noise, SAMPLE_RATE, options)
        return time.perf_counter() - start

    def transcribe_batch(self, inputs, **kwargs) -> list[Transcript]:
        """Transcribe several inputs with the same options, in order.

        Each input is what `transcribe` takes; an array may come as an `(array, sample_rate)` pair.
        """
        out = []
        for x in inputs:
            if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], np.ndarray):
                out.append(self.transcribe(x[0], sample_rate=x[1], **kwargs))
            else:
                out.append(self.transcribe(x, **kwargs))
        return out

    def _transcribe(self, audio, sample_rate, options: Options, on_segment=None,
                    max_duration_s=None, on_partial=None, draft=None) -> Transcript:
        start = time.perf_counter()
        self.check_options(options.language, options.word_timestamps)
        with self._lock, self.thread_scope():
            call = self._open_call(start, audio, sample_rate, options, on_segment, max_duration_s, on_partial)
            if call.spans:
                rows = self._decode_rows(call.spans, call.budgets, call.template.text_tokens,
                                         options.reference)
                generate.generate(self._call_prompts(call), call.budgets, self.weights, self.config.text,
                                  self.tokenizer.stop_ids, options.ignore_stop, rows=rows, timer=call.timer,
                                  on_done=call.in_order.finished, bf16_rope=options.reference == "funasr",
                                  on_tokens=call.in_order.settled if on_partial is not None else None,
                                  # one segment only: among several it would be prefilled alone, not as
                                  # it is with the others
                                  drafts={0: draft} if draft and len(call.spans) == 1 else None)
        return self._close_call(call)

    def transcribe_together(self, requests, stop=None) -> list[Transcript]:
        """Transcribe several pieces of audio of one segment each (at most MAX_SEGMENT_S: longer audio is
        refused with AudioTooLongError), each with its own Options and draft, decoding them together: each
        decode step is one pass over the weights for all their rows. `requests`: (wave [N] float32 at 16 kHz,
        Options, draft or None), at most `together_rows`, sharing `reference` and `ignore_stop`. Each
        transcript is `transcribe(wave, sample_rate=16000, draft=draft, **options)`'s token for token: each
        prompt is prefilled in its own forward, as it is alone, and a decode step's products give each row its
        bits alone (generate's `alone_prefills`). Live sessions sharing a model use it (nanoasr.batching).
        `stop()`, when given, is asked before each encoding, prefill and decode step; True gives the call up,
        raising nanoasr.model.generate.Stopped."""
        requests = [(wave, options, self._check_draft(draft)) for wave, options, draft in requests]
        if not 1 <= len(requests) <= self.together_rows:
            raise OptionError(f"transcribe_together takes 1 to {self.together_rows} requests; got "
                              f"{len(requests)}", "requests")
        if len({(options.reference, options.ignore_stop) for _, options, _ in requests}) > 1:
            raise OptionError("requests decoded together must share reference and ignore_stop", "reference")
        for _, options, _ in requests:
            self.check_options(options.language, options.word_timestamps)
        options, start = requests[0][1], time.perf_counter()
        with self._lock, self.thread_scope():
            calls = [self._open_call(start, wave, SAMPLE_RATE, o, max_duration_s=MAX_SEGMENT_S)
                     for wave, o, _ in requests]
            decoded = [(call, draft) for call, (_, _, draft) in zip(calls, requests) if call.spans]
            if decoded:
                timer = decoded[0][0].timer  # the shared decode is timed once, in the first call's timings

                def finished(row: int, g: generate.Generation) -> None:
                    decoded[row][0].in_order.finished(0, g)
                prompts = (p for call, _ in decoded for p in self._call_prompts(call))
                generate.generate(prompts, [call.budgets[0] for call, _ in decoded], self.weights,
                                  self.config.text, self.tokenizer.stop_ids, options.ignore_stop,
                                  rows=len(decoded), timer=timer, on_done=finished,
                                  bf16_rope=options.reference == "funasr", alone_prefills=True,
                                  drafts={row: draft for row, (_, draft) in enumerate(decoded) if draft},
                                  stop=stop)
        return [self._close_call(call) for call in calls]

    @property
    def together_rows(self) -> int:
        """The most requests transcribe_together decodes at once: the rows a decode step's products compute
        each as they compute it alone (ops.decode_rows; 1 where the device promises no such rows: the
        GPU, where decoding together would change a row's last bits)."""
        return max(1, min(self.batch_size, self.backend.kernels.decode_rows))

    def _open_call(self, start: float, audio, sample_rate, options: Options, on_segment=None,
                   max_duration_s=None, on_partial=None) -> "_Call":
        """A call (begun at perf_counter `start`): its audio loaded and cut into spans, with their token
        budgets (under the model's lock)."""
        from nanoasr.audio.io import load_audio
        from nanoasr.audio.segment import split

        timer = Timer()
        # the prompt's text, tokenized once for every segment and held to its limit before any audio is read
        template = prompt.template(self.tokenizer, **options.prompt_options())
        with timer.stage("load_audio"):
            wave = load_audio(audio, sample_rate, max_duration_s=max_duration_s)
        duration = len(wave) / SAMPLE_RATE
        if duration <= MAX_SEGMENT_S:
            spans = [(0, len(wave))] if split(wave, MAX_SEGMENT_S, vad=options.vad) else []
        else:
            spans = [(s.start, s.end) for s in split(wave, MAX_SEGMENT_S, vad=options.vad)]
        budgets = [options.max_new_tokens or generate.token_budget((b - a) / SAMPLE_RATE) for a, b in spans]
        encodings = {} if options.word_timestamps else None
        in_order = _InOrder(self, spans, timer, encodings, on_segment, on_partial)
        return _Call(options, start, timer, template, wave, duration, spans, budgets, encodings, in_order)

    def _call_prompts(self, call: "_Call"):
        return self._segment_prompts(call.wave, call.spans, call.options, call.template, call.timer,
                                     call.encodings)

    def _close_call(self, call: "_Call") -> Transcript:
        options, timer = call.options, call.timer
        timer.ms["total"] = (time.perf_counter() - call.start) * 1e3
        segments = call.in_order.segments
        cut = [s.finish_reason for s in segments if s.truncated]
        if cut and not options.ignore_stop:  # ignore_stop asks for exactly the budget: reaching it is no news
            log.warning("%d of %d segments stopped early (%d at the token budget, %d by the repetition "
                        "guard), so their text may be incomplete; finish_reason marks them%s", len(cut),
                        len(segments), cut.count("length"), cut.count("repetition"),
                        "; max_new_tokens raises the budget"
                        if "length" in cut and options.max_new_tokens is None else "")  # not the user's own
        code = prompt.language_code(options.language)
        return Transcript(join_texts([s.text for s in segments]), tuple(segments), code, call.duration,
                          timer.ms)

    def _decode_rows(self, spans, budgets, text_tokens: int, reference: str) -> int:
        """Segments decoded together: batch_size, fewer when their cache rows would pass MAX_CACHE_BYTES."""
        from nanoasr.audio.fbank import n_lfr_frames

        low_frame_rate = self.config.adaptor.use_low_frame_rate
        audio_tokens = max(prompt.n_audio_tokens(n_lfr_frames(b - a), reference, low_frame_rate)
                           for a, b in spans)
        positions = text_tokens + audio_tokens + max(budgets)
        row_bytes = positions * decoder.cache_bytes_per_position(self.config.text)
        return max(1, min(self.batch_size, len(spans), MAX_CACHE_BYTES // row_bytes))


@dataclass
class _Call:
    """One transcription's state between its audio being read and its transcript."""

    options: Options
    start: float  # perf_counter at the call's start
    timer: Timer
    template: prompt.Template
    wave: np.ndarray
    duration: float
    spans: list
    budgets: list
    encodings: dict | None
    in_order: "_InOrder"


def language_name(code: str) -> str:
    """The English name of a language's ISO code (Transcript.language)."""
    return prompt.LANGUAGES[code][1]


class _InOrder:
    """Segments, which finish out of order, in order: each finished one goes to on_segment as it is next;
    the settled tokens of the earliest unfinished one go to on_partial as they grow."""

    def __init__(self, model: Model, spans, timer: Timer, encodings, on_segment, on_partial):
        self.model, self.spans, self.timer, self.encodings = model, spans, timer, encodings
        self.on_segment, self.on_partial = on_segment, on_partial
        self.segments: list[Segment] = []
        self.done: dict[int, generate.Generation] = {}
        self.latest: dict[int, list[int]] = {}  # settled ids of the segments still decoding
        self.shown = (-1, 0)  # (segment, settled ids) last given to on_partial

    def finished(self, item: int, g: generate.Generation) -> None:
        self.done[item] = g
        self.latest.pop(item, None)
        while len(self.segments) in self.done:
            self._append(self.done.pop(len(self.segments)))
        self._show_partial()

    def settled(self, item: int, ids: list[int]) -> None:
        self.latest[item] = ids
        self._show_partial()

    def _append(self, g: generate.Generation) -> None:
        index = len(self.segments)
        a, b = self.spans[index]
        segment = Segment(a / SAMPLE_RATE, b / SAMPLE_RATE, self.model.tokenizer.decode(g.ids),
                          g.finish_reason, tuple(g.ids), g.avg_logprob)
        if self.encodings is not None:
            with self.timer.stage("ctc"):
                segment = timestamps.with_words(segment, self.encodings.pop(index), self.model.ctc,
                                                self.model.ctc_weights)
        self.segments.append(segment)
        if self.on_segment is not None:
            self.on_segment(segment)

    def _show_partial(self) -> None:
        index = len(self.segments)
        ids = self.latest.get(index)
        if self.on_partial is None or not ids or self.shown == (index, len(ids)):
            return
        self.shown = (index, len(ids))
        a, b = self.spans[index]
        text = settled_text(self.model.tokenizer.decode(ids))
        self.on_partial(Segment(a / SAMPLE_RATE, b / SAMPLE_RATE, text, "decoding", tuple(ids)))


def settled_text(text: str) -> str:
    """The decoded text of a segment's first tokens, less what later tokens may still change: bytes of a
    character not yet complete (decoded as U+FFFD), the start of a `/sil` that Tokenizer.decode reads as a
    pause, and the whitespace before them (it is stripped at the end of a segment)."""
    text = text.rstrip("\ufffd")
    for n in (3, 2, 1):
        if text.endswith(SILENCE_MARK[:n]):
            text = text[:-n]
            break
    return text.rstrip()


def join_texts(texts) -> str:
    """Segment texts in order; a space only between two ASCII letters/digits (Chinese joins directly)."""
    out = ""
    for text in (t.strip() for t in texts):
        if not text:
            continue
        if out and out[-1].isascii() and out[-1].isalnum() and text[0].isascii() and text[0].isalnum():
            out += " "
        elif out and out[-1] in ".,!?;:" and text[0].isascii() and text[0].isalnum():
            out += " "
        out += text
    return out
