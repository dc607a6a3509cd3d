"""Audio input: a path, encoded bytes, a binary file object or an array -> float32 mono 16 kHz in [-1, 1].

libsndfile (through soundfile) decodes WAV, FLAC, OGG/Vorbis, Opus and MP3. Anything it cannot open
(m4a/mp4, webm, aac, ...) goes to the `ffmpeg` binary when it is on PATH. Multichannel audio is mixed to
mono by the mean of its channels and any sample rate is resampled to 16 kHz with soxr (HQ).

`decode_audio` returns the samples with the source's name (a DecodedAudio), which Model.transcribe takes
without decoding or checking them again; `load_audio` returns the samples alone.

Every unusable input raises `AudioError` naming the source and the problem. Audio shorter than one
25 ms feature frame (400 samples at 16 kHz, after resampling) is rejected: no feature frame fits it.

Untrusted input is bounded:
- Decoding runs block by block into one float32 output, so memory is 4 bytes per 16 kHz output sample
  plus O(block), whatever the compression ratio. `max_duration_s` refuses longer audio with
  `AudioTooLongError`: from the length the container states, before decoding, and by counting samples
  while decoding (a container may state no length, or lie).
- ffmpeg decodes only the bytes it is given: they reach it on stdin, it may use the `pipe` protocol only
  and the single-file demuxers in FFMPEG_FORMATS only, so a playlist (HLS, concat, image sequence) cannot
  make it open another file or a URL. Text playlists are refused before ffmpeg runs. An MP4 path that a
  pipe cannot decode (its index after the audio) is read as that file, with the `file` protocol and the
  mov demuxer alone. ffmpeg is killed (SIGKILL) after `ffmpeg_timeout_s(size)` seconds, or as soon as the
  caller stops reading.
- Audio that peaks above LOUD_PEAK (far past full scale, 1.0) is scaled to peak 1.0 before resampling
  (which may overshoot it a little), with a warning, so huge finite samples reach no kernel; channels are
  mixed without overflow, so float64 samples near its largest value (1.8e308) are loud audio, not NaN.
- A character or block device (/dev/zero, a terminal) is refused. A pipe, a FIFO, stdin and any file
  object are read into memory with a cap, STREAM_MAX_BYTES; only a regular file given by its path is
  decoded from the file, as long as it is.
- Text playlists are recognized in UTF-8, UTF-16 and UTF-32, and other UTF-16/32 text too, before any
  decoder sees them (libsndfile would take a UTF-16 byte-order mark for an MPEG frame).
- `DEFAULT_MAX_DURATION_S` is the duration limit the command line and the server apply unless told
  otherwise; the library applies none unless given one.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import shutil
import stat
import subprocess
import threading
from contextlib import closing
from dataclasses import dataclass
from io import BytesIO

import numpy as np
import soundfile
import soxr

from nanoasr.audio import SAMPLE_RATE
from nanoasr.errors import AudioError, AudioTooLongError, OptionError
from nanoasr.untrusted import ReadRefused, kind_of, read_capped

log = logging.getLogger(__name__)

MIN_SAMPLES = 400  # one 25 ms fbank frame at 16 kHz
MIN_RATE, MAX_RATE = 1000, 768000
INSTALL_FFMPEG = "install ffmpeg (apt install ffmpeg / brew install ffmpeg)"
BLOCK_VALUES = 1 << 18  # samples x channels decoded at once (2 MB as float64)
MAX_PREALLOC = 1 << 26  # output samples reserved up front at most (70 min), whatever a header claims
UNKNOWN_PREALLOC = 1 << 20  # output samples reserved (65 s) for a source that states no length; it grows
SF_COUNT_MAX = 2 ** 63 - 1  # libsndfile's frame count for a container that states no length
LOUD_PEAK = 8.0  # float files may pass full scale a little; 8x full scale is no recording
# The duration limit of the command line (`nanoasr`, `nanoasr batch`) and the server unless the user sets
# another: an hour at 16 kHz is 230 MB of float32 samples, and a container stating more is refused before
# decoding. Library calls have no limit unless given one (max_duration_s).
DEFAULT_MAX_DURATION_S = 3600.0
# Bytes read into memory from a pipe, FIFO, stdin or file object: an hour of 48 kHz stereo 16-bit WAV is
# 0.7 GB. A regular file given by its path is decoded from the file instead, whatever its size.
STREAM_MAX_BYTES = 1 << 30
HEAD_BYTES = 64  # leading bytes kept to recognize a container or a playlist (UTF-32 "#EXTM3U" takes 32)
FFMPEG_TIMEOUT_FLOOR_S = 60.0
FFMPEG_MIN_BYTES_PER_S = 1 << 20  # ffmpeg decodes compressed audio far faster than 1 MB of input per second
FFMPEG_CHUNK = 1 << 16  # bytes moved through ffmpeg's pipes at once
STDERR_TAIL = 1 << 16  # bytes of ffmpeg's messages kept for the error
# Demuxers of single-file audio containers; none of them opens another file. Playlist-like demuxers (hls,
# concat, image2, dash, ...) are left out.
FFMPEG_FORMATS = "aac,ac3,aiff,amr,ape,asf,caf,eac3,flac,matroska,mov,mp3,mpegts,ogg,w64,wav,wv"
PLAYLIST_MAGIC = (("#EXTM3U", "an HLS/M3U playlist"), ("ffconcat", "an ffmpeg concat script"))
# Byte-order marks of Unicode text, the longer first (UTF-32-LE's begins with UTF-16-LE's)
TEXT_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xef\xbb\xbf", "UTF-8"),
             (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))

# Leading bytes of containers, for messages: which format a failed input claims to be.
MAGIC = ((8, b"WAVE", "WAV"), (0, b"RF64", "WAV"), (0, b"fLaC", "FLAC"), (0, b"OggS", "OGG"),
         (0, b"ID3", "MP3"), (0, b"FORM", "AIFF"), (4, b"ftyp", "MP4/M4A"),
         (0, b"\x1aE\xdf\xa3", "WebM/Matroska"))
FFMPEG_ONLY = {"MP4/M4A", "WebM/Matroska", "AAC"}
FFMPEG_SUFFIXES = {".m4a", ".mp4", ".m4b", ".mov", ".webm", ".mkv", ".aac", ".wma", ".amr", ".3gp", ".ac3"}


class _FfmpegError(Exception):
    """ffmpeg could not decode the input; the message says why."""


@dataclass(frozen=True)
class DecodedAudio:
    """What decode_audio returns: the samples ([N] float32 mono at 16 kHz, finite, at least MIN_SAMPLES)
    and the name of their source. load_audio and Model.transcribe take it as it is, without decoding or
    checking its samples again."""

    samples: np.ndarray
    name: str

    def __post_init__(self):  # the cheap checks; the samples' values were checked when they were decoded
        s = self.samples
        if not (isinstance(s, np.ndarray) and s.dtype == np.float32 and s.ndim == 1
                and len(s) >= MIN_SAMPLES):
            raise AudioError(f"{self.name}: DecodedAudio holds at least {MIN_SAMPLES} float32 samples in a "
                             f"1-D array, as decode_audio makes it; got {type(s).__name__} "
                             f"{getattr(s, 'dtype', '')} {getattr(s, 'shape', '')}")

    @property
    def duration_s(self) -> float:
        return duration_s(self.samples)


def load_audio(source, sample_rate: int | None = None, *,
               max_duration_s: float | None = None) -> np.ndarray:  # source -> [N] float32, 16 kHz
    """The samples of decode_audio(source, ...)."""
    return decode_audio(source, sample_rate, max_duration_s=max_duration_s).samples


def decode_audio(source, sample_rate: int | None = None, *,
                 max_duration_s: float | None = None) -> DecodedAudio:  # source -> [N] float32, 16 kHz
    """Decode `source` to float32 mono 16 kHz samples in [-1, 1] scale, with the source's name.

    `source` is a path (str or os.PathLike), encoded file bytes (bytes, bytearray, memoryview), a binary
    file object (anything with `read()` returning bytes), or a numpy array with `sample_rate` given:
    1-D mono or 2-D [samples, channels]; int16/int32 are scaled to [-1, 1], float arrays are taken as is.
    Encoded input states its own rate, so `sample_rate` is for arrays only. A DecodedAudio is returned as
    it is (once checked against `max_duration_s`).

    `max_duration_s` (seconds, default no limit) refuses longer audio with AudioTooLongError, before
    decoding when the container states its length. Audio peaking above LOUD_PEAK is scaled to peak 1.0
    and a warning is logged.

    Raises AudioError for a missing file, a directory, empty input, zero samples, a corrupt or truncated
    file, input that is not audio, a playlist, NaN/Inf samples, a sample rate outside 1000-768000 Hz,
    arrays of the wrong shape or dtype, and audio shorter than 25 ms (400 samples at 16 kHz) after
    resampling; OptionError for a `max_duration_s` that is not a positive number.
    """
    limit = _check_limit(max_duration_s)
    if isinstance(source, DecodedAudio):
        return _decoded_already(source, sample_rate, limit)
    name, mono = _decode(source, sample_rate, limit)  # [N] float32 at 16 kHz
    if mono.shape[0] < MIN_SAMPLES:
        raise AudioError(f"{name}: the audio is {1e3 * mono.shape[0] / SAMPLE_RATE:.1f} ms long "
                         f"({mono.shape[0]} samples at 16 kHz), shorter than 25 ms, the length of one "
                         f"feature frame ({MIN_SAMPLES} samples)")
    return DecodedAudio(mono, name)


def duration_s(wave: np.ndarray) -> float:
    """Length in seconds of a 16 kHz waveform from `load_audio`."""
    return wave.shape[0] / SAMPLE_RATE


def ffmpeg_timeout_s(size: int) -> float:
    """Seconds ffmpeg may take for `size` bytes of input before it is killed: generous for real files."""
    return FFMPEG_TIMEOUT_FLOOR_S + size / FFMPEG_MIN_BYTES_PER_S


def _check_limit(max_duration_s):  # -> seconds or None
    if max_duration_s is None:
        return None
    if (isinstance(max_duration_s, bool) or not isinstance(max_duration_s, numbers.Real)
            or not math.isfinite(max_duration_s) or max_duration_s <= 0):
        raise OptionError(f"max_duration_s must be a positive number of seconds, or None for no limit; "
                          f"got {max_duration_s!r}")
    return float(max_duration_s)


def _decoded_already(audio: DecodedAudio, sample_rate, limit) -> DecodedAudio:
    if sample_rate is not None:
        raise AudioError(f"{audio.name}: sample_rate={sample_rate!r} was given with DecodedAudio input, "
                         "which is at 16 kHz already; sample_rate is for numpy arrays only")
    if limit is not None and audio.duration_s > limit:
        raise _too_long(audio.name, limit, audio.duration_s)
    return audio


def _too_long(name, limit, seconds=None):
    length = "longer than" if seconds is None else f"{seconds:g} s long, longer than"
    return AudioTooLongError(f"{name}: the audio is {length} the {limit:g} s duration limit")


def _decode(source, sample_rate, limit):  # -> (name, [N] float32 at 16 kHz)
    if isinstance(source, np.ndarray):
        return "<array>", _from_array(source, sample_rate, limit)
    if sample_rate is not None:
        raise AudioError(f"sample_rate={sample_rate!r} was given with {type(source).__name__} input; "
                         "encoded audio states its own rate, so sample_rate is for numpy arrays only")
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source), _from_path(os.fspath(source), limit)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "<bytes>", _from_bytes(bytes(source), "<bytes>", limit)
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        name = name if isinstance(name, str) else "<file object>"
        return name, _from_bytes(_read_file_object(source, name), name, limit)
    raise AudioError(f"expected a path, encoded bytes, a binary file object or a numpy array; "
                     f"got {type(source).__name__}")


def _from_array(array, sample_rate, limit):  # [N] or [N, C] int16/int32/float -> [M] float32 at 16 kHz
    if sample_rate is None:
        raise AudioError("<array>: a numpy array needs sample_rate=<Hz>; got sample_rate=None")
    if array.ndim not in (1, 2):
        raise AudioError(f"<array>: expected a 1-D [samples] or 2-D [samples, channels] array; "
                         f"got shape {array.shape}")
    if array.ndim == 2 and array.shape[1] > array.shape[0] > 0:
        raise AudioError(f"<array>: a 2-D array is [samples, channels]; got shape {array.shape}, "
                         f"more channels than samples (pass the transposed array)")
    kind, size = array.dtype.kind, array.dtype.itemsize  # by kind and size, so either byte order is accepted
    if kind == "i" and size in (2, 4):
        full_scale = 2.0 ** (8 * size - 1)
    elif kind == "f" and size in (4, 8):
        full_scale = 1.0
    else:
        raise AudioError(f"<array>: expected int16, int32, float32 or float64 samples; "
                         f"got dtype {array.dtype}")
    _check_rate(sample_rate, "<array>")
    if limit is not None and array.shape[0] > limit * sample_rate:
        raise _too_long("<array>", limit, array.shape[0] / sample_rate)
    step = max(1, BLOCK_VALUES // (array.shape[1] if array.ndim == 2 else 1))

    def blocks():  # -> [B] or [B, C] views
        return (array[i:i + step] for i in range(0, array.shape[0], step))

    return _gather(blocks, sample_rate, "<array>", limit, _output_length(array.shape[0], sample_rate),
                   full_scale)


def _check_rate(rate, name):
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, np.integer)):
        raise AudioError(f"{name}: sample rate must be an integer in Hz; got {rate!r}")
    if rate <= 0:
        raise AudioError(f"{name}: sample rate must be positive; got {rate} Hz")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside the supported {MIN_RATE}-{MAX_RATE} Hz")


def _read_file_object(file, name):
    """The bytes of a file object, read up to STREAM_MAX_BYTES (an in-memory BytesIO is taken whole: its
    bytes are in memory already); a device (stdin from /dev/zero, a terminal) is refused unread."""
    _refuse_device(file, name)
    try:
        if hasattr(file, "getbuffer"):
            data = file.read()
        else:
            data = read_capped(file, STREAM_MAX_BYTES)
    except ReadRefused as exc:
        raise AudioError(f"{name}: the input {exc}; give a file's path to decode a larger file from disk"
                         ) from None
    except TypeError as exc:  # read() returned something other than bytes, or takes no size
        data = _read_sizeless(file, name, exc)
    except (OSError, ValueError) as exc:
        raise AudioError(f"{name}: cannot read the file object: {exc}") from exc
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise AudioError(f"{name}: the file object returned {type(data).__name__}, not bytes; "
                         "open the file in binary mode ('rb')")
    return bytes(data)


def _read_sizeless(file, name, exc):
    """read() of a file object whose read takes no size: whole, then checked against the cap."""
    try:
        data = file.read()
    except TypeError:
        raise AudioError(f"{name}: cannot read the file object: {exc}") from exc
    except (OSError, ValueError) as error:
        raise AudioError(f"{name}: cannot read the file object: {error}") from error
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > STREAM_MAX_BYTES:
        raise AudioError(f"{name}: the input holds more than the {STREAM_MAX_BYTES >> 20} MiB that may be "
                         "read from it; give a file's path to decode a larger file from disk")
    return data


def _refuse_device(file, name):
    """A file object on a character or block device (stdin from /dev/zero, a terminal) never ends."""
    try:
        fd = file.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError, TypeError):
        return  # no descriptor: an in-memory or custom file object
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "a terminal" if os.isatty(fd) else kind_of(mode)
        raise AudioError(f"{name}: is {what}, not audio; pipe or redirect an audio file into it")


def path_problem(path) -> str | None:
    """Why the file at `path` cannot be read, seen without opening it: there is none, or this process may not
    read it; None otherwise. load_audio refuses such a path with it; the CLI says it of each input before it
    loads a model."""
    if not os.path.exists(path):
        return "no such file"
    if not os.access(path, os.R_OK):
        return "not readable (permission denied)"
    return None


def _from_path(path, limit):  # -> [N] float32 at 16 kHz
    problem = path_problem(path)
    if problem is not None:
        raise AudioError(f"{path}: {problem}")
    if os.path.isdir(path):
        raise AudioError(f"{path}: is a directory, not an audio file")
    try:
        info = os.stat(path)
        mode, size = info.st_mode, info.st_size
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # /dev/zero, /dev/tty, a socket
            raise AudioError(f"{path}: is {kind_of(mode)}, not an audio file")
        with open(path, "rb") as file:
            if stat.S_ISREG(mode):
                head = file.read(HEAD_BYTES)
            else:  # a pipe (/dev/stdin, a shell's <(...)) can be read once only, so it is read, with a cap
                head = read_capped(file, STREAM_MAX_BYTES)
    except ReadRefused as exc:
        raise AudioError(f"{path}: the pipe {exc}; save the audio to a file and give its path") from None
    except OSError as exc:
        raise AudioError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        return _from_bytes(head, path, limit)
    if size == 0:
        raise AudioError(f"{path}: the file is empty (0 bytes)")
    return _decode_encoded(path, head, os.path.splitext(path)[1].lower(), limit, path=path)


def _from_bytes(data, name, limit):  # -> [N] float32 at 16 kHz
    if not data:
        raise AudioError(f"{name}: the input is empty (0 bytes)")
    return _decode_encoded(name, data[:HEAD_BYTES], os.path.splitext(name)[1].lower(), limit, data=data)


def _decode_encoded(name, head, suffix, limit, path=None, data=None):  # libsndfile first, then ffmpeg
    _refuse_text(head, name)  # before libsndfile, which takes a UTF-16 BOM for an MPEG frame and says so
    try:
        # a path as bytes: soundfile encodes a str strictly, which fails on a name's bytes that are not UTF-8
        with soundfile.SoundFile(os.fsencode(path) if data is None else BytesIO(data)) as file:
            return _from_soundfile(file, name, limit)
    except AudioError:
        raise
    except (soundfile.SoundFileError, RuntimeError, ValueError, OSError) as exc:
        libsndfile_exc = exc.with_traceback(None)  # its frames would keep a partly decoded wave alive
    container, reason = _sniff(head), _libsndfile_reason(libsndfile_exc)
    if shutil.which("ffmpeg") is None:
        raise AudioError(_without_ffmpeg(name, container, suffix, reason)) from libsndfile_exc
    try:
        return _ffmpeg_decode(name, limit, path, data, container)
    except _FfmpegError as exc:
        raise AudioError(f"{name}: cannot be decoded: {_problem(container, reason)}; "
                         f"ffmpeg cannot decode it either ({exc})") from libsndfile_exc


def _from_soundfile(file, name, limit):  # an open soundfile.SoundFile -> [N] float32 at 16 kHz
    rate = file.samplerate
    _check_rate(rate, name)
    stated = file.frames if file.frames < SF_COUNT_MAX else None
    if limit is not None and stated is not None and stated > limit * rate:
        raise _too_long(name, limit, stated / rate)
    step = max(1, BLOCK_VALUES // file.channels)

    def blocks():  # -> [B, C] float64, from the start
        file.seek(0)
        while len(block := file.read(step, dtype="float64", always_2d=True)):
            yield block

    capacity = UNKNOWN_PREALLOC if stated is None else _output_length(stated, rate)
    return _gather(blocks, rate, name, limit, capacity)


def _output_length(frames, rate):  # room reserved for `frames` input frames once at 16 kHz
    return min(frames * SAMPLE_RATE // rate + 1, MAX_PREALLOC)


def _gather(blocks, rate, name, limit, capacity, full_scale=1.0):  # -> [N] float32 at 16 kHz
    """Decode `blocks()` to 16 kHz; audio far louder than full scale is decoded again, scaled to peak 1.0
    before the cast to float32 (float64 samples may lie beyond float32's range)."""
    wave, peak = _to_16k(blocks(), rate, name, limit, capacity, full_scale)
    if peak <= LOUD_PEAK:
        return wave
    _warn_loud(name, peak)
    del wave  # freed before the second pass
    return _to_16k(blocks(), rate, name, limit, capacity, full_scale * peak)[0]


def _to_16k(blocks, rate, name, limit, capacity, divisor):  # -> ([N] float32 at 16 kHz, peak of the input)
    resampler = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32",
                                                                     quality="HQ")
    max_frames = math.inf if limit is None else limit * rate
    wave, filled, frames, peak = np.empty(capacity, np.float32), 0, 0, 0.0
    for block in blocks:
        mono = _mono(block, name) / divisor  # [B] float64, finite
        frames += mono.shape[0]
        if frames > max_frames:
            raise _too_long(name, limit)
        peak = max(peak, float(np.abs(mono).max(initial=0.0)))
        with np.errstate(over="ignore"):  # samples past float32's range: this pass is redone, scaled
            samples = mono.astype(np.float32)
        filled = _append(wave, filled, samples if resampler is None else resampler.resample_chunk(samples))
    if frames == 0:
        raise AudioError(f"{name}: the audio has zero samples")
    if resampler is not None:
        filled = _append(wave, filled, resampler.resample_chunk(np.zeros(0, np.float32), last=True))
    wave.resize(filled, refcheck=False)  # in place (realloc): no second copy of the output
    return wave, peak


