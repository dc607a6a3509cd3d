#!/usr/bin/env bash
# The CUDA backend on a GPU machine with no network, in about six minutes: install nanoasr from this working
# tree with wheels prepared beforehand, build the full-size random checkpoint, run tests/gpu on the device
# (the kernels, the strict device double, and every stage and the greedy ids against the CPU path for the
# tiny and the full-size checkpoints in F32, BF16, Q8_0 and Q4_K_M), benchmark, and write docs/reports/cuda.md.
#
#   tools/gpu_check.sh download WHEELS [PYTHON_VERSION [CUDA_MAJOR]]   # where pip reaches PyPI (3.12, 12)
#   tools/gpu_check.sh run WHEELS                                       # on the GPU machine
#
# `download` fetches, for the target Python on x86-64 Linux, every wheel that `run` installs: nanoasr's
# dependencies, pytest, the build backend, cupy-cudaNNx with its CUDA libraries ([ctk]) and numba-cuda[cuNN].
# `run` installs them into a fresh virtual environment, taking cupy-cuda12x or cupy-cuda13x, whichever wheel
# is in WHEELS. Set WORK to keep the checkpoints and logs somewhere else than a fresh folder under /tmp.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
mode=${1:-}
WHEELS=${2:-}
if [[ -z "$WHEELS" || ( "$mode" != download && "$mode" != run ) ]]; then
    sed -n '7,8p' "$0" >&2
    exit 2
fi

