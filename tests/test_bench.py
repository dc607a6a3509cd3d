"""tools/bench/bench.py's plumbing on the tiny checkpoint: interleaved rounds, medians with their spread, the
machine's description with and without llama-cpp-python, a nanoasr child's figures, and the markdown page
of a run or of saved runs; and tools/bench/overlap_bench.py's rounds. No timing is judged here."""
import json
import subprocess
import sys

import pytest

from tools.bench import bench


def test_rounds_summarize_to_medians_with_min_and_max():
    rounds = [{"decode_ms_per_token": 3.0, "same_ids": True, "device": "x"},
              {"error": "killed"},
              {"decode_ms_per_token": 1.0, "same_ids": False, "device": "x"},
              {"decode_ms_per_token": 2.0, "same_ids": True, "device": "x"}]
    got = bench.summarize(rounds)
    assert got["decode_ms_per_token"] == 2.0 and got["spread"]["decode_ms_per_token"] == [1.0, 3.0]
    assert got["same_ids"] is False and got["device"] == "x"
    assert (got["rounds"], got["failed_rounds"]) == (3, 1)
    assert bench.summarize([{"error": "a"}, {"error": "b"}]) == {"error": "b"}


def test_configurations_run_interleaved_and_the_report_carries_the_machine(monkeypatch, tmp_path):
    calls = []

    def fake_child(kind, model, args, **extra):
        calls.append((model, extra.get("huge-pages")))
        figures = {"decode_ms_per_token": 10.0 + len(calls), "prefill196_ms": 100.0}
        if kind == "nanoasr":
            figures["decode_gb_per_s"] = 5.0
        return figures

    monkeypatch.setattr(bench, "run_child", fake_child)
    monkeypatch.setattr(bench, "read_bandwidth", lambda threads: {"median": 20.0, "min": 18.0, "max": 21.0})
    monkeypatch.setattr(bench, "llama_system_info", lambda python: "AVX = 1 | AVX2 = 1")
    report = tmp_path / "speed.md"
    report.write_text("# An earlier page\n")
    monkeypatch.setattr(sys, "argv", ["bench.py", "--model", "a/m-bf16", "--model", "b/m-q8_0.gguf",
                                      "--llama-gguf", "qwen3-q8_0.gguf", "--rounds", "2",
                                      "--huge-pages", "both", "--json", str(tmp_path / "out.json"),
                                      "--report", str(report)])
    assert bench.main() == 0
    assert calls == [("a/m-bf16", "off"), ("a/m-bf16", "on"), ("b/m-q8_0.gguf", "off"),
                     ("b/m-q8_0.gguf", "on"), ("qwen3-q8_0.gguf", None)] * 2
    results = json.loads((tmp_path / "out.json").read_text())
    q8 = results["runs"]["nanoasr m-q8_0.gguf"]
    assert q8["decode_ms_per_token"] == 15.5 and q8["spread"]["decode_ms_per_token"] == [13.0, 18.0]
    assert results["command"].startswith("python tools/bench/bench.py --model a/m-bf16 ")
    text = report.read_text()  # the page replaces what was there
    assert text.startswith("# Speed\n") and "earlier" not in text
    features = bench.machine(bench.argparse.Namespace(llama_python=sys.executable))["cpu_features"]
    assert features and features in text
    assert "- llama.cpp: AVX = 1 | AVX2 = 1" in text and "2 interleaved rounds" in text
    assert "Read bandwidth: 20.0 GB/s" in text
    # the q8_0 rows against llama.cpp's q8_0 row: decode 15.5 and 16.5 against 17.5, prefill 100 against 100
    assert "| nanoasr m-q8_0.gguf | 1.13x | 1.00x |" in text
    assert "| nanoasr --huge-pages m-q8_0.gguf | 1.06x | 1.00x |" in text


def test_the_same_file_name_in_two_folders_keeps_two_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "run_child", lambda kind, model, args, **extra: {"decode_ms_per_token": 10.0})
    monkeypatch.setattr(bench, "read_bandwidth", lambda threads: {"median": 20.0, "min": 18.0, "max": 21.0})
    monkeypatch.setattr(sys, "argv", ["bench.py", "--model", "written/m-q8_0.gguf", "--model",
                                      "read/m-q8_0.gguf", "--model", "m-bf16", "--rounds", "1",
                                      "--json", str(tmp_path / "out.json")])
    assert bench.main() == 0
    runs = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert list(runs) == ["nanoasr written/m-q8_0.gguf", "nanoasr read/m-q8_0.gguf", "nanoasr m-bf16"]
    assert bench._stored_type("nanoasr written/m-q8_0.gguf") == "q8_0"