def _mono(block, name):  # [B] or [B, C] -> [B] float64, the mean of the channels; AudioError for NaN/Inf
    block = block.astype(np.float64)
    if not np.isfinite(block).all():
        raise AudioError(f"{name}: the audio contains NaN or Inf samples")
    if block.ndim == 1:
        return block
    with np.errstate(over="ignore"):
        mono = block.mean(axis=1)
    if not np.isfinite(mono).all():  # finite samples near float64's largest: their sum overflowed
        mono = (block / block.shape[1]).sum(axis=1)  # each channel's share first: no sum exceeds the peak
    return mono


def _append(wave, filled, samples):  # -> new fill; `wave` grows in place past the length a container stated
    end = filled + samples.shape[0]
    if end > wave.shape[0]:
        wave.resize(max(end, 2 * wave.shape[0]), refcheck=False)
    wave[filled:end] = samples
    return end


def _warn_loud(name, peak):
    log.warning("%s: the audio peaks at %.3g, far beyond full scale (1.0); it is scaled to peak 1.0",
                name, peak)


def _refuse_text(head, name):
    """A playlist (it names other files or URLs; only the bytes given are decoded) in UTF-8, UTF-16 or
    UTF-32, with or without a byte-order mark, and UTF-16/32 text of any kind: one AudioError that says so."""
    text, encoding = _as_text(head)
    stripped = text.lstrip(" \t\r\n")
    for magic, kind in PLAYLIST_MAGIC:
        if stripped.startswith(magic):
            told = f" ({encoding} text)" if encoding not in (None, "UTF-8") else ""
            raise AudioError(f"{name}: is {kind}{told}, not audio; playlists are refused, since they name "
                             "other files or URLs and only the bytes given are decoded")
    if (encoding in ("UTF-16", "UTF-32") and stripped and "\ufffd" not in text
            and all(c.isprintable() or c.isspace() for c in text)):
        raise AudioError(f"{name}: is {encoding} text, not audio")


