"""nanoasr stream [INPUT]: live transcription of a stream (nanoasr.realtime) from a path or stdin.

Raw PCM16 (`--format s16le --rate N`, mono little-endian) is read and endpointed as it arrives, so a pipe from
a recorder is transcribed while it runs; any other input is decoded first (nanoasr.audio.io: WAV, FLAC, MP3
and what ffmpeg reads) and then streamed. `--realtime` paces the audio as if it were live; otherwise it goes
as fast as decoding allows. On a terminal the partial text of the utterance under way is rewritten in place
and each final ends its line; into a pipe only finals are printed, one per line; `--json` prints every event
as a JSON line. `--mic` records from a microphone instead (the `mic` extra: sounddevice and PortAudio) until
Ctrl-C, which ends the recording like the end of a file: the utterance under way still gets its final.
Exit status as in nanoasr.cli.
"""
from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import time

import numpy as np

from nanoasr.audio import SAMPLE_RATE
from nanoasr.audio.vad import DEFAULT_VAD, VADS
from nanoasr.backend import ACTIVATIONS, DEVICES
from nanoasr.cli import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, compile_notice, error, library_warnings,
                         live_limits, positive)
from nanoasr.errors import NanoasrError, OptionError

PROG = "nanoasr stream"
STDIN = "-"
CHUNK_S = 0.1  # audio handed to the session at once: the pacing step of --realtime
MAX_RAW_RATE = 384_000
MIC_BACKLOG_S = 60  # recorded audio waiting for the decoder; more and the transcription has fallen behind
MIC_INSTALL = 'pip install ".[mic]" in the nanoasr checkout'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Live transcription of a stream: partials and "
                                     "finals as the audio arrives",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("input", nargs="?", default=STDIN, help="audio file, or - for stdin")
    parser.add_argument("--format", default="auto", choices=("auto", "s16le"),
                        help="s16le: raw PCM16 mono little-endian at --rate; auto: a file any decoder reads")
    parser.add_argument("--rate", type=positive(int), default=SAMPLE_RATE,
                        help="sample rate of raw input, Hz")
    parser.add_argument("--realtime", action="store_true", help="pace the input as live audio")
    parser.add_argument("--mic", action="store_true",
                        help="record from a microphone until Ctrl-C (needs the mic extra)")
    parser.add_argument("--input-device", default=None, metavar="DEVICE",
                        help="with --mic: the input device's number or a part of its name (default: the "
                             "system's)")
    parser.add_argument("--json", action="store_true", help="every event as a JSON line")
    parser.add_argument("--model", default=None,
                        help="checkpoint directory, .gguf or model.pt file, hub id or package name")
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="where to run")
    parser.add_argument("--threads", type=positive(int), default=None, help="CPU threads")
    parser.add_argument("--activations", default="auto", choices=ACTIVATIONS, help="see nanoasr --help")
    parser.add_argument("--language", default=None, help="language code or name (default: automatic)")
    parser.add_argument("--context", default=None, help="free text describing the recording")
    parser.add_argument("--hotword", action="append", default=[], metavar="WORD", help="a term to favour")
    parser.add_argument("--manual", action="store_true",
                        help="no voice activity detection: the whole input is one utterance")
    parser.add_argument("--silence-ms", type=int, default=None,
                        help="longest silence inside an utterance (default: FunASR's schedule, 2000 ms for "
                             "short utterances down to 100 ms for long ones)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="speech threshold, 0..1 as OpenAI's server_vad (higher: clearer speech only)")
    parser.add_argument("--vad", default=DEFAULT_VAD, choices=VADS,
                        help="voice activity detector: silero (trained) or energy (frame loudness)")
    parser.add_argument("--no-partials", action="store_true", help="finals only")
    parser.add_argument("--partial-interval", type=positive(float), default=None, metavar="SECONDS",
                        help="new audio between partials (default 0.48; at most the 8 s window): longer "
                             "costs less CPU")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rate > MAX_RAW_RATE:
        parser.error(f"--rate must be at most {MAX_RAW_RATE}; got {args.rate}")
    if args.mic and (args.input != STDIN or args.format != "auto" or args.realtime):
        parser.error("--mic records from the microphone: give no input, --format or --realtime with it")
    if args.input_device is not None and not args.mic:
        parser.error("--input-device chooses the microphone: use it with --mic")
    with (library_warnings(lambda message: print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)),
          compile_notice(lambda message: print(f"{PROG}: {message}", file=sys.stderr, flush=True))):
        try:
            microphone = Microphone.find(args.input_device) if args.mic else None
            session = _session(args)
        except OptionError as exc:
            error(PROG, exc)
            return EXIT_USAGE
        except NanoasrError as exc:
            error(PROG, exc)
            return EXIT_FAILED
        try:
            chunks = microphone.chunks() if microphone is not None else _chunks(args)
            _run(session, chunks, Printer(args.json, sys.stdout), args.realtime)
        except (NanoasrError, OSError) as exc:
            error(PROG, exc)
            return EXIT_FAILED
        finally:
            if session.scheduler is not None:
                session.scheduler.close()
    return EXIT_OK


