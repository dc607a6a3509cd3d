"""Benchmark nanoasr against Transformers (and llama.cpp's decoder) on the same random-weight checkpoint.

    python tools/bench.py --model CKPT_DIR [--model other.gguf ...] [--transformers CKPT_DIR]
                          [--llama-gguf qwen3.gguf] [--seconds 10] [--tokens 40] [--long-seconds 600]
                          [--threads 2] [--device cpu|cuda] [--activations exact|int8|bf16] [--rounds 3]
                          [--huge-pages off|on|both] [--isa native|avx2]
                          [--json out.json] [--report docs/reports/performance.md]  (appends a dated section)

Each configuration runs in its own process (so peak RSS is its own), with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset: users' machines do not set them, and they halve numpy's GEMM speed. The
configurations run in interleaved rounds (A B C, A B C, ...) so that a machine shared with other work slows
them alike; every figure is the median over the rounds, with its minimum and maximum. The report names the
CPU and the features nanoasr chooses its kernels by, llama.cpp's own system information when
llama-cpp-python is installed, and the machine's read bandwidth (a streaming sum over a buffer of 1 GiB or
four times the last-level cache, on as many threads as the runs use), against which F16/BF16 decode steps
are reported. `--isa avx2` holds every side to the instructions of an AVX2-only x86 CPU (tools/measure.py),
so that an AVX-512 machine measures the paths such CPUs run; llama.cpp must then be a build without AVX-512
(pass its Python as --llama-python; the report shows its system info).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.measure import (ISA_ENVIRON, environ_without_blas_vars, last_level_cache_bytes,  # noqa: E402
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
    from tools.synth import speech_like

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
    from tools.synth import speech_like

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
    from tools.synth import speech_like

    out = {}
    minute = speech_like(60, seed=3)
    with threadpool_limits(limits=1):
        model.features([minute], "funasr")
        out["frontend_60s_1thread_ms"] = median_ms(lambda: model.features([minute], "funasr"), 3)
    with model.thread_scope():
        feats, mask = model.features([minute[:30 * 16000]], "funasr")

        def audio():
            model.adapt(model.encode(feats, mask), mask, "funasr")
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


COLUMNS = (  # (header, keys tried in order)
    ("load s", ("load_s",)), ("first-run extra s", ("first_run_extra_s",)),
    ("frontend 60 s, 1 thread ms", ("frontend_60s_1thread_ms",)),
    ("encoder+adaptor, the clip, ms", ("encoder_adaptor_ms",)),
    ("encoder+adaptor 30 s ms", ("encoder_adaptor_30s_ms",)),
    ("prefill 196 ms", ("prefill196_ms",)),
    ("prefill 196, 8 together, ms each", ("prefill196_x8_ms_each",)),
    ("decode ms/token", ("decode_ms_per_token",)),
    ("step ctx 64 ms", ("step_ms_ctx64_b1",)), ("step ctx 512 ms", ("step_ms_ctx512_b1",)),
    ("decode step weights GB/s", ("decode_gb_per_s",)), ("batch-8 throughput x", ("batch8_speedup",)),
    ("RTF, the clip", ("rtf",)), ("RTF long", ("long_rtf",)),
    ("RTF long, segments one by one", ("long_sequential_rtf",)),
    ("batched = sequential ids", ("long_batched_equals_sequential",)),
    ("peak RSS MB", ("peak_rss_mb",)), ("file pages in 2 MiB pages", ("file_pages_2mib_share",)),
)
DEVICE_COLUMNS = (("peak device MB", ("peak_device_mb",)), ("device", ("device",)))  # runs on a GPU only


def _cell(r: dict, keys) -> str:  # "median (min-max)" of the first key the run has
    key = next((k for k in keys if k in r), None)
    if key is None:
        return ""
    low_high = r.get("spread", {}).get(key)
    if low_high and low_high[0] != low_high[1]:
        return f"{_fmt(r[key])} ({_fmt(low_high[0])}-{_fmt(low_high[1])})"
    return _fmt(r[key])


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def report(results: dict, args) -> str:
    m, bandwidth = results["machine"], results["read_bandwidth_gbs"]
    activations = "" if args.activations == "exact" else f", {args.activations} activations"
    held = "" if args.isa == "native" else f", held to {args.isa.upper()}"
    day = time.strftime('%Y-%m-%d', time.gmtime())
    unset = "OPENBLAS_L2_SIZE" if held else "OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE"
    lines = [f"## {day}: {m['cpu']} (`{m['cpu_target']}`){held}{activations}", "",
             f"Produced by `python tools/bench.py {' '.join(sys.argv[1:])}` "
             f"({args.threads} threads, {args.seconds} s of speech-like audio with {args.tokens} tokens "
             f"forced, `{args.reference}` profile, {unset} unset, {args.rounds} "
             "interleaved rounds: each figure is the median, with the minimum and maximum in brackets).", "",
             f"- CPU: {m['cpu']} ({m['cpus']} logical CPUs), target `{m['cpu_target']}`, "
             f"features: {m['cpu_features']}",
             f"- Read bandwidth ({args.threads} threads, streaming sum over {bandwidth_buffer_mib()} MiB): "
             f"{_fmt(bandwidth['median'])} GB/s ({_fmt(bandwidth['min'])}-{_fmt(bandwidth['max'])})",
             f"- BLAS: {'; '.join(m['blas'])}; Python {m['python']}",
             *([f"- Held to {args.isa.upper()}: every child runs with "
                + " ".join(f"{k}={v}" for k, v in ISA_ENVIRON[args.isa].items())] if held else []),
             f"- llama.cpp system info: {m['llama_system_info']}", ""]
    on_device = any("peak_device_mb" in r for r in results["runs"].values())
    columns = COLUMNS + DEVICE_COLUMNS if on_device else COLUMNS
    lines += ["| run | " + " | ".join(h for h, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, r in results["runs"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error']} |")
            continue
        lines.append(f"| {name} | " + " | ".join(_cell(r, keys) for _, keys in columns) + " |")
    lines += ["", *ratios(results["runs"], bandwidth["median"])]
    lines += ["", "Decode ms/token is a step of the clip's forced transcription (nanoasr: its decode stage "
              "over the steps; Transformers: the median step); "
              "llama.cpp rows time its Qwen3 decoder alone (llama-cpp-python `eval`, one token at a time). "
              "RTF long is a synthesized recording with pauses, segmented and decoded 8 segments at a time "
              "(a finished row takes the next segment; segments that start together are prefilled in one "
              "forward). Prefill 196, 8 together: eight such prompts in one forward, per prompt. "
              "Peak RSS is taken after the transcriptions and stage timings, before the step timings fill "
              "eight cache rows. Decode step weights GB/s: the stored matrices one step reads (all decoder "
              "matrices and the LM head) over the median step after 64 positions; ratios are of medians. "
              "File pages in 2 MiB pages: the share of the model files' resident mapped pages that the "
              "kernel maps in 2 MiB pages (nanoasr/formats/mapping.py; with --huge-pages the matrices are "
              "copies and the file's mapping keeps the rest)."]
    long = [(name, r["long_stage_s"]) for name, r in results["runs"].items() if "long_stage_s" in r]
    for name, stages in long:
        lines += ["", f"Long audio through {name}, seconds per stage: {stages}."]
    return "\n".join(lines) + "\n"


def _stored_type(name: str) -> str:
    # "nanoasr model-q8_0.gguf" / "llama.cpp decoder qwen3-q8_0.gguf" -> "q8_0"
    stem = Path(name.split()[-1]).stem
    return stem.rsplit("-", 1)[-1] if "-" in stem else stem


def ratios(runs: dict, bandwidth_gbs: float) -> list[str]:
    """The comparisons the targets are stated in, from this run's rows."""
    ours = {n: r for n, r in runs.items() if n.startswith("nanoasr") and "error" not in r}
    llama = {_stored_type(n): r for n, r in runs.items() if n.startswith("llama.cpp") and "error" not in r}
    hf = {n.split()[-1]: r for n, r in runs.items() if n.startswith("transformers") and "error" not in r}
    lines = ["| nanoasr run | decode / llama.cpp same type | prefill 196 / llama.cpp same type | "
             "decode step weights / read bandwidth | decode speed-up over Transformers bf16 | "
             "encoder+adaptor 30 s / Transformers fp32 | encoder+adaptor 30 s / Transformers bf16 | "
             "prefill 196 / Transformers fp32 | prefill 196 / Transformers bf16 | "
             "prefill 196, 8 together / alone |", "|---" * 10 + "|"]
    for name, r in ours.items():
        def over(key, other, invert=False):
            if other is None or key not in r or key not in other:
                return ""
            value = other[key] / r[key] if invert else r[key] / other[key]
            return f"{value:.2f}"
        same = llama.get(_stored_type(name))
        streamed = f"{r['decode_gb_per_s'] / bandwidth_gbs:.2f}" if "decode_gb_per_s" in r else ""
        together = (f"{r['prefill196_x8_ms_each'] / r['prefill196_ms']:.2f}"
                    if "prefill196_x8_ms_each" in r and "prefill196_ms" in r else "")
        cells = [over("decode_ms_per_token", same), over("prefill196_ms", same), streamed,
                 over("decode_ms_per_token", hf.get("bf16"), invert=True),
                 over("encoder_adaptor_30s_ms", hf.get("fp32")),
                 over("encoder_adaptor_30s_ms", hf.get("bf16")),
                 over("prefill196_ms", hf.get("fp32")), over("prefill196_ms", hf.get("bf16")), together]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--model", action="append", default=[],
                        help="nanoasr checkpoint dir or .gguf (repeat)")
    parser.add_argument("--transformers", default=None,
                        help="the same checkpoint dir, run through Transformers")
    parser.add_argument("--llama-gguf", action="append", default=[],
                        help="a stock qwen3 GGUF of the same decoder "
                             "(repeat; nanoasr convert --export-qwen3-gguf)")
    parser.add_argument("--llama-python", default=sys.executable, help="the Python that has llama-cpp-python")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--long-seconds", type=int, default=0,
                        help="also time this much long audio (segments)")
    parser.add_argument("--long-model", default=None, help="run the long audio on this --model only")
    parser.add_argument("--long-sequential", default=True, action=argparse.BooleanOptionalAction,
                        help="time the long audio's segments one by one as well")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where nanoasr runs")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    parser.add_argument("--reference", default="funasr", choices=("funasr", "transformers"))
    parser.add_argument("--activations", default="exact", choices=("exact", "int8", "bf16"),
                        help="nanoasr's rows against block-quantized weights in decoding: float32 or int8")
    parser.add_argument("--huge-pages", default="off", choices=("off", "on", "both"),
                        help="nanoasr's weight matrices read into huge pages (Model.load(huge_pages=True)); "
                             "both: each model both ways")
    parser.add_argument("--isa", default="native", choices=tuple(ISA_ENVIRON),
                        help="avx2: every side held to an AVX2-only CPU's instructions (ISA_ENVIRON)")
    parser.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--report", default=None, help="write a markdown table here")
    args = parser.parse_args()
    if args.child:
        args.model = args.model[-1]
        print(json.dumps(CHILDREN[args.child[1]](args)))
        return 0
    results = {"machine": machine(args)}
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
    if args.report:  # a new dated section: earlier runs, on other machines too, stay for comparison
        path = Path(args.report)
        before = path.read_text() if path.exists() else "# Performance\n"
        path.write_text(before.rstrip("\n") + "\n\n" + report(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
