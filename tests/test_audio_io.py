"""load_audio: every accepted input kind and format against an analytic 440 Hz sine, and every rejected
input; decode_audio's DecodedAudio, taken as it is."""
import io
import os
import shutil
import subprocess
import threading
import wave as wavefile

import numpy as np
import pytest
import soundfile

from nanoasr.audio import io as audio_io
from nanoasr.audio.io import MIN_SAMPLES, SAMPLE_RATE, DecodedAudio, decode_audio, duration_s, load_audio
from nanoasr.errors import AudioError, AudioTooLongError

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
    subprocess.run([FFMPEG, "-nostdin", "-loglevel", "error", "-i", str(src), "-c:a", codec, str(out)],
                   check=True)
    return out


def aligned_snr_db(decoded, reference, edge=1024, max_lag=40):
    """SNR of `decoded` against `reference` (edges left out) at the shift, within about one period, that
    fits best."""
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


@pytest.fixture
def wav_bytes(tmp_path):
    return write(tmp_path / "ok.wav", sine(SAMPLE_RATE), SAMPLE_RATE, "WAV", "PCM_16").read_bytes()


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
    for wave in (load_audio(str(path)), load_audio(data), load_audio(bytearray(data)),
                 load_audio(memoryview(data)), load_audio(io.BytesIO(data)), from_file,
                 load_audio(int16, sample_rate=SAMPLE_RATE),
                 load_audio(int16.astype(np.float64) / 32768, sample_rate=SAMPLE_RATE)):
        check_output(wave)
        np.testing.assert_array_equal(wave, reference)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_decoded_audio_is_passed_on_without_decoding_again(tmp_path, monkeypatch):
    path = tmp_path / "a.wav"
    soundfile.write(path, sine(SAMPLE_RATE, 2.0), SAMPLE_RATE, subtype="FLOAT")
    audio = decode_audio(path)
    assert audio.name == str(path) and audio.duration_s == 2.0
    np.testing.assert_array_equal(audio.samples, load_audio(path))
    monkeypatch.setattr(audio_io, "_decode", lambda *args: pytest.fail("decoded again"))
    assert load_audio(audio) is audio.samples and decode_audio(audio) is audio
    with pytest.raises(AudioTooLongError, match=f"{path}: the audio is 2 s long, longer than the 1.5 s"):
        load_audio(audio, max_duration_s=1.5)
    with pytest.raises(AudioError, match="sample_rate is for numpy arrays only"):
        load_audio(audio, SAMPLE_RATE)


@pytest.mark.parametrize("samples", [np.zeros(MIN_SAMPLES, np.float64),
                                     np.zeros((MIN_SAMPLES, 2), np.float32),
                                     np.zeros(MIN_SAMPLES - 1, np.float32), [0.0] * MIN_SAMPLES],
                         ids=["float64", "two channels", "too short", "a list"])
def test_decoded_audio_refuses_what_decode_audio_never_makes(samples):
    with pytest.raises(AudioError, match="DecodedAudio holds at least"):
        DecodedAudio(samples, "made by hand")


def test_a_named_pipe_is_read_whole(tmp_path, wav_bytes):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(wav_bytes,))
    writer.start()
    wave = load_audio(fifo)
    writer.join()
    np.testing.assert_array_equal(wave, load_audio(wav_bytes))


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


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(AudioError, match=r"nope\.wav: no such file"):
        load_audio(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="is a directory"):
        load_audio(tmp_path)


def test_empty_inputs(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match=r"empty\.wav: the file is empty \(0 bytes\)"):
        load_audio(tmp_path / "empty.wav")
    with pytest.raises(AudioError, match=r"<bytes>: .*empty \(0 bytes\)"):
        load_audio(b"")
    with pytest.raises(AudioError, match="empty"):
        load_audio(io.BytesIO())


def test_zero_sample_wav(tmp_path):
    path = write(tmp_path / "zero.wav", np.zeros(0, np.float32), SAMPLE_RATE, "WAV", "PCM_16")
    with pytest.raises(AudioError, match=r"zero\.wav: the audio has zero samples"):
        load_audio(path)
    with pytest.raises(AudioError, match="zero samples"):
        load_audio(np.zeros((0, 2), np.float32), sample_rate=SAMPLE_RATE)


def test_truncated_header(tmp_path, wav_bytes):
    (tmp_path / "cut.wav").write_bytes(wav_bytes[:20])
    with pytest.raises(AudioError, match=r"cut\.wav: cannot be decoded: a truncated or corrupt WAV file"):
        load_audio(tmp_path / "cut.wav")
    with pytest.raises(AudioError, match="<bytes>: cannot be decoded: a truncated or corrupt WAV"):
        load_audio(wav_bytes[:20])


def test_corrupt_data(tmp_path):
    data = bytearray(write(tmp_path / "a.ogg", sine(SAMPLE_RATE), SAMPLE_RATE, "OGG", "VORBIS").read_bytes())
    data[200:2000] = np.random.default_rng(0).bytes(1800)  # breaks the Ogg page checksums
    with pytest.raises(AudioError, match="cannot be decoded: a truncated or corrupt OGG file"):
        load_audio(bytes(data))