@pytest.mark.parametrize("installed", [True, False])
def test_llama_system_info_with_and_without_the_package(tmp_path, installed):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + ("echo 'CPU : AVX2 = 1 | FMA = 1'\n" if installed else "exit 1\n"))
    python.chmod(0o755)
    got = bench.llama_system_info(str(python))
    absent = f"llama-cpp-python is not installed for {python}"
    assert got == ("CPU : AVX2 = 1 | FMA = 1" if installed else absent)


def test_read_bandwidth_reports_a_median_inside_its_range():
    got = bench.read_bandwidth(threads=2, mib=16, repeats=3)
    assert 0 < got["min"] <= got["median"] <= got["max"]


def test_a_nanoasr_child_on_the_tiny_checkpoint(tiny_dir):
    done = subprocess.run([sys.executable, bench.__file__, "child", "nanoasr", "--model", str(tiny_dir),
                           "--seconds", "2", "--tokens", "3", "--threads", "1"],
                          capture_output=True, text=True, env=bench.environ_without_blas_vars())
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("decode_ms_per_token", "prefill196_ms", "encoder_adaptor_30s_ms", "step_ms_ctx64_b1"):
        assert figures[key] > 0
    assert figures["decode_gb_per_s"] > 0
    share = figures["file_pages_2mib_share"]  # the share of the checkpoint's mapped pages in 2 MiB pages
    assert share is None if not sys.platform.startswith("linux") else 0 <= share <= 1


def test_overlap_bench_times_the_stages_apart_and_together(tiny_dir):
    import re

    script = bench.__file__.replace("bench.py", "overlap_bench.py")
    done = subprocess.run([sys.executable, script, str(tiny_dir), "--steps", "2", "--rounds", "2"],
                          capture_output=True, text=True, env=bench.environ_without_blas_vars())
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = done.stdout.strip().splitlines()[1:]
    shape = (r"one after the other: \d+ \+ \d+ = \d+ \| at once, 1 \+ 1 threads: \d+ \(encode \d+, decode "
             r"\d+\) \| at once, 2 \+ 2 threads: \d+ \(encode \d+, decode \d+\)")
    assert len(rounds) == 2 and all(re.fullmatch(shape, line) for line in rounds), done.stdout


def test_isa_avx2_holds_every_child_and_the_report_says_so(monkeypatch, tmp_path):
    envs = []

    def fake_run(cmd, env, capture_output, text, check=False):
        envs.append(env)
        out = ["openblas 0.3 Haswell"] if "-c" in cmd else {"decode_ms_per_token": 1.0}  # the BLAS asked
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(out) + "\n")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench, "read_bandwidth", lambda threads: {"median": 20.0, "min": 18.0, "max": 21.0})
    monkeypatch.setattr(bench, "llama_system_info", lambda python: "AVX2 = 1")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")  # as this machine's environment sets it
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1")
    report = tmp_path / "performance.md"
    monkeypatch.setattr(sys, "argv", ["bench.py", "--model", "m-q8_0.gguf", "--transformers", "ckpt",
                                      "--llama-gguf", "qwen3-q8_0.gguf", "--rounds", "1", "--isa", "avx2",
                                      "--report", str(report)])
    assert bench.main() == 0
    assert len(envs) == 5 and all(env["NUMBA_CPU_FEATURES"] == "+avx2,+fma,+f16c,+bmi2"
                                  and env["OPENBLAS_CORETYPE"] == "Haswell" and "OPENBLAS_L2_SIZE" not in env
                                  and env["ATEN_CPU_CAPABILITY"] == "avx2" for env in envs)
    text = report.read_text()
    assert any(line.startswith("## ") and ", held to AVX2, " in line for line in text.splitlines())
    assert "BLAS: openblas 0.3 Haswell;" in text


def saved_run(command: str, runs: dict) -> dict:
    machine = {"python": "3.11.7", "machine": "x86_64", "cpus": 2, "cpu": "AMD EPYC",
               "cpu_target": "znver4", "cpu_features": "avx2 fma avx512vnni -amx-tile",
               "blas": ["openblas 0.3 SkylakeX"], "llama_system_info": "CPU : AVX512 = 1"}
    return {"command": command, "date": "2026-12-06", "machine": machine, "runs": runs,
            "read_bandwidth_gbs": {"median": 35.0, "min": 34.0, "max": 36.0}}


