"""load_audio: every accepted input kind and format against an analytic 440 Hz sine, and every rejected input."""
import io
import shutil
import subprocess
import wave as wavefile

import numpy as np
import pytest
import soundfile

from nanoasr.audio.io import MIN_SAMPLES, SAMPLE_RATE, duration_s, load_audio
from nanoasr.errors import AudioError

FREQ, AMP = 440.0, 0.5
FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="ffmpeg is not on PATH")


def sine(rate, seconds=1.0, freq=FREQ):  # [round(rate * seconds)] float32
    t = np.arange(round(rate * seconds)) / rate
    return (AMP * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write(path, wave, rate, fmt, subtype):
    if fmt not in soundfile.available_formats() or subtype not in soundfile.available_subtypes(fmt):
        pytest.skip(f"libsndfile {soundfile.__libsndfile_version__} cannot write {fmt}/{subtype}")
    soundfile.write(path, wave, rate, format=fmt, subtype=subtype)
    return path


def ffmpeg_encode(tmp_path, suffix, codec):
    src = write(tmp_path / "src.wav", sine(SAMPLE_RATE), SAMPLE_RATE, "WAV", "PCM_16")
    out = tmp_path / f"sine{suffix}"
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(src), "-c:a", codec, str(out)], check=True)
    return out


def aligned_snr_db(decoded, reference, edge=1024, max_lag=40):
    """SNR of `decoded` against `reference` (edges left out) at the shift, within about one period, that fits best."""
    core = reference[edge:-edge]
    snrs = [10 * np.log10(np.sum(core ** 2) / np.sum((decoded[edge + k:edge + k + len(core)] - core) ** 2))
            for k in range(-max_lag, max_lag + 1)]
    return max(snrs)


def peak_hz(wave):
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    return np.fft.rfftfreq(len(wave), 1 / SAMPLE_RATE)[np.argmax(spectrum)]


