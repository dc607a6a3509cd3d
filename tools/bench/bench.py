"""Benchmark nanoasr against Transformers (and llama.cpp's decoder) on the same random-weight checkpoint.

    python tools/bench/bench.py --model CKPT_DIR [--model other.gguf ...] [--transformers CKPT_DIR]
                          [--llama-gguf qwen3.gguf] [--seconds 10] [--tokens 40] [--long-seconds 600]
                          [--threads 2] [--device cpu|cuda] [--activations auto|exact|int8|bf16]
                          [--rounds 3] [--huge-pages off|on|both] [--isa native|avx2]
                          [--json out.json] [--report docs/speed.md]
    python tools/bench/bench.py --report docs/speed.md --from run.json [--from more.json ...] [--drop RUN ...]

Each configuration runs in its own process (so peak RSS is its own), with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset: users' machines do not set them, and they halve numpy's GEMM speed. The
configurations run in interleaved rounds (A B C, A B C, ...) so that a machine shared with other work slows
them alike; every figure is the median over the rounds, with its minimum and maximum. The report names the
CPU and the features nanoasr chooses its kernels by, llama.cpp's own system information when
llama-cpp-python is installed, and the machine's read bandwidth (a streaming sum over a buffer of 1 GiB or
four times the last-level cache, on as many threads as the runs use), against which F16/BF16 decode steps
are reported. `--isa avx2` holds every side to the instructions of an AVX2-only x86 CPU
(tools/lib/measure.py), so that an AVX-512 machine measures the paths such CPUs run; llama.cpp must then be a
build without AVX-512 (pass its Python as --llama-python; the report shows its system info).

`--report FILE` writes a markdown page: per run, the machine (CPU, target and the features `nanoasr doctor`
reports), the date and the exact command, then the medians (decode ms/token, prefill, encoder + adaptor,
real-time factors, peak RSS) and nanoasr's speed-ups over llama.cpp and Transformers in the same run. With
`--from` it renders runs saved by `--json` instead of running anything (one section each, in order), leaving
out the rows named by `--drop`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from nanoasr.backend import ACTIVATIONS  # noqa: E402
from tools.lib.measure import (ISA_ENVIRON, environ_without_blas_vars, last_level_cache_bytes,  # noqa: E402
                               median_ms)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- children ---------------------------------------------------------------------------------------

def synchronize(model) -> None:
    """Wait for the work queued on the device: CuPy runs asynchronously, so a timer stops only after this."""
    if model.backend.name == "cuda":
        model.backend.xp.cuda.get_current_stream().synchronize()


def device_figures(model) -> dict:
    """The GPU's name and the device memory CuPy's pool holds (its peak: the pool returns nothing)."""
    if model.backend.name != "cuda":
        return {}
    cupy = model.backend.xp
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return {"device": name.decode() if isinstance(name, bytes) else name,
            "peak_device_mb": cupy.get_default_memory_pool().total_bytes() / 2**20}


def child_nanoasr(args) -> dict:
    from nanoasr.api import Model
    from nanoasr.formats.mapping import huge_page_share
    from tools.lib.synth import speech_like

    start = time.perf_counter()
    model = Model.load(args.model, device=args.device, threads=args.threads, activations=args.activations,
                       huge_pages=args.huge_pages == "on")
    synchronize(model)
    out = {"load_s": time.perf_counter() - start}
    wave = speech_like(args.seconds, seed=1)
    kwargs = dict(sample_rate=16000, max_new_tokens=args.tokens, ignore_stop=True, reference=args.reference)
    first = model.transcribe(wave, **kwargs)
    second = model.transcribe(wave, **kwargs)
    out["first_run_extra_s"] = (first.timings["total"] - second.timings["total"]) / 1e3  # numba compiles
    out.update({f"{k}_ms": v for k, v in second.timings.items()})
    out["encoder_adaptor_ms"] = second.timings["encoder"] + second.timings["adaptor"]
    out["decode_ms_per_token"] = second.timings["decode"] / max(args.tokens - 1, 1)
    out["rtf"] = second.timings["total"] / 1e3 / args.seconds
    out.update(stage_times(model, args.threads))
    out["peak_rss_mb"] = peak_rss_mb()  # transcribing: before the step tests below fill 8 cache rows
    out["file_pages_2mib_share"] = huge_page_share(model_files(args.model))
    out.update(step_times(model))
    out["batch8_speedup"] = 8 * out["step_ms_ctx64_b1"] / out["step_ms_ctx64_b8"]
    out["decode_gb_per_s"] = decode_weight_bytes(model) / out["step_ms_ctx64_b1"] / 1e6
    if args.long_seconds:
        out.update(long_audio(model, args))
    out.update(device_figures(model))
    return out


def model_files(model: str) -> list[Path]:
    """The files a checkpoint directory or a .gguf path names (huge_page_share counts those mapped)."""
    path = Path(model)
    return sorted(path.iterdir()) if path.is_dir() else [path]


def decode_weight_bytes(model) -> int:
    """The stored matrices one decode step streams: every decoder matrix but the embedding table (it reads
    rows), and the LM head (the embedding when tied)."""
    from nanoasr.model import decoder
    from nanoasr.tensor import StoredTensor

    w = model.weights
    head = w.get("lm_head.weight", w[decoder.EMBED])
    layers = [t for name, t in w.items() if name.startswith(decoder.P) and name != decoder.EMBED
              and isinstance(t, StoredTensor) and len(t.shape) == 2]
    return sum(t.data.nbytes for t in layers + [head])


def step_times(model) -> dict:
    """The median decode step after 64 and 512 prompt positions, for one row and (at 64) eight together;
    a prefill of eight 196-position prompts in one forward, per prompt."""
    import numpy as np

    from nanoasr.xp import to_numpy
    from nanoasr.model import decoder

    cfg, xp = model.config.text, model.backend.xp
    rng = np.random.default_rng(0)
    out = {}
    for context, batch in ((64, 1), (64, 8), (512, 1)):
        session = decoder.Session(model.weights, cfg, rows=batch)
        with model.thread_scope():
            for _ in range(batch):
                embeds = rng.standard_normal((context, cfg.hidden_size)).astype(np.float32)
                session.prefill(xp.asarray(embeds), room=40)

            def step():  # ends as a decode step does: the chosen ids on the host
                to_numpy(session.step([1000] * batch).argmax(axis=-1))

            step()
            out[f"step_ms_ctx{context}_b{batch}"] = median_ms(step, 12)
    x = xp.asarray(rng.standard_normal((196, cfg.hidden_size)).astype(np.float32))

    def prefill_together():  # eight prompts in one forward, as segments that start together are
        decoder.Session(model.weights, cfg, rows=8).prefill_many([x] * 8, [4] * 8)
        synchronize(model)
    with model.thread_scope():
        prefill_together()
        out["prefill196_x8_ms_each"] = median_ms(prefill_together, 3) / 8
    return out


def long_audio(model, args) -> dict:
    """A long recording segmented and decoded 8 segments at a time, and (with --long-sequential) again one
    segment at a time."""
    from nanoasr.api import Model
    from tools.lib.synth import speech_like

    wave = speech_like(args.long_seconds, seed=2, silence_every_s=45)
    result = model.transcribe(wave, sample_rate=16000, reference=args.reference)
    out = {"long_rtf": result.timings["total"] / 1e3 / args.long_seconds,
           "long_stage_s": {k: round(v / 1e3, 2) for k, v in result.timings.items()},
           "long_segments": len(result.segments),
           "long_tokens": sum(len(s.token_ids) for s in result.segments)}
    if not args.long_sequential:
        return out
    one_by_one = Model(model.checkpoint, model.backend.name, model.threads, batch_size=1,
                       activations=model.backend.activations, huge_pages=model.backend.huge_pages)
    sequential = one_by_one.transcribe(wave, sample_rate=16000, reference=args.reference)
    return dict(out, long_sequential_rtf=sequential.timings["total"] / 1e3 / args.long_seconds,
                long_batched_equals_sequential=[s.token_ids for s in result.segments] == [
                    s.token_ids for s in sequential.segments])


def stage_times(model, threads: int) -> dict:
    """Frontend on 60 s (one thread), encoder + adaptor on 30 s, prefill of 196 positions (the 10 s
    prompt)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from nanoasr.model import decoder
    from tools.lib.synth import speech_like

    out = {}
    minute = speech_like(60, seed=3)
    with threadpool_limits(limits=1):
        model.features(minute, "funasr")
        out["frontend_60s_1thread_ms"] = median_ms(lambda: model.features(minute, "funasr"), 3)
    with model.thread_scope():
        feats = model.features(minute[:30 * 16000], "funasr")

        def audio():
            model.adapt(model.encode(feats), "funasr")
            synchronize(model)
        audio()
        out["encoder_adaptor_30s_ms"] = median_ms(audio, 3)
        cfg, xp = model.config.text, model.backend.xp
        x = xp.asarray(np.random.default_rng(0).standard_normal((196, cfg.hidden_size)).astype(np.float32))

        def prefill():
            decoder.Session(model.weights, cfg, rows=1).prefill(x, room=4)
            synchronize(model)
        prefill()
        out["prefill196_ms"] = median_ms(prefill, 3)
    return out