if [[ "$mode" == download ]]; then
    version=${3:-3.12}
    cuda=${4:-12}
    mapfile -t deps < <("$PYTHON" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$ROOT/pyproject.toml")
    "$PYTHON" -m pip download --dest "$WHEELS" --only-binary=:all: --python-version "$version" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 "${deps[@]}" pytest "setuptools>=68" wheel \
        "cupy-cuda${cuda}x[ctk]>=13" "numba-cuda[cu${cuda}]>=0.30.4"
    echo "wheels for Python $version and CUDA $cuda in $WHEELS"
    exit 0
fi

WHEELS=$(cd "$WHEELS" && pwd)
WORK=${WORK:-$(mktemp -d /tmp/nanoasr-gpu-check.XXXXXX)}
mkdir -p "$WORK"
LOG="$WORK/log"
stage() { echo "== $(date -u +%H:%M:%S) (+${SECONDS}s) $*" | tee -a "$LOG"; }

stage "install into $WORK/venv from $WHEELS"
cupy_wheel=$(ls "$WHEELS"/cupy_cuda1[23]x-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$cupy_wheel" ]]; then
    echo "no cupy-cuda12x or cupy-cuda13x wheel in $WHEELS: run '$0 download $WHEELS' where pip reaches PyPI" >&2
    exit 1
fi
major=$(basename "$cupy_wheel" | sed -E 's/cupy_cuda(1[23])x-.*/\1/')
"$PYTHON" -m venv "$WORK/venv"
# shellcheck disable=SC1091
source "$WORK/venv/bin/activate"
python -m pip install --no-index --find-links "$WHEELS" --quiet --disable-pip-version-check \
    "$ROOT" pytest "$cupy_wheel[ctk]" "numba-cuda[cu$major]"
cd "$ROOT"
python - <<'EOF' | tee -a "$LOG"
import cupy, numba, numba_cuda, numpy
from nanoasr import backend
usable, why = backend.cuda_status()
print(f"CuPy {cupy.__version__}, numba {numba.__version__}, numba-cuda {numba_cuda.__version__}, "
      f"numpy {numpy.__version__}; GPU: {why}")
raise SystemExit(0 if usable else f"no usable GPU: {why}")
EOF

stage "full-size random checkpoint and its GGUFs (F32, Q8_0, Q4_K_M) in $WORK/full"
FULL="$WORK/full"
python tools/random_checkpoint.py "$FULL"
for type in f32 q8_0 q4_k_m; do
    python -m nanoasr convert "$FULL" --type "$type" -o "$FULL/model-$type.gguf" >"$WORK/convert-$type.log" 2>&1 &
done

stage "tests/gpu on the device: kernels, strict double, tiny checkpoint against the CPU (while converting)"
set +e
python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$WORK/tests-tiny.log"
tiny_status=${PIPESTATUS[0]}
wait
set -e
for type in f32 q8_0 q4_k_m; do
    [[ -s "$FULL/model-$type.gguf" ]] || { cat "$WORK/convert-$type.log" >&2; exit 1; }
done

stage "every stage and the greedy ids against the CPU path, full size"
CHECKPOINTS="$FULL:$FULL/model-f32.gguf:$FULL/model-q8_0.gguf:$FULL/model-q4_k_m.gguf"
set +e
NANOASR_GPU_CHECKPOINTS="$CHECKPOINTS" python -m pytest tests/gpu/test_cuda_device.py -q -p no:cacheprovider \
    -k "not [tiny-" 2>&1 | tee "$WORK/tests-full.log"
full_status=${PIPESTATUS[0]}
set -e

stage "benchmark (10 s clip for every type; 10 minutes of audio on Q8_0)"
python tools/bench/bench.py --device cuda --threads "$(nproc)" --seconds 10 --tokens 40 \
    --model "$FULL" --model "$FULL/model-f32.gguf" --model "$FULL/model-q8_0.gguf" \
    --model "$FULL/model-q4_k_m.gguf" --long-seconds 600 --long-model "$FULL/model-q8_0.gguf" \
    --no-long-sequential --json "$WORK/bench.json" --report "$WORK/bench.md" >/dev/null

stage "writing docs/reports/cuda.md"
python - "$WORK" "$tiny_status" "$full_status" "$SECONDS" <<'EOF'
import json, shutil, subprocess, sys
from pathlib import Path

work, tiny, full, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = json.loads((work / "bench.json").read_text())["runs"]
gpu = next((r["device"] for r in runs.values() if "device" in r), "an unnamed GPU")
if shutil.which("nvidia-smi"):
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() or gpu
q8 = next((r for name, r in runs.items() if name.endswith("q8_0.gguf") and "error" not in r), {})

def last_line(name):
    lines = (work / name).read_text().strip().splitlines()
    return lines[-1] if lines else "(no output)"

def verdict(value, limit, unit):
    return "not measured" if value is None else f"{value:.2f} {unit} ({'met' if value <= limit else 'MISSED'})"

long_s = q8["long_rtf"] * 600 if "long_rtf" in q8 else None
bench = (work / "bench.md").read_text().split("\n", 2)[2].strip()  # without its title
lines = ["# CUDA backend on hardware", "",
         f"Written by `tools/gpu_check.sh run` in {seconds} s on {gpu}.", "",
         "## Checks against the CPU path", "",
         f"- tests/gpu (kernels on the device, strict device double, tiny checkpoint F32/BF16/Q8_0/Q4_K_M): "
         f"{'passed' if tiny == 0 else 'FAILED'}: {last_line('tests-tiny.log')}",
         f"- full size, BF16 safetensors and F32/Q8_0/Q4_K_M GGUF, every stage and the greedy ids: "
         f"{'passed' if full == 0 else 'FAILED'}: {last_line('tests-full.log')}", "",
         "## Targets", "",
         f"- Q8_0 decode at batch 1: {verdict(q8.get('decode_ms_per_token'), 5, 'ms/token')} (target 5)",
         f"- 10 minutes of audio, Q8_0: {verdict(long_s, 10, 's')} (target 10)", "",
         "## Benchmark", "",
         "The GPU runs queued work while the host goes on: the encoder+adaptor, prefill and step columns are "
         "timed up to a synchronisation, decode and RTF up to the ids read back at each step; a stage's share "
         "in the long-audio line is the time the host spent in it, not the GPU's.", "", bench, ""]
Path("docs/reports/cuda.md").write_text("\n".join(lines))
EOF
stage "done: docs/reports/cuda.md; logs in $WORK"
[[ $tiny_status -eq 0 && $full_status -eq 0 ]]