def _as_text(head):  # -> (the leading bytes as text, the encoding a BOM or NUL pattern names, or None)
    for bom, encoding in TEXT_BOMS:
        if head.startswith(bom):  # Python's utf-16, utf-32 and utf-8-sig codecs read the BOM themselves
            return _decoded(head, {"UTF-8": "utf-8-sig"}.get(encoding, encoding.lower())), encoding
    if len(head) >= 8:  # without a BOM: ASCII with NUL bytes between, as UTF-16 or UTF-32 write it
        for encoding, codec, width in (("UTF-32", "utf-32-le", 4), ("UTF-32", "utf-32-be", 4),
                                       ("UTF-16", "utf-16-le", 2), ("UTF-16", "utf-16-be", 2)):
            ascii_at = 0 if codec.endswith("le") else width - 1
            units = [head[i:i + width] for i in range(0, 4 * width, width)]
            if all(u[ascii_at] != 0 and u.count(0) == width - 1 for u in units):
                return _decoded(head, codec), encoding
    return head.decode("latin-1"), None


def _decoded(data, codec):  # a unit cut by the end of the head is left out; undecodable units become U+FFFD
    width = 4 if "32" in codec else 2 if "16" in codec else 1
    return data[:len(data) - len(data) % width].decode(codec, errors="replace")