def _session(args):
    """The live session on the loaded model; options are checked before the model loads (OptionError). Live
    input (--realtime, --mic) decodes through a DecodeScheduler, so that partials decode beside the
    listening (_run)."""
    from nanoasr.api import Model, Options
    from nanoasr.batching import DecodeScheduler
    from nanoasr.realtime import LiveSession, TurnDetection

    options = Options(language=args.language, context=args.context, hotwords=args.hotword)
    turn_detection = None if args.manual else TurnDetection(args.threshold,
                                                            silence_duration_ms=args.silence_ms)
    limits = live_limits(args, partials=not args.no_partials)
    model = Model.load(args.model, device=args.device, threads=args.threads, activations=args.activations)
    model.compile_beside()  # a first run: the decoder's kernels compile beside the encoder's
    scheduler = DecodeScheduler(model) if args.realtime or args.mic else None
    return LiveSession(model, options, turn_detection, limits, scheduler=scheduler)


def _chunks(args):
    """The input as [N] float32 chunks at 16 kHz of at most CHUNK_S seconds, read as they are needed."""
    if args.format == "s16le":
        return _file_chunks(_open(args.input), args.rate)
    from nanoasr.audio.io import load_audio

    wave = load_audio(sys.stdin.buffer.read() if args.input == STDIN else args.input)
    step = int(CHUNK_S * SAMPLE_RATE)
    return (wave[i:i + step] for i in range(0, len(wave), step))


def _open(path: str):
    return sys.stdin.buffer if path == STDIN else open(path, "rb")


def _file_chunks(file, rate: int):
    with file:
        yield from _raw_chunks(file.read, rate)


def _raw_chunks(read, rate: int):
    """PCM16 mono little-endian at `rate` from read(n bytes) (b"": the end), CHUNK_S at a time, resampled to
    16 kHz as it comes."""
    import soxr

    resampler = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32",
                                                                     quality="HQ")
    odd = b""
    while True:
        data = odd + read(int(CHUNK_S * rate) * 2)
        if len(data) <= len(odd):
            break
        whole = len(data) // 2 * 2
        data, odd = data[:whole], data[whole:]
        samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        yield samples if resampler is None else resampler.resample_chunk(samples)
    if resampler is not None:
        yield resampler.resample_chunk(np.zeros(0, np.float32), last=True)


class Microphone:
    """A sounddevice input stream, 16-bit mono at the device's own rate, read as CHUNK_S blocks through a
    queue that holds what was recorded while the decoder was busy (at most MIC_BACKLOG_S: past that, an
    error)."""

    def __init__(self, sounddevice, device, rate: int):
        self.sounddevice, self.device, self.rate = sounddevice, device, rate
        self.blocks: queue.Queue[bytes] = queue.Queue(maxsize=round(MIC_BACKLOG_S / CHUNK_S))
        self.overflowed = False
        self.stop = False

    @classmethod
    def find(cls, device: str | None) -> Microphone:
        """The microphone to record from, checked before the model loads (NanoasrError if there is none)."""
        try:
            import sounddevice
        except ImportError:
            raise NanoasrError(f"--mic needs the 'mic' extra (sounddevice): {MIC_INSTALL}") from None
        except OSError as exc:  # sounddevice imports, but finds no PortAudio library
            raise NanoasrError(f"--mic needs the PortAudio library ({exc}); on Debian or Ubuntu: "
                               "apt install libportaudio2") from None
        chosen = int(device) if device is not None and device.isdigit() else device
        try:
            info = sounddevice.query_devices(chosen, "input")
        except (ValueError, sounddevice.PortAudioError) as exc:
            raise NanoasrError(f"no microphone to record from ({exc})") from None
        return cls(sounddevice, chosen, int(info["default_samplerate"]))

    def chunks(self):
        """[N] float32 chunks at 16 kHz until Ctrl-C; a second Ctrl-C interrupts at once."""
        stream = self.sounddevice.RawInputStream(samplerate=self.rate, channels=1, dtype="int16",
                                                 device=self.device, blocksize=round(CHUNK_S * self.rate),
                                                 callback=self._recorded)
        previous = signal.signal(signal.SIGINT, self._interrupted)
        try:
            with stream:
                yield from _raw_chunks(self.read, self.rate)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _recorded(self, data, frames, time_info, status) -> None:  # on PortAudio's thread
        if self.stop:
            return
        try:
            self.blocks.put_nowait(bytes(data))
        except queue.Full:
            self.overflowed = True

    def _interrupted(self, signum, frame) -> None:
        self.stop = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def read(self, size: int) -> bytes:
        """The next recorded block (the stream's size, not `size`); after Ctrl-C the blocks recorded before
        it, then b""."""
        while True:
            if self.overflowed:
                raise NanoasrError(f"the transcription fell more than {MIC_BACKLOG_S} s behind the "
                                   "microphone")
            try:
                return self.blocks.get(timeout=CHUNK_S)
            except queue.Empty:
                if self.stop:
                    return b""


