"""Frame-level F1 of the segmenter's speech detectors (nanoasr.audio.segment, vad="energy" and "silero") on
a labelled set built here: espeak-ng sentences in several voices with pauses between them, mixed with noise
beds (white, pink, babble made of other sentences, a music-like bed of chords) at several SNRs.

    python tools/bench/vad_f1.py --out docs/reports/vad.md

Truth: a 10 ms frame is speech where the clean speech's 25 ms RMS lies within TRUTH_RANGE_DB of that
sentence's loudest frame, with gaps shorter than the segmenter's MIN_PAUSE_S bridged (pauses between words are
speech, as both detectors treat them). Each detector is scored on the speech regions the segmenter keeps
(padded by PAD_S, before segments are merged), a frame counting as detected when its centre lies in a region.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from nanoasr.audio import SAMPLE_RATE as SR
from nanoasr.audio import segment, vad as live_vad

VOICES = ("en-us", "en", "en-gb-scotland", "en-029", "en-us+f3", "en+m3")
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her Wednesday at the train station.",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow.",
    "The rainbow is a division of white light into many beautiful colors.",
    "These take the shape of a long round arch, with its path high above.",
)
BABBLE = ("Numbers and letters are read aloud by a crowd of people in the next room.",
          "A meeting goes on behind the wall, with several voices talking at once about the budget.",
          "Somebody laughs, somebody else answers, and a third person keeps on telling a long story.")
NOISES = ("white", "pink", "babble", "music")
SNRS_DB = (None, 20, 10, 5, 0)  # None: the clean clip
TRUTH_RANGE_DB = 35.0
SPEECH_RMS = 0.05  # about -26 dBFS
VADS = ("energy", "silero")


def espeak(text: str, voice: str, folder: Path) -> np.ndarray:  # -> [N] float32 at 16 kHz
    import soundfile as sf
    import soxr

    path = folder / "say.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    x, rate = sf.read(path, dtype="float32")
    return soxr.resample(x, rate, SR).astype(np.float32)


def frame_rms_db(x):  # [N] -> [N // hop] dB of the 25 ms window starting at each 10 ms step
    hop, frame = SR // 100, round(segment.FRAME_S * SR)
    padded = np.concatenate((x, np.zeros(frame, np.float32)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, frame)[::hop][:len(x) // hop]
    return 10 * np.log10(np.mean(windows.astype(np.float64) ** 2, axis=1) + 1e-12)


def truth_frames(part):  # [N] one sentence -> [N // hop] bool
    db = frame_rms_db(part)
    speech = db > db.max() - TRUTH_RANGE_DB
    starts, ends = segment._runs(speech)
    for gap_start, gap_end in zip(ends[:-1], starts[1:]):
        if gap_end - gap_start < round(segment.MIN_PAUSE_S / segment.HOP_S):
            speech[gap_start:gap_end] = True
    return speech


def speech_track(seed: int, seconds: float, folder: Path):  # -> ([N] clean speech, [N // hop] truth)
    rng = np.random.default_rng(seed)
    parts, labels, total = [], [], 0
    while total < seconds * SR:
        pause = np.zeros(int(rng.uniform(0.4, 2.5) * SR) // 160 * 160, np.float32)
        voice = espeak(SENTENCES[rng.integers(len(SENTENCES))], VOICES[rng.integers(len(VOICES))], folder)
        voice = voice[:len(voice) // 160 * 160]
        voice *= SPEECH_RMS / np.sqrt(np.mean(voice[truth_frames(voice).repeat(160)] ** 2))
        parts += [pause, voice]
        labels += [np.zeros(len(pause) // 160, bool), truth_frames(voice)]
        total += len(pause) + len(voice)
    tail = np.zeros(SR, np.float32)
    return np.concatenate(parts + [tail]), np.concatenate(labels + [np.zeros(SR // 160, bool)])


def pink(n: int, rng):  # [n] noise with power falling as 1/f
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SR)
    spectrum[1:] /= np.sqrt(f[1:])
    spectrum[0] = 0
    return np.fft.irfft(spectrum, n)


def music(n: int, rng):  # [n] chords of harmonic tones, a new chord every half second, each note decaying
    out, step = np.zeros(n), SR // 2
    t = np.arange(step) / SR
    for at in range(0, n, step):
        root = 110 * 2 ** (rng.integers(0, 24) / 12)
        chord = sum(np.sin(2 * np.pi * root * 2 ** (k / 12) * h * t) / h
                    for k in (0, 4, 7) for h in (1, 2, 3))
        out[at:at + step] = (chord * np.exp(-3 * t))[:n - at]
    return out


def babble(n: int, folder: Path, rng):  # [n] four other voices speaking at once, without pauses
    streams = []
    for k in range(4):
        pieces, length = [], 0
        while length < n:
            piece = espeak(BABBLE[rng.integers(len(BABBLE))], VOICES[rng.integers(len(VOICES))], folder)
            pieces.append(piece / np.sqrt(np.mean(piece ** 2)))
            length += len(piece)
        streams.append(np.concatenate(pieces)[:n])
    return np.sum(streams, axis=0)


def noise_bed(kind: str, n: int, folder: Path, rng):
    if kind == "white":
        return rng.standard_normal(n)
    if kind == "pink":
        return pink(n, rng)
    return babble(n, folder, rng) if kind == "babble" else music(n, rng)


def mix(speech, truth, bed, snr_db):  # -> [N] float32: the bed scaled to `snr_db` below the speech's power
    if snr_db is None:
        floor = np.random.default_rng(0).standard_normal(len(speech)).astype(np.float32)
        return speech + np.float32(1e-4) * floor  # a recording's noise floor
    speech_power = np.mean(speech[truth.repeat(160)] ** 2)
    bed = bed * np.sqrt(speech_power / 10 ** (snr_db / 10) / np.mean(bed ** 2))
    return (speech + bed).astype(np.float32)


def detected(wave, vad: str, n_frames: int):  # -> [n_frames] bool: frame centre inside a kept region
    frame, hop = round(segment.FRAME_S * SR), round(segment.HOP_S * SR)
    db = segment.frame_db(wave, frame, hop)
    lo, hi = segment.speech_samples(wave, db, vad, SR)
    covered = np.zeros(len(wave) + 1, np.int32)
    np.add.at(covered, lo, 1)
    np.add.at(covered, hi, -1)
    inside = np.cumsum(covered)[:-1] > 0
    return inside[np.arange(n_frames) * hop + hop // 2]


def f1(found, truth) -> float:
    tp = np.sum(found & truth)
    return 2 * tp / max(1, np.sum(found) + np.sum(truth))


def live_ms_per_s(wave, kind: str) -> float:  # the streaming detector fed 0.1 s at a time, as sessions are
    detector = live_vad.streaming_vad(kind)
    start = time.perf_counter()
    for i in range(0, len(wave), SR // 10):
        detector.feed(wave[i:i + SR // 10])
    return (time.perf_counter() - start) * 1e3 / (len(wave) / SR)


def measure(seconds: float, folder: Path) -> dict:
    """{(noise, snr): {vad: F1}}, {vad: seconds spent} over every clip, and {vad: live ms per second}."""
    scores, spent, live = {}, dict.fromkeys(VADS, 0.0), {}
    for i, kind in enumerate(NOISES):
        speech, truth = speech_track(100 + i, seconds, folder)
        bed = noise_bed(kind, len(speech), folder, np.random.default_rng(200 + i))
        for snr in SNRS_DB:
            wave = mix(speech, truth, bed, snr)
            for vad in VADS:
                start = time.perf_counter()
                found = detected(wave, vad, len(truth))
                spent[vad] += time.perf_counter() - start
                scores.setdefault((kind, snr), {})[vad] = f1(found, truth)
                if (kind, snr) == ("white", 10):
                    live[vad] = live_ms_per_s(wave, vad)
    return scores, spent, live


def machine() -> str:
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def report(scores: dict, spent: dict, live: dict, seconds: float, audio_s: float) -> str:
    name = {None: "clean"}
    lines = ["# Speech detectors of the segmenter: frame-level F1", "",
             "`python tools/bench/vad_f1.py --out docs/reports/vad.md` "
             f"({machine()}; shared with other work, load average {os.getloadavg()[0]:.0f} at the end: "
             "timings noisy, F1 deterministic). One synthesized "
             f"track of about {seconds:.0f} s per noise bed: espeak-ng sentences in {len(VOICES)} voices "
             "with 0.4-2.5 s pauses, the bed mixed at each SNR (speech power over bed power; babble is other "
             "voices, labelled non-speech). F1 of speech frames, 10 ms frames, on the speech regions the "
             "segmenter keeps (the script's docstring says how truth is framed).", "",
             "| bed | SNR | energy | silero |", "|---|---|---|---|"]
    for (kind, snr), row in scores.items():
        lines.append(f"| {kind} | {name.get(snr, f'{snr} dB')} | {row['energy']:.3f} | "
                     f"{row['silero']:.3f} |")
    lines += ["", "Mean over the beds, by SNR:", "", "| SNR | energy | silero |", "|---|---|---|"]
    for snr in SNRS_DB:
        rows = [row for (_, s), row in scores.items() if s == snr]
        lines.append(f"| {name.get(snr, f'{snr} dB')} | " + " | ".join(
            f"{np.mean([r[v] for r in rows]):.3f}" for v in VADS) + " |")
    means = {vad: np.mean([row[vad] for row in scores.values()]) for vad in VADS}
    wins = {vad: sum(row[vad] > row[other] + 1e-3 for row in scores.values())
            for vad, other in zip(VADS, VADS[::-1])}
    lines += ["", "| | energy | silero |", "|---|---|---|",
              f"| mean F1, all {len(scores)} clips | {means['energy']:.3f} | {means['silero']:.3f} |",
              "| clips where it is better by more than 0.001 | " + " | ".join(str(wins[v]) for v in VADS)
              + " |",
              "| segmenter, ms per minute of audio | "
              + " | ".join(f"{spent[v] / audio_s * 60e3:.0f}" for v in VADS) + " |",
              "| live detector fed 0.1 s at a time, ms per second of audio | "
              + " | ".join(f"{live[v]:.1f}" for v in VADS) + " |",
              ""] + reading(scores)
    return "\n".join(lines)


def reading(scores: dict) -> list[str]:
    """What the tables say about the segmenter's default, in figures."""
    def mean(vad, keep):
        return np.mean([row[vad] for (_, snr), row in scores.items() if keep(snr)])

    def high(snr):
        return snr is None or snr >= 10

    def low(snr):
        return snr is not None and snr < 10

    best = {name: max(VADS, key=lambda vad: mean(vad, keep)) for name, keep in (("high", high), ("low", low))}
    return ["## The segmenter's default", "",
            f"Mean F1 at 10 dB SNR and above (and clean): energy {mean('energy', high):.3f}, silero "
            f"{mean('silero', high):.3f} (better: {best['high']}); below 10 dB: energy "
            f"{mean('energy', low):.3f}, silero {mean('silero', low):.3f} (better: {best['low']}). nanoasr's "
            f"default (`nanoasr.audio.segment.DEFAULT_SEGMENT_VAD`) is **{segment.DEFAULT_SEGMENT_VAD}**, "
            "chosen for recordings at 10 dB and above, where a transcript is worth having; "
            "`vad=\"silero\"` (`--vad silero`) is offered for noisy ones. Live sessions endpoint with Silero "
            "by default (docs/realtime.md).", ""]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="length of each speech track")
    parser.add_argument("--out", type=Path, default=None, help="write the report here (else print it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        scores, spent, live = measure(args.seconds, Path(folder))
    audio_s = len(SNRS_DB) * len(NOISES) * args.seconds
    text = report(scores, spent, live, args.seconds, audio_s)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
