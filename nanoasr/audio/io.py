"""Audio input: a path, encoded bytes, a binary file object or an array -> float32 mono 16 kHz in [-1, 1].

libsndfile (through soundfile) decodes WAV, FLAC, OGG/Vorbis, Opus and MP3. Anything it cannot open
(m4a/mp4, webm, aac, ...) goes to the `ffmpeg` binary when it is on PATH. Multichannel audio is mixed to
mono by the mean of its channels and any sample rate is resampled to 16 kHz with soxr (HQ).

Every unusable input raises `AudioError` naming the source and the problem. Audio shorter than one
25 ms feature frame (400 samples at 16 kHz, after resampling) is rejected: no feature frame fits it.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from io import BytesIO

import numpy as np
import soundfile
import soxr

from nanoasr.errors import AudioError

SAMPLE_RATE = 16000
MIN_SAMPLES = 400  # one 25 ms fbank frame at 16 kHz
MIN_RATE, MAX_RATE = 1000, 768000
INSTALL_FFMPEG = "install ffmpeg (apt install ffmpeg / brew install ffmpeg)"

# Leading bytes of containers, for messages: which format a failed input claims to be.
MAGIC = ((8, b"WAVE", "WAV"), (0, b"RF64", "WAV"), (0, b"fLaC", "FLAC"), (0, b"OggS", "OGG"),
         (0, b"ID3", "MP3"), (0, b"FORM", "AIFF"), (4, b"ftyp", "MP4/M4A"),
         (0, b"\x1aE\xdf\xa3", "WebM/Matroska"))
FFMPEG_ONLY = {"MP4/M4A", "WebM/Matroska", "AAC"}
FFMPEG_SUFFIXES = {".m4a", ".mp4", ".m4b", ".mov", ".webm", ".mkv", ".aac", ".wma", ".amr", ".3gp", ".ac3"}


def load_audio(source, sample_rate: int | None = None) -> np.ndarray:  # source -> [N] float32, 16 kHz
    """Decode `source` to float32 mono 16 kHz samples in [-1, 1] scale.

    `source` is a path (str or os.PathLike), encoded file bytes (bytes, bytearray, memoryview), a binary
    file object (anything with `read()` returning bytes), or a numpy array with `sample_rate` given:
    1-D mono or 2-D [samples, channels]; int16/int32 are scaled to [-1, 1], float arrays are taken as is.
    Encoded input states its own rate, so `sample_rate` is for arrays only.

    Raises AudioError for a missing file, a directory, empty input, zero samples, a corrupt or truncated
    file, input that is not audio, NaN/Inf samples, a sample rate outside 1000-768000 Hz, arrays of the
    wrong shape or dtype, and audio shorter than 25 ms (400 samples at 16 kHz) after resampling.
    """
    name, wave, rate = _decode(source, sample_rate)
    _check_rate(rate, name)
    if wave.shape[0] == 0:
        raise AudioError(f"{name}: the audio has zero samples")
    mono = wave.mean(axis=1, dtype=np.float32) if wave.ndim == 2 else wave.astype(np.float32, copy=False)
    if not np.isfinite(mono).all():
        raise AudioError(f"{name}: the audio contains NaN or Inf samples")
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    if mono.shape[0] < MIN_SAMPLES:
        raise AudioError(f"{name}: the audio is {1e3 * mono.shape[0] / SAMPLE_RATE:.1f} ms long "
                         f"({mono.shape[0]} samples at 16 kHz), shorter than 25 ms, the length of one "
                         f"feature frame ({MIN_SAMPLES} samples)")
    return np.ascontiguousarray(mono, dtype=np.float32)


def duration_s(wave: np.ndarray) -> float:
    """Length in seconds of a 16 kHz waveform from `load_audio`."""
    return wave.shape[0] / SAMPLE_RATE


def _decode(source, sample_rate):  # -> (name, [N] or [N, C] samples, rate)
    if isinstance(source, np.ndarray):
        return "<array>", _from_array(source, sample_rate), sample_rate
    if sample_rate is not None:
        raise AudioError(f"sample_rate={sample_rate!r} was given with {type(source).__name__} input; "
                         "encoded audio states its own rate, so sample_rate is for numpy arrays only")
    if isinstance(source, (str, os.PathLike)):
        return (os.fspath(source),) + _from_path(os.fspath(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return ("<bytes>",) + _from_bytes(bytes(source), "<bytes>")
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        name = name if isinstance(name, str) else "<file object>"
        return (name,) + _from_bytes(_read_file_object(source, name), name)
    raise AudioError(f"expected a path, encoded bytes, a binary file object or a numpy array; "
                     f"got {type(source).__name__}")


def _from_array(array, sample_rate):  # [N] or [N, C] int16/int32/float -> same shape, float32 scale
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
        return array.astype(np.float32) / np.float32(2.0 ** (8 * size - 1))
    if kind == "f" and size in (4, 8):
        return array
    raise AudioError(f"<array>: expected int16, int32, float32 or float64 samples; got dtype {array.dtype}")


def _check_rate(rate, name):
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, np.integer)):
        raise AudioError(f"{name}: sample rate must be an integer in Hz; got {rate!r}")
    if rate <= 0:
        raise AudioError(f"{name}: sample rate must be positive; got {rate} Hz")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside the supported {MIN_RATE}-{MAX_RATE} Hz")


def _read_file_object(file, name):
    try:
        data = file.read()
    except (OSError, ValueError) as exc:
        raise AudioError(f"{name}: cannot read the file object: {exc}") from exc
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise AudioError(f"{name}: the file object returned {type(data).__name__}, not bytes; "
                         "open the file in binary mode ('rb')")
    return bytes(data)


def _from_path(path):  # -> ([N, C] float32, rate)
    if not os.path.exists(path):
        raise AudioError(f"{path}: no such file")
    if os.path.isdir(path):
        raise AudioError(f"{path}: is a directory, not an audio file")
    try:
        mode, size = os.stat(path).st_mode, os.path.getsize(path)
        with open(path, "rb") as file:
            # A pipe or device (/dev/stdin, a shell's <(...)) can be read once only, so it is read whole.
            head = file.read(16) if stat.S_ISREG(mode) else file.read()
    except OSError as exc:
        raise AudioError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        return _from_bytes(head, path)
    if size == 0:
        raise AudioError(f"{path}: the file is empty (0 bytes)")
    return _decode_encoded(path, head, os.path.splitext(path)[1].lower(), path=path)


def _from_bytes(data, name):  # -> ([N, C] float32, rate)
    if not data:
        raise AudioError(f"{name}: the input is empty (0 bytes)")
    return _decode_encoded(name, data[:16], os.path.splitext(name)[1].lower(), data=data)


def _decode_encoded(name, head, suffix, path=None, data=None):  # libsndfile first, then ffmpeg
    try:
        return soundfile.read(path if data is None else BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError, ValueError, OSError) as exc:
        libsndfile_exc = exc
    container, reason = _sniff(head), _libsndfile_reason(libsndfile_exc)
    if shutil.which("ffmpeg") is None:
        raise AudioError(_without_ffmpeg(name, container, suffix, reason)) from libsndfile_exc
    wave, ffmpeg_error = _ffmpeg_decode(path, data)
    if wave is None:
        raise AudioError(f"{name}: cannot be decoded: {_problem(container, reason)}; "
                         f"ffmpeg cannot decode it either ({ffmpeg_error})") from libsndfile_exc
    return wave[:, None], SAMPLE_RATE


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


def _ffmpeg_decode(path, data):  # -> ([N] float32 at 16 kHz, None) or (None, reason)
    # Bytes go through stdin; the "file:" prefix keeps ffmpeg from reading a path as a URL or protocol.
    target = "pipe:0" if path is None else f"file:{path}"
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-i", target,
               "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "f32le", "pipe:1"]
    try:
        done = subprocess.run(command, input=data, capture_output=True, check=False)
    except OSError as exc:
        return None, f"cannot run ffmpeg: {exc}"
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return None, lines[-1].removeprefix(f"{target}: ") if lines else f"exit status {done.returncode}"
    if len(done.stdout) < 4:
        return None, "it decoded no audio samples"
    return np.frombuffer(done.stdout, dtype="<f4", count=len(done.stdout) // 4).astype(np.float32), None