def _sniff(head):  # leading bytes -> container name or None
    for offset, magic, container in MAGIC:
        if head[offset:offset + len(magic)] == magic:
            return container
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF0 == 0xF0 and head[1] & 0x06 == 0:
        return "AAC"  # ADTS: sync word with layer bits 00
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "MP3"  # MPEG audio frame sync
    return None


def _libsndfile_reason(exc):  # soundfile's message without the "Error opening <object>: " prefix
    return str(exc).rpartition(": ")[2].strip().rstrip(".") or type(exc).__name__


def _problem(container, reason):
    if container is None:
        return f"not audio in any format libsndfile reads ({reason})"
    return f"a truncated or corrupt {container} file ({reason})"


def _without_ffmpeg(name, container, suffix, reason):
    if container in FFMPEG_ONLY or suffix in FFMPEG_SUFFIXES:
        kind = f"{suffix} files" if suffix in FFMPEG_SUFFIXES else f"{container} audio"
        return f"{name}: cannot be decoded without ffmpeg: {INSTALL_FFMPEG} to read {kind}"
    return (f"{name}: cannot be decoded: {_problem(container, reason)}; "
            f"for other containers (m4a, webm, aac, ...) {INSTALL_FFMPEG}")


def _ffmpeg_decode(name, limit, path, data, container):  # -> [N] float32 at 16 kHz, or _FfmpegError
    try:
        source = BytesIO(data) if path is None else open(path, "rb")
        size = len(data) if path is None else os.fstat(source.fileno()).st_size
    except OSError as exc:
        raise _FfmpegError(f"cannot read the file: {exc.strerror or exc}") from exc
    piped = _ffmpeg_command("pipe:0", "pipe", FFMPEG_FORMATS)
    try:
        return _ffmpeg_wave(name, limit, _ffmpeg_output(piped, source, size))
    except _FfmpegError:
        if path is None or container != "MP4/M4A":
            raise
    # An MP4 may keep its index (moov) after the audio, out of reach on a pipe, which cannot seek back. Then
    # ffmpeg reads the file itself, through the mov demuxer alone, which opens no other file (its external
    # data references are off by default).
    direct = _ffmpeg_command(f"file:{path}", "file", "mov")
    return _ffmpeg_wave(name, limit, _ffmpeg_output(direct, None, size))