def stdlib_pcm(path):  # PCM WAV -> [N] float64 in [-1, 1], parsed by the standard library's wave module
    with wavefile.open(str(path)) as reader:
        width, raw = reader.getsampwidth(), reader.readframes(reader.getnframes())
    if width == 1:
        return (np.frombuffer(raw, np.uint8).astype(np.float64) - 128) / 128
    if width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        return ((b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8) / 2.0 ** 23
    return np.frombuffer(raw, f"<i{width}").astype(np.float64) / 2.0 ** (8 * width - 1)


def check_output(wave):
    assert wave.dtype == np.float32 and wave.ndim == 1 and wave.flags.c_contiguous


@pytest.mark.parametrize("subtype, step", [("PCM_U8", 2 ** -7), ("PCM_16", 2 ** -15), ("PCM_24", 2 ** -23),
                                           ("PCM_32", 2 ** -31), ("FLOAT", 0.0), ("DOUBLE", 0.0)])
def test_wav_subtypes_match_the_source_within_quantisation(tmp_path, subtype, step):
    source = sine(SAMPLE_RATE)
    path = write(tmp_path / "a.wav", source, SAMPLE_RATE, "WAV", subtype)
    wave = load_audio(path)
    check_output(wave)
    assert wave.shape == source.shape
    # Writing puts each sample on the integer grid (libsndfile truncates 8-bit, rounds wider): at most
    # one step off; float32 holds 24 bits, so 32-bit samples differ by float32 rounding too.
    np.testing.assert_allclose(wave, source, rtol=0, atol=step + 3e-8 if step else 0)
    if step:
        np.testing.assert_allclose(wave, stdlib_pcm(path), rtol=0, atol=3e-8)


def test_flac_is_lossless(tmp_path):
    source = sine(SAMPLE_RATE)
    wave = load_audio(write(tmp_path / "a.flac", source, SAMPLE_RATE, "FLAC", "PCM_16"))
    assert wave.shape == source.shape
    np.testing.assert_allclose(wave, source, rtol=0, atol=2 ** -16 + 2e-7)


@pytest.mark.parametrize("name, fmt, subtype, min_snr_db", [("a.ogg", "OGG", "VORBIS", 30.0),
                                                           ("a.opus", "OGG", "OPUS", 30.0),
                                                           ("a.mp3", "MP3", "MPEG_LAYER_III", 30.0)])
def test_lossy_codecs_keep_the_sine(tmp_path, name, fmt, subtype, min_snr_db):
    source = sine(SAMPLE_RATE)
    wave = load_audio(write(tmp_path / name, source, SAMPLE_RATE, fmt, subtype))
    check_output(wave)
    assert wave.shape == source.shape
    assert aligned_snr_db(wave, source) > min_snr_db
    assert peak_hz(wave) == pytest.approx(FREQ, abs=1.0)


@needs_ffmpeg
@pytest.mark.parametrize("suffix, codec, min_snr_db, padding", [(".m4a", "aac", 25.0, 1024),
                                                                 (".webm", "libopus", 35.0, 0)])
def test_ffmpeg_containers_decode(tmp_path, suffix, codec, min_snr_db, padding):
    path = ffmpeg_encode(tmp_path, suffix, codec)
    source = sine(SAMPLE_RATE)
    for wave in (load_audio(path), load_audio(path.read_bytes()), load_audio(open(path, "rb"))):
        check_output(wave)
        # AAC pads the stream to whole 1024-sample frames; Opus in WebM trims its pre-skip exactly.
        assert len(source) <= len(wave) <= len(source) + padding
        assert aligned_snr_db(wave, source) > min_snr_db
        assert peak_hz(wave) == pytest.approx(FREQ, abs=1.0)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_any_rate_is_resampled_to_16k(tmp_path, rate):
    wave = load_audio(write(tmp_path / "a.wav", sine(rate), rate, "WAV", "FLOAT"))
    assert wave.shape == (SAMPLE_RATE,)
    assert duration_s(wave) == pytest.approx(1.0)
    assert peak_hz(wave) == pytest.approx(FREQ, abs=1.0)
    # Away from the edges (filter start-up), the resampled signal is the 16 kHz sine itself.
    edge = 200
    np.testing.assert_allclose(wave[edge:-edge], sine(SAMPLE_RATE)[edge:-edge], rtol=0, atol=1e-5)


def test_stereo_is_mixed_to_the_mean(tmp_path):
    left, right = sine(SAMPLE_RATE), sine(SAMPLE_RATE, freq=1000.0)
    stereo = np.stack([left, right], axis=1)
    expected = (left + right) / 2
    from_file = load_audio(write(tmp_path / "s.wav", stereo, SAMPLE_RATE, "WAV", "FLOAT"))
    from_array = load_audio(stereo, sample_rate=SAMPLE_RATE)
    np.testing.assert_allclose(from_file, expected, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(from_file, from_array)


def test_path_bytes_file_object_and_array_inputs_agree(tmp_path):
    path = write(tmp_path / "a.wav", sine(SAMPLE_RATE), SAMPLE_RATE, "WAV", "PCM_16")
    data = path.read_bytes()
    reference = load_audio(path)
    with open(path, "rb") as file:
        from_file = load_audio(file)
    int16, _ = soundfile.read(path, dtype="int16")
    for wave in (load_audio(str(path)), load_audio(data), load_audio(bytearray(data)), load_audio(memoryview(data)),
                 load_audio(io.BytesIO(data)), from_file, load_audio(int16, sample_rate=SAMPLE_RATE),
                 load_audio(int16.astype(np.float64) / 32768, sample_rate=SAMPLE_RATE)):
        check_output(wave)
        np.testing.assert_array_equal(wave, reference)


def test_integer_arrays_are_scaled_to_unit_range():
    int32 = np.array([0, 2 ** 30, -2 ** 31] * 200, dtype=np.int32)
    np.testing.assert_array_equal(load_audio(int32, sample_rate=SAMPLE_RATE)[:3], [0.0, 0.5, -1.0])
    big_endian = np.array([16384, -32768] * 300, dtype=">i2")
    np.testing.assert_array_equal(load_audio(big_endian, sample_rate=SAMPLE_RATE)[:2], [0.5, -1.0])


def test_shortest_accepted_audio_is_one_25ms_frame():
    assert len(load_audio(np.zeros(MIN_SAMPLES, np.float32), sample_rate=SAMPLE_RATE)) == MIN_SAMPLES
    with pytest.raises(AudioError, match=r"24\.9 ms .*shorter than 25 ms"):
        load_audio(np.zeros(MIN_SAMPLES - 1, np.float32), sample_rate=SAMPLE_RATE)
    # 1197 samples at 48 kHz are 24.9 ms, 399 samples at 16 kHz: the rule applies after resampling.
    with pytest.raises(AudioError, match=r"\(399 samples at 16 kHz\), shorter than 25 ms"):
        load_audio(np.zeros(1197, np.float32), sample_rate=48000)