def test_text_and_random_bytes_are_not_audio(tmp_path):
    (tmp_path / "notes.txt").write_text("this is a text file, not a recording\n" * 20)
    with pytest.raises(AudioError, match=r"notes\.txt: cannot be decoded: not audio"):
        load_audio(tmp_path / "notes.txt")
    with pytest.raises(AudioError, match="<bytes>: cannot be decoded: not audio"):
        # Random bytes without 0xFF, so nothing resembles an MPEG frame sync.
        load_audio(np.random.default_rng(1).bytes(4000).replace(b"\xff", b"\x00"))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples(tmp_path, bad):
    wave = sine(SAMPLE_RATE)
    wave[100] = bad
    with pytest.raises(AudioError, match="<array>: the audio contains NaN or Inf"):
        load_audio(wave, sample_rate=SAMPLE_RATE)
    path = write(tmp_path / "bad.wav", wave, SAMPLE_RATE, "WAV", "FLOAT")
    with pytest.raises(AudioError, match=r"bad\.wav: the audio contains NaN or Inf"):
        load_audio(path)


@pytest.mark.parametrize("rate, words", [(0, "must be positive; got 0 Hz"),
                                         (-1, "must be positive; got -1 Hz"),
                                         (10, "10 Hz is outside"), (10 ** 7, "10000000 Hz is outside"),
                                         (16000.0, "must be an integer"), (True, "must be an integer")])
def test_absurd_sample_rates(rate, words):
    with pytest.raises(AudioError, match=f"<array>: sample rate {words}"):
        load_audio(sine(SAMPLE_RATE), sample_rate=rate)


def test_absurd_rate_in_a_file_header(tmp_path, wav_bytes):
    data = bytearray(wav_bytes)
    data[24:28] = (10).to_bytes(4, "little")  # the fmt chunk's sample rate field
    with pytest.raises(AudioError, match="<bytes>: sample rate 10 Hz is outside"):
        load_audio(bytes(data))


def test_array_input_errors(wav_bytes):
    with pytest.raises(AudioError, match="needs sample_rate"):
        load_audio(sine(SAMPLE_RATE))
    with pytest.raises(AudioError, match=r"got shape \(10, 100, 2\)"):
        load_audio(np.zeros((10, 100, 2), np.float32), sample_rate=SAMPLE_RATE)
    with pytest.raises(AudioError, match=r"got shape \(2, 16000\), more channels than samples"):
        load_audio(np.zeros((2, SAMPLE_RATE), np.float32), sample_rate=SAMPLE_RATE)
    for dtype in (np.uint8, np.int64, np.complex64, np.bool_):
        with pytest.raises(AudioError, match=f"got dtype {np.dtype(dtype)}"):
            load_audio(np.zeros(SAMPLE_RATE, dtype), sample_rate=SAMPLE_RATE)
    with pytest.raises(AudioError, match="sample_rate is for numpy arrays only"):
        load_audio(wav_bytes, sample_rate=SAMPLE_RATE)


def test_unsupported_source_types(tmp_path):
    with pytest.raises(AudioError, match="got list"):
        load_audio([0.0] * 1000)
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    with open(tmp_path / "a.wav") as text_mode, pytest.raises(AudioError, match=r"binary mode \('rb'\)"):
        load_audio(text_mode)


@needs_ffmpeg
def test_m4a_without_ffmpeg_names_what_to_install(tmp_path, monkeypatch):
    path = ffmpeg_encode(tmp_path, ".m4a", "aac")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert shutil.which("ffmpeg") is None
    with pytest.raises(AudioError, match=r"install ffmpeg \(apt install ffmpeg / brew install ffmpeg\) "
                                         r"to read \.m4a files"):
        load_audio(path)
    with pytest.raises(AudioError, match="install ffmpeg .* to read MP4/M4A audio"):
        load_audio(path.read_bytes())
    (tmp_path / "notes.txt").write_text("not audio\n" * 10)
    with pytest.raises(AudioError, match="not audio.*install ffmpeg"):
        load_audio(tmp_path / "notes.txt")


def test_decode_failures_chain_the_library_error(wav_bytes):
    with pytest.raises(AudioError) as caught:
        load_audio(wav_bytes[:20])
    assert isinstance(caught.value.__cause__, soundfile.SoundFileError)


@pytest.mark.parametrize("name, fmt, subtype", [("a.wav", "WAV", "PCM_16"), ("a.flac", "FLAC", "PCM_16"),
                                                ("a.ogg", "OGG", "VORBIS"),
                                                ("a.mp3", "MP3", "MPEG_LAYER_III")])
def test_damaged_files_give_audio_or_audio_error(tmp_path, name, fmt, subtype):
    data = write(tmp_path / name, sine(SAMPLE_RATE), SAMPLE_RATE, fmt, subtype).read_bytes()
    rng = np.random.default_rng(2)
    cut = [data[:n] for n in (1, 4, 12, 30, 60, 200, len(data) // 2)]
    flipped = [bytes(np.frombuffer(data, np.uint8) ^ (rng.random(len(data)) < p).astype(np.uint8) * 0x5A)
               for p in (0.001, 0.05)]
    for damaged in cut + flipped:
        try:
            wave = load_audio(damaged)
        except AudioError as exc:
            assert str(exc).startswith("<bytes>: ")
        else:
            check_output(wave)
            assert np.isfinite(wave).all()