def _ffmpeg_command(target, protocols, formats):
    return ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-protocol_whitelist", protocols,
            "-format_whitelist", formats, "-i", target,
            "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "f32le", "pipe:1"]


def _ffmpeg_wave(name, limit, chunks):  # ffmpeg's output chunks -> [N] float32 at 16 kHz
    with closing(chunks):  # closing kills ffmpeg as soon as decoding stops, finished or not
        wave, peak = _to_16k(chunks, SAMPLE_RATE, name, limit, UNKNOWN_PREALLOC, 1.0)
    if peak > LOUD_PEAK:  # float32 from ffmpeg: scaling after the cast cannot overflow
        _warn_loud(name, peak)
        wave *= np.float32(1.0 / peak)
    return wave


def _ffmpeg_output(command, source, size):  # -> float32 16 kHz mono chunks [B] decoded by ffmpeg
    """Runs `command`, feeding it `source` (a binary file, or None) on stdin. ffmpeg is killed after
    `ffmpeg_timeout_s(size)` seconds, and whenever this generator stops, finished or not."""
    timeout_s = ffmpeg_timeout_s(size)
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL if source is None else subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        if source is not None:
            source.close()
        raise _FfmpegError(f"cannot run ffmpeg: {exc}") from exc
    feed_errors, messages, timed_out = [], bytearray(), threading.Event()
    helpers = [threading.Thread(target=_drain, args=(process.stderr, messages), daemon=True)]
    if source is not None:
        feeder = threading.Thread(target=_feed, args=(source, process.stdin, feed_errors), daemon=True)
        helpers.append(feeder)
    watchdog = threading.Timer(timeout_s, _stop, args=(process, timed_out))
    try:
        for thread in [*helpers, watchdog]:
            thread.start()
        decoded = 0
        while chunk := process.stdout.read(FFMPEG_CHUNK):
            decoded += len(chunk)
            yield np.frombuffer(chunk, "<f4", count=len(chunk) // 4)
        process.wait()
        for thread in helpers:
            thread.join()
        if timed_out.is_set():
            raise _FfmpegError(f"it did not finish within {timeout_s:.0f} s and was stopped")
        if feed_errors:
            raise _FfmpegError(f"reading the input failed: {feed_errors[0]}")
        if process.returncode != 0:
            lines = messages.decode(errors="replace").strip().splitlines()
            target = command[command.index("-i") + 1]
            raise _FfmpegError(lines[-1].removeprefix(f"{target}: ") if lines
                               else f"exit status {process.returncode}")
        if decoded < 4:
            raise _FfmpegError("it decoded no audio samples")
    finally:
        watchdog.cancel()
        process.kill()  # SIGKILL: ffmpeg ignores SIGTERM while it waits for input
        process.wait()
        for thread in helpers:
            thread.join()
        process.stdout.close()
        process.stderr.close()


def _feed(source, stdin, errors):  # thread: source -> ffmpeg's stdin; ends when ffmpeg stops reading
    try:
        with source, stdin:
            while chunk := source.read(FFMPEG_CHUNK):
                stdin.write(chunk)
    except BrokenPipeError:
        pass  # ffmpeg exited or was killed: its own status says why
    except OSError as exc:
        errors.append(exc)


def _drain(stderr, messages):  # thread: keeps the last STDERR_TAIL bytes of ffmpeg's messages
    while chunk := stderr.read(FFMPEG_CHUNK):
        messages += chunk
        del messages[:-STDERR_TAIL]


def _stop(process, timed_out):  # the watchdog's action
    timed_out.set()
    process.kill()
