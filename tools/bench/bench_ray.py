"""Throughput of nanoasr.ray.transcribe_dataset with 1 and 2 workers (1 thread each) on a local Ray runtime.

    python tools/bench/bench_ray.py --model CKPT [--model other.gguf ...] [--files 12] [--seconds 5]
                                    [--tokens 24] [--workers 1 2] [--report FILE]

Every configuration transcribes the same synthesized clips (speech-like audio, `--seconds` long) with exactly
`--tokens` decoded per clip (ignore_stop), so each file is the same work. Files/s and audio-seconds/s are
the steady state: the rows after each worker's first (which carries the actor's start and its first call),
over the time from the last of those first rows to the last row. The wall time of the whole run, start
included, is given beside them. Peak RSS per worker is sampled from the actor processes every 0.2 s, with
its file-backed part (the memory-mapped checkpoint and the shared libraries: pages the workers of one
machine share through the page cache). Runs without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.lib.measure import rerun_without_blas_vars  # noqa: E402

ACTOR = "MapBatches(Transcriber)"  # in the command line Ray gives each actor process


class MemorySampler:
    """Peak RSS and its file-backed part (MB) of each actor process below this one that starts inside the
    block (an earlier pass's actors may still be ending), sampled in a thread."""

    def __init__(self, every_s: float = 0.2):
        self.every_s, self.peaks, self.stop = every_s, {}, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.earlier: set[int] = set()

    def __enter__(self):
        import psutil

        self.earlier = {p.pid for p in psutil.Process().children(recursive=True) if ACTOR in _title(p)}
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def sample(self):
        import psutil

        me = psutil.Process()
        while not self.stop.wait(self.every_s):
            for process in me.children(recursive=True):
                if process.pid in self.earlier:
                    continue
                try:
                    if ACTOR not in _title(process):  # an idle worker process becomes an actor: ask each time
                        continue
                    memory = process.memory_info()
                except psutil.Error:  # it ended between the listing and the reading
                    continue
                rss, mapped = self.peaks.get(process.pid, (0.0, 0.0))
                self.peaks[process.pid] = (max(rss, memory.rss / 2**20), max(mapped, memory.shared / 2**20))


def _title(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def clips(folder: Path, count: int, seconds: float) -> list[str]:
    import soundfile

    from tools.lib.synth import SAMPLE_RATE, speech_like

    paths = []
    for i in range(count):
        path = folder / f"clip{i:03d}.wav"
        soundfile.write(path, speech_like(seconds, seed=100 + i), SAMPLE_RATE)
        paths.append(str(path))
    return paths


def run(paths: list[str], model: str, workers: int, tokens: int) -> dict:
    """One pass over `paths`: arrival time of each row, the workers' memory, the whole run's wall time."""
    import ray

    from nanoasr.ray import transcribe_dataset

    audio = ray.data.read_binary_files(paths, include_paths=True, num_cpus=0, override_num_blocks=len(paths))
    rows = transcribe_dataset(audio, model=model, workers=workers, threads_per_worker=1,
                              max_new_tokens=tokens, ignore_stop=True)
    arrivals, durations = [], []
    start = time.perf_counter()
    with MemorySampler() as memory:
        for row in rows.iter_rows():
            assert row["error"] is None, row["error"]
            arrivals.append(time.perf_counter() - start)
            durations.append(row["duration_s"])
    return dict(arrivals=arrivals, durations=durations, wall_s=time.perf_counter() - start,
                memory=sorted(memory.peaks.values()))


def figures(result: dict, workers: int) -> dict:
    arrivals, durations = result["arrivals"], result["durations"]
    span = arrivals[-1] - arrivals[workers - 1]  # after each worker's first file
    counted = len(arrivals) - workers
    return dict(files_per_s=counted / span, audio_s_per_s=sum(durations[workers:]) / span,
                wall_s=result["wall_s"], files=len(arrivals),
                rss_mb=[round(rss) for rss, _ in result["memory"]],
                mapped_mb=[round(mapped) for _, mapped in result["memory"]])


def report(rows: list[dict], args, command: str) -> str:
    lines = [
        "# Ray Data: files per second with 1 and 2 workers", "",
        f"Produced by `{command}` on {platform.machine()} with {os.cpu_count()} CPUs "
        f"({_cpu_name()}), Python {platform.python_version()}, Ray {_ray_version()}: a local Ray runtime, "
        f"{args.files} synthesized clips of {args.seconds:g} s, {args.tokens} tokens decoded per clip "
        "(ignore_stop), one thread per worker, OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset.", "",
        "Files/s and audio-s/s are the steady state: the rows after each worker's first one, over the time "
        "from the last of those first rows to the last row. Wall s is the whole pass, actors' start "
        "included. Peak RSS per worker is sampled every 0.2 s, with its file-backed part: the memory-mapped "
        "checkpoint and the shared libraries, pages the workers of one machine share through the page cache "
        "(the rest is each worker's own). Load average: the machine's 1-minute load before and after the "
        "pass (2 would be its two cores busy; other work shares this machine).", "",
        *([args.note, ""] if args.note else []),
        "| model | workers | files/s | audio-s/s | x 1 worker | wall s | peak RSS MB per worker | "
        "of which file-backed MB | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['model']} | {row['workers']} | {row['files_per_s']:.3f} | "
                     f"{row['audio_s_per_s']:.2f} | {row['scaling']:.2f} | {row['wall_s']:.1f} | "
                     f"{', '.join(map(str, row['rss_mb']))} | {', '.join(map(str, row['mapped_mb']))} | "
                     f"{row['load'][0]:.1f} -> {row['load'][1]:.1f} |")
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def _ray_version() -> str:
    import ray

    return ray.__version__


def main() -> int:
    rerun_without_blas_vars()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="checkpoint (repeatable)")
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each clip")
    parser.add_argument("--tokens", type=int, default=24, help="tokens decoded per clip")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--report", default=None, help="write the markdown report here")
    parser.add_argument("--note", default=None, help="a paragraph for the report (the models' origin)")
    args = parser.parse_args()
    import ray

    # the runtime's worker processes inherit the environment: they import this checkout's nanoasr
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    results = []
    with tempfile.TemporaryDirectory(prefix="nanoasr-bench-ray-") as folder:
        paths = clips(Path(folder), args.files, args.seconds)
        for model in args.model:
            run(paths[:1], model, 1, args.tokens)  # numba's kernel cache filled before anything is timed
            for workers in args.workers:
                load_before = os.getloadavg()[0]
                print(f"bench_ray: {model}, {workers} workers", file=sys.stderr, flush=True)
                row = figures(run(paths, model, workers, args.tokens), workers)
                row.update(model=Path(model).name, workers=workers, load=(load_before, os.getloadavg()[0]))
                results.append(row)
                print(f"bench_ray: {row}", file=sys.stderr, flush=True)
            first = next(r for r in results if r["model"] == Path(model).name)
            for row in results:
                if row["model"] == first["model"]:
                    row["scaling"] = row["files_per_s"] / first["files_per_s"]
    ray.shutdown()
    command = "python tools/bench/bench_ray.py " + " ".join(sys.argv[1:])
    text = report(results, args, command)
    if args.report:
        Path(args.report).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