def _run(session, chunks, printer, realtime: bool) -> None:
    """Feed the chunks (paced as live audio when `realtime`), then end the stream; events go to `printer`.
    A session with a scheduler (live input) goes on listening while its partial decodes on the scheduler's
    thread, so that a final never waits for a partial; without one each feed decodes its partial before the
    next chunk is read, and the events are the same in every run."""
    start, fed, out = time.monotonic(), 0, None  # out: the partial decoding beside, and its answer
    for chunk in chunks:
        if realtime:
            time.sleep(max(0.0, start + fed / SAMPLE_RATE - time.monotonic()))
        fed += len(chunk)
        if session.scheduler is None:
            printer.show(session.feed(chunk))
            continue
        printer.show(session.feed(chunk, partial=False))
        if out is not None and out[1].done():
            printer.show(session.partial_answered(*out))
            out = None
        elif out is not None and out[0].cancelled.is_set():  # its answer would give nothing: not waited for
            out = None
        job = session.next_partial() if out is None else None
        if job is not None:
            out = job, session.submit_partial(job)
    printer.show(session.finish())


class Printer:
    """Events to `out`: JSON lines; or on a terminal the partial line rewritten in place, finals on their own
    lines; or into a pipe the finals alone."""

    def __init__(self, as_json: bool, out):
        self.as_json, self.out = as_json, out
        self.live = not as_json and out.isatty()
        self.partial = ""
        self.spans: dict[int, tuple[float, float]] = {}  # item -> (start, end) s, known once committed

    def show(self, events) -> None:
        for event in events:
            if self.as_json:
                self.out.write(json.dumps(self.record(event), ensure_ascii=False) + "\n")
            else:
                self.text(event)
        self.out.flush()

    def record(self, event) -> dict:
        from nanoasr import realtime as rt

        kind = {rt.SpeechStarted: "speech_started", rt.SpeechStopped: "speech_stopped", rt.Delta: "delta",
                rt.Committed: "committed", rt.Completed: "completed", rt.Failed: "failed"}[type(event)]
        out = {"type": kind, "item": event.item}
        if isinstance(event, rt.SpeechStarted):
            out["start"] = event.audio_start_ms / 1000
        elif isinstance(event, rt.SpeechStopped):
            out["end"] = event.audio_end_ms / 1000
        elif isinstance(event, rt.Committed):
            self.spans[event.item] = event.audio_start_ms / 1000, event.audio_end_ms / 1000
            out.update(start=self.spans[event.item][0], end=self.spans[event.item][1])
        elif isinstance(event, rt.Delta):
            out["text"] = event.text
        elif isinstance(event, rt.Failed):
            out["error"] = event.message
        else:
            start, end = self.spans.pop(event.item)
            out.update(text=event.transcript, start=start, end=end)
        return out

    def text(self, event) -> None:
        from nanoasr import realtime as rt

        if isinstance(event, rt.Delta) and self.live:
            self.partial += event.text
            self.out.write("\r\x1b[K" + self.partial)
        elif isinstance(event, (rt.Completed, rt.Failed)):
            line = event.transcript if isinstance(event, rt.Completed) else f"[failed: {event.message}]"
            self.out.write(("\r\x1b[K" if self.live else "") + line + "\n")
            self.partial = ""