def test_the_page_renders_saved_runs_with_their_machine_command_and_speed_ups(monkeypatch, tmp_path):
    decode = saved_run("python tools/bench/bench.py --model m-q8_0.gguf --llama-gguf qwen3-q8_0.gguf "
                       "--seconds 10 --tokens 40 --activations int8 --long-seconds 600 --json d.json",
                       {"nanoasr m-q8_0.gguf": {"decode_ms_per_token": 20.0, "prefill196_ms": 400.0,
                                                "rtf": 0.125, "long_rtf": 0.0712, "peak_rss_mb": 1451.4,
                                                "spread": {"rtf": [0.1, 0.2]}},
                        "nanoasr --huge-pages m-q8_0.gguf": {"decode_ms_per_token": 19.0},
                        "nanoasr m-q4_k_m.gguf": {"error": "killed"},
                        "llama.cpp decoder qwen3-q8_0.gguf": {"decode_ms_per_token": 30.0,
                                                              "prefill196_ms": 1000.0, "peak_rss_mb": 846.1}})
    clip = saved_run("python tools/bench/bench.py --model full --transformers full --seconds 4 --tokens 32 "
                     "--rounds 2",
                     {"nanoasr full": {"rtf": 0.4, "encoder_adaptor_30s_ms": 800.0},
                      "transformers fp32": {"rtf": 1.8, "encoder_adaptor_30s_ms": 1800.0},
                      "transformers bf16": {"rtf": 1.0}})
    paths = [tmp_path / "decode.json", tmp_path / "clip.json"]
    for path, results in zip(paths, (decode, clip)):
        path.write_text(json.dumps(results))
    page = tmp_path / "speed.md"
    monkeypatch.setattr(sys, "argv", ["bench.py", "--report", str(page), "--from", str(paths[0]),
                                      "--drop", "nanoasr --huge-pages m-q8_0.gguf", "--from", str(paths[1]),
                                      "--note", "Random weights of the real model's sizes."])
    assert bench.main() == 0
    text = page.read_text()
    head, first, second = text.split("\n## ")
    assert head.startswith("# Speed\n\nRandom weights of the real model's sizes.\n\nEach figure is the")
    assert (f"```sh\npython tools/bench/bench.py \\\n    --report {page} \\\n    --from {paths[0]} "
            "\\\n    --drop 'nanoasr --huge-pages m-q8_0.gguf' \\\n") in text and text.endswith("```\n")
    assert first.startswith("AMD EPYC (`znver4`), int8 activations, a 10 s clip, 2026-12-06\n")
    assert "- Command: `python tools/bench/bench.py --model m-q8_0.gguf " in first
    assert "3 interleaved rounds" in first
    assert "the features `nanoasr doctor` reports: avx2 fma avx512vnni -amx-tile" in first
    assert "- llama.cpp: CPU : AVX512 = 1" in first and "llama.cpp" not in second.split("\n\n")[1]
    assert ("| run | decode ms/token | prefill, 196 positions, ms | real-time factor, 10 s clip | "
            "real-time factor, 600 s | peak RSS MB |") in first  # only the columns some run has
    assert "| nanoasr m-q8_0.gguf | 20.0 | 400.0 | 0.125 | 0.071 | 1451.4 |" in first
    assert "| nanoasr m-q4_k_m.gguf | failed: killed |" in first and "--huge-pages" not in first
    assert "| nanoasr m-q8_0.gguf | 1.50x | 2.50x |" in first  # llama.cpp's time over nanoasr's
    assert second.startswith("AMD EPYC (`znver4`), a 4 s clip, 2026-12-06\n") and "2 interleaved" in second
    assert "| nanoasr full | 2.25x | 4.50x | 2.50x |" in second  # encoder+adaptor, the clip fp32, bf16


def test_drop_needs_a_saved_run_before_it_and_from_needs_a_page(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", ["bench.py", "--report", "x.md", "--drop", "nanoasr full"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--drop names a row of the --from before it" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["bench.py", "--from", "run.json"])
    with pytest.raises(SystemExit, match="give --report FILE"):
        bench.main()