def child_transformers(args) -> dict:
    import torch
    from transformers import FunAsrNanoForConditionalGeneration, LogitsProcessor

    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    start = time.perf_counter()
    model = FunAsrNanoForConditionalGeneration.from_pretrained(args.model, dtype=dtype).eval()
    out = {"load_s": time.perf_counter() - start}
    frames = -(-args.seconds * 100 // 6)
    feats = torch.randn(1, frames, 560, dtype=dtype)
    mask = torch.ones(1, frames, dtype=torch.long)
    with torch.inference_mode():
        audio = lambda: model.get_audio_features(feats, mask)  # noqa: E731
        audio()
        out["encoder_adaptor_ms"] = median_ms(audio, 3)
        feats30 = torch.randn(1, 500, 560, dtype=dtype)
        mask30 = torch.ones(1, 500, dtype=torch.long)
        audio30 = lambda: model.get_audio_features(feats30, mask30)  # noqa: E731
        audio30()
        out["encoder_adaptor_30s_ms"] = median_ms(audio30, 3)
        embeds = torch.randn(1, 196, model.config.text_config.hidden_size, dtype=dtype)
        prefill = lambda: model(inputs_embeds=embeds, logits_to_keep=1)  # noqa: E731
        prefill()
        out["prefill196_ms"] = median_ms(prefill, 3)

        class Stamps(LogitsProcessor):
            def __init__(self):
                self.times = []

            def __call__(self, input_ids, scores):
                self.times.append(time.perf_counter())
                return scores

        stamps = Stamps()
        start = time.perf_counter()
        model.generate(inputs_embeds=embeds, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                       do_sample=False, logits_processor=[stamps])
        steps = [b - a for a, b in zip(stamps.times, stamps.times[1:])]
        out["decode_ms_per_token"] = statistics.median(steps) * 1e3
        out["e2e_s"] = out["encoder_adaptor_ms"] / 1e3 + (time.perf_counter() - start)
    out["rtf"] = out["e2e_s"] / args.seconds
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def child_llama(args) -> dict:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(args.model, n_ctx=1024, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False)
    out = {"load_s": time.perf_counter() - start}
    prompt = np.random.default_rng(0).integers(0, 150000, 196).tolist()
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    out["prefill196_ms"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for token in prompt[:args.tokens]:
        llm.eval([token])
    out["decode_ms_per_token"] = (time.perf_counter() - start) * 1e3 / args.tokens
    out["peak_rss_mb"] = peak_rss_mb()
    out["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    return out


CHILDREN = {"nanoasr": child_nanoasr, "transformers": child_transformers, "llama": child_llama}


# --- driver -----------------------------------------------------------------------------------------


def run_child(kind: str, model: str, args, **extra) -> dict:
    env = environ_without_blas_vars(args.isa)
    python = args.llama_python if kind == "llama" else sys.executable
    cmd = [python, __file__, "child", kind, "--model", model, "--seconds", str(args.seconds),
           "--tokens", str(args.tokens), "--threads", str(args.threads), "--reference", args.reference,
           "--long-seconds", str(args.long_seconds if model == (args.long_model or model) else 0),
           "--device", args.device, "--activations", args.activations,
           "--long-sequential" if args.long_sequential else "--no-long-sequential"]
    for key, value in extra.items():
        cmd += [f"--{key}", str(value)]
    print(f"bench: {kind} {model} {extra or ''}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="nanoasr-bench-") as cache:
        if kind == "nanoasr":  # an empty kernel cache: the first transcription includes numba's compile time
            env["NUMBA_CACHE_DIR"] = cache
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine(args) -> dict:
    from nanoasr.cli import doctor

    info = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        model = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")]
        info["cpu"] = model[0] if model else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    found = doctor.cpu()  # what `nanoasr doctor` reports under [cpu]: what the kernels are chosen by
    info["cpu_target"] = found["name"]
    info["cpu_features"] = " ".join(f if on else f"-{f}" for f, on in found["features"].items())
    info["blas"] = blas_pools(getattr(args, "isa", "native"))
    info["llama_system_info"] = llama_system_info(args.llama_python)
    return info


def blas_pools(isa: str) -> list[str]:
    """The BLAS as the runs see it: asked in a process with their environment (OPENBLAS_CORETYPE picks its
    kernels)."""
    code = ("import json, numpy; from threadpoolctl import threadpool_info; print(json.dumps(["
            "f\"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}\" "
            "for i in threadpool_info()]))")
    done = subprocess.run([sys.executable, "-c", code], env=environ_without_blas_vars(isa),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def llama_system_info(python: str) -> str:
    """llama.cpp's own account of the features it was built for and found (llama_print_system_info)."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return f"llama-cpp-python is not installed for {python}"
    return done.stdout.strip()


def read_bandwidth(threads: int, mib: int | None = None, repeats: int = 7) -> dict:
    """GB/s of a streaming read: numpy sums over a float32 buffer of `mib` MiB (bandwidth_buffer_mib() if
    None), split into one slice per thread (numpy lets go of the GIL in a sum)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    buf = np.ones((mib or bandwidth_buffer_mib()) * 2**20 // 4, np.float32)
    slices = np.array_split(buf, threads)
    with ThreadPoolExecutor(threads) as pool:
        def once():
            list(pool.map(np.sum, slices))
        once()  # pages touched, threads started
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            once()
            rates.append(buf.nbytes / (time.perf_counter() - start) / 1e9)
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def bandwidth_buffer_mib() -> int:
    """1 GiB, or four times the last-level cache where that is larger."""
    return max(1024, 4 * last_level_cache_bytes() >> 20)


def summarize(samples: list[dict]) -> dict:
    """One configuration's rounds -> each number's median (under its own key, so ratios read it) with its
    minimum and maximum under "spread"; a flag holds only if it held in every round. Failed rounds are
    counted; a configuration that failed in every round keeps its last error."""
    done = [r for r in samples if "error" not in r]
    if not done:
        return samples[-1]
    out = {"rounds": len(done), "failed_rounds": len(samples) - len(done), "spread": {}}
    for key in done[0]:
        values = [r[key] for r in done if key in r]
        if isinstance(values[0], bool):
            out[key] = all(values)
        elif isinstance(values[0], (int, float)):
            out[key] = statistics.median(values)
            out["spread"][key] = [min(values), max(values)]
        else:
            out[key] = values[0]
    return out


PAGE_COLUMNS = (  # (header, key): the medians a page shows, in order; a column no run has is left out
    ("decode ms/token", "decode_ms_per_token"),
    ("prefill, 196 positions, ms", "prefill196_ms"),
    ("prefill, 196 positions, 8 together, ms each", "prefill196_x8_ms_each"),
    ("encoder + adaptor, 30 s, ms", "encoder_adaptor_30s_ms"),
    ("real-time factor, {seconds} s clip", "rtf"),
    ("real-time factor, {long_seconds} s", "long_rtf"),
    ("peak RSS MB", "peak_rss_mb"),
    ("peak device MB", "peak_device_mb"),
    ("load s", "load_s"),
    ("first run's extra s (compiling)", "first_run_extra_s"),
)
SPEED_UPS = (  # (header, key, the other side's row): nanoasr's speed-up, the other's time over nanoasr's
    ("decode, over llama.cpp", "decode_ms_per_token", "llama.cpp"),
    ("prefill 196, over llama.cpp", "prefill196_ms", "llama.cpp"),
    ("decode, over Transformers fp32", "decode_ms_per_token", "transformers fp32"),
    ("encoder + adaptor 30 s, over Transformers fp32", "encoder_adaptor_30s_ms", "transformers fp32"),
    ("the clip, over Transformers fp32", "rtf", "transformers fp32"),
    ("the clip, over Transformers bf16", "rtf", "transformers bf16"),
)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table without the columns (after the first) that no row fills."""
    keep = [0] + [i for i in range(1, len(header)) if any(row[i] for row in rows)]
    return ["| " + " | ".join(header[i] for i in keep) + " |", "|---" * len(keep) + "|",
            *("| " + " | ".join(row[i] for i in keep) + " |" for row in rows)]


def settings(results: dict) -> argparse.Namespace:
    """The options a saved run was made with, read back from its command."""
    return parser().parse_args(shlex.split(results["command"])[2:])


def page(sources: list[dict], title: str = "Speed", note: str = "") -> str:
    """The markdown page: a section per run (its machine, date, command, figures and speed-ups)."""
    lines = [f"# {title}", "", *([note, ""] if note else []),
             "Each figure is the median of the run's interleaved rounds (its JSON has the minimum and "
             "maximum); speed-ups are the other program's time over nanoasr's in the same run, so above 1 "
             "nanoasr is faster. The command that wrote this page is at its end."]
    for results in sources:
        lines += ["", *section(results)]
    lines += ["", "Decode ms/token: the clip's forced transcription, its decode stage over the steps "
              "(Transformers: the median step; llama.cpp: its Qwen3 decoder alone, one token at a time). "
              "Prefill: 196 prompt positions, a 10 s clip's prompt. Real-time factor: the clip's second "
              "transcription, seconds over the audio's seconds; the long audio has pauses and is segmented, "
              "8 segments decoding together. Peak RSS: the process after transcribing and timing the stages. "
              "First run's extra s: the first transcription's time over the second's, numba compiling the "
              "kernels for this CPU (cached after).", "", "This page was written by", "", "```sh",
              written_by(sys.argv[1:]), "```"]
    return "\n".join(lines) + "\n"


def written_by(argv: list[str]) -> str:
    """The command, an option a line."""
    words = ["python tools/bench/bench.py"] + [shlex.quote(w) for w in argv]
    return "".join(f" \\\n    {w}" if w.startswith("--") and i > 0 else f" {w}" if i else w
                   for i, w in enumerate(words))


def section(results: dict) -> list[str]:
    m, args, runs = results["machine"], settings(results), results["runs"]
    activations = "" if args.activations == "auto" else f", {args.activations} activations"
    held = "" if args.isa == "native" else f", held to {args.isa.upper()}"
    bandwidth = results["read_bandwidth_gbs"]["median"]
    title = f"{m['cpu']} (`{m['cpu_target']}`){held}{activations}, a {args.seconds} s clip, {results['date']}"
    lines = [f"## {title}", "",
             f"- Command: `{results['command']}` ({args.threads} threads; a {args.seconds} s clip of "
             f"speech-like audio with {args.tokens} tokens forced; {args.rounds} interleaved rounds)",
             f"- CPU: {m['cpu']}, {m['cpus']} logical CPUs; the features `nanoasr doctor` reports: "
             f"{m['cpu_features']}",
             f"- Read bandwidth: {_fmt(bandwidth)} GB/s; BLAS: {'; '.join(m['blas'])}; Python {m['python']}",
             *([f"- llama.cpp: {m['llama_system_info']}"] if any(n.startswith("llama.cpp") for n in runs)
               else []),
             ""]
    done = {name: r for name, r in runs.items() if "error" not in r}
    header = ["run"] + [h.format(seconds=args.seconds, long_seconds=args.long_seconds)
                        for h, _ in PAGE_COLUMNS]
    rows = [[name] + [_fmt(r.get(key)) for _, key in PAGE_COLUMNS] for name, r in done.items()]
    rows += [[name, f"failed: {r['error']}"] + [""] * (len(PAGE_COLUMNS) - 1)
             for name, r in runs.items() if "error" in r]
    lines += _table(header, rows)
    speed_ups = [[name] + [speed_up(r, key, other_run(done, other, name)) for _, key, other in SPEED_UPS]
                 for name, r in done.items() if name.startswith("nanoasr")]
    if any(any(row[1:]) for row in speed_ups):
        lines += ["", *_table(["nanoasr run"] + [h for h, _, _ in SPEED_UPS], speed_ups)]
    return lines


def other_run(runs: dict, other: str, name: str) -> dict | None:
    """The other program's row in the same run: llama.cpp's decoder of the same stored type, or
    Transformers'."""
    if other == "llama.cpp":
        return next((r for n, r in runs.items() if n.startswith("llama.cpp")
                     and _stored_type(n) == _stored_type(name)), None)
    return runs.get(other)


def speed_up(r: dict, key: str, other: dict | None) -> str:
    if other is None or key not in r or key not in other:
        return ""
    return f"{other[key] / r[key]:.2f}x"


def _stored_type(name: str) -> str:
    # "nanoasr model-q8_0.gguf" / "llama.cpp decoder qwen3-q8_0.gguf" -> "q8_0"
    stem = Path(name.split()[-1]).stem
    return stem.rsplit("-", 1)[-1] if "-" in stem else stem


def configurations(args) -> list:
    """(row name, a call that runs it once), in the order each round runs them."""
    pages = {"off": ["off"], "on": ["on"], "both": ["off", "on"]}[args.huge_pages]
    names = [Path(m).name for m in args.model]
    named = {m: Path(m).name if names.count(Path(m).name) == 1 else f"{Path(m).parent.name}/{Path(m).name}"
             for m in args.model}  # the same file in two folders: e.g. one just written, one read from disk
    runs = [(f"nanoasr {'--huge-pages ' if p == 'on' else ''}{named[m]}",
             lambda m=m, p=p: run_child("nanoasr", m, args, **{"huge-pages": p}))
            for m in args.model for p in pages]
    if args.transformers:
        runs += [(f"transformers {d}", lambda d=d: run_child("transformers", args.transformers, args,
                                                             dtype=d)) for d in ("fp32", "bf16")]
    runs += [(f"llama.cpp decoder {Path(g).name}", lambda g=g: run_child("llama", g, args))
             for g in args.llama_gguf]
    return runs


class SavedRun(argparse.Action):  # --from FILE: [FILE, the rows --drop leaves out]
    def __call__(self, parser, namespace, value, option_string=None):
        getattr(namespace, self.dest).append((value, set()))


class DroppedRow(argparse.Action):  # --drop RUN: a row of the --from before it
    def __call__(self, parser, namespace, value, option_string=None):
        if not getattr(namespace, self.dest):
            parser.error("--drop names a row of the --from before it")
        getattr(namespace, self.dest)[-1][1].add(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--model", action="append", default=[], help="nanoasr checkpoint dir or .gguf (repeat)")
    p.add_argument("--transformers", default=None, help="the same checkpoint dir, run through Transformers")
    p.add_argument("--llama-gguf", action="append", default=[],
                   help="a stock qwen3 GGUF of the same decoder "
                        "(repeat; nanoasr convert --export-qwen3-gguf)")
    p.add_argument("--llama-python", default=sys.executable, help="the Python that has llama-cpp-python")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--long-seconds", type=int, default=0, help="also time this much long audio (segments)")
    p.add_argument("--long-model", default=None, help="run the long audio on this --model only")
    p.add_argument("--long-sequential", default=True, action=argparse.BooleanOptionalAction,
                   help="time the long audio's segments one by one as well")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where nanoasr runs")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    p.add_argument("--reference", default="funasr", choices=("funasr", "transformers"))
    p.add_argument("--activations", default="auto", choices=ACTIVATIONS,
                   help="nanoasr's rows in the products (default: nanoasr's own, auto)")
    p.add_argument("--huge-pages", default="off", choices=("off", "on", "both"),
                   help="nanoasr's weight matrices read into huge pages (Model.load(huge_pages=True)); "
                        "both: each model both ways")
    p.add_argument("--isa", default="native", choices=tuple(ISA_ENVIRON),
                   help="avx2: every side held to an AVX2-only CPU's instructions (ISA_ENVIRON)")
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--report", default=None, help="write a markdown page of the results here")
    p.add_argument("--from", dest="sources", action=SavedRun, default=[], metavar="JSON",
                   help="with --report: render these saved results (--json) instead of running (repeat)")
    p.add_argument("--drop", dest="sources", action=DroppedRow, metavar="RUN",
                   help="leave the row of this name out of the --from just before (repeat)")
    p.add_argument("--title", default="Speed", help="the page's title")
    p.add_argument("--note", default="", help="a paragraph for the page, under its first")
    return p


def main() -> int:
    args = parser().parse_args()
    if args.child:
        args.model = args.model[-1]
        print(json.dumps(CHILDREN[args.child[1]](args)))
        return 0
    if args.sources:
        if not args.report:
            raise SystemExit("bench: --from renders saved results: give --report FILE")
        sources = [json.loads(Path(f).read_text()) for f, _ in args.sources]
        for results, (_, dropped) in zip(sources, args.sources):
            results["runs"] = {n: r for n, r in results["runs"].items() if n not in dropped}
        Path(args.report).write_text(page(sources, args.title, args.note))
        return 0
    results = {"command": "python tools/bench/bench.py " + shlex.join(sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(args)}
    rounds = {name: [] for name, _ in configurations(args)}
    for _ in range(args.rounds):
        for name, run in configurations(args):
            rounds[name].append(run())
    results["runs"] = {name: summarize(samples) for name, samples in rounds.items()}
    # last: a child inherits its parent's peak RSS through fork and exec, so the large buffer must come after
    results["read_bandwidth_gbs"] = read_bandwidth(args.threads)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.report:
        Path(args.report).write_text(page([results], args.title, args.note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
