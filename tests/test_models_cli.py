"""`python -m nanoasr models …` and `python -m nanoasr doctor` against the local fake hub of test_hub."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_hub
from test_hub import CONFIG, GGUF_OLD, NEW, OLD, FakeHub, sha256

from nanoasr import cli
from nanoasr.cli import doctor

# The fake hub's fixtures, bound here so they reach these tests however pytest collects test_hub.
fake_hub, hf_env = test_hub.fake_hub, test_hub.hf_env
ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_packages_and_cached_state(hf_env, fake_hub, capsys):
    code, out, err = run(capsys, "models", "list")
    assert code == 0 and not err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "FORMAT", "SIZE", "CACHED", "REPO@REVISION", "LICENSE"]
    q8 = next(line for line in lines if line.startswith("q8 "))
    assert q8.split()[:5] == ["q8", "gguf", f"{len(GGUF_OLD)}", "B", "no"] and f"test/gguf@{OLD[:12]}" in q8
    assert "Test License 1.0" in q8 and "default: ckpt" in out
    assert run(capsys, "models", "download", "q8", "--quiet")[0] == 0
    code, out, _ = run(capsys, "models", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows["q8"]["cached"] and not rows["f16"]["cached"]
    assert rows["q8"]["revision"] == OLD and rows["q8"]["size"] == len(GGUF_OLD)
    assert rows["f16"]["size"] is None


def test_info(hf_env, fake_hub, capsys):
    code, out, err = run(capsys, "models", "info", "q8")
    assert code == 0 and not err
    assert "repo:        test/gguf" in out and f"revision:    {OLD}" in out
    assert "license:     Test License" in out
    assert f"m-q8_0.gguf  {len(GGUF_OLD)} B  sha256 {sha256(GGUF_OLD)}" in out
    assert "downloaded:  no; python -m nanoasr models download q8" in out
    code, out, _ = run(capsys, "models", "info", "test/gguf@main:q8_0", "--json")
    assert code == 0 and json.loads(out)["revision"] == "main" and json.loads(out)["name"] == "q8"
    assert not fake_hub.requests  # info never asks the hub


def test_download_prints_path_and_progress_header(hf_env, fake_hub, capsys):
    code, out, err = run(capsys, "models", "download", "q8")
    path = Path(out.strip())
    assert code == 0 and path.name == "m-q8_0.gguf" and path.read_bytes() == GGUF_OLD
    header = f"nanoasr: downloading q8 (test/gguf@{OLD[:12]}, {len(GGUF_OLD)} bytes) to {hf_env / 'hub'}\n"
    assert err == header  # one line before the download, and nothing after it
    assert run(capsys, "models", "download", "q8") == (0, out, "")  # nothing to fetch: nothing said
    code, out, err = run(capsys, "models", "download", "q8", "--revision", NEW, "--quiet")
    assert code == 0 and f"/snapshots/{NEW}/" in out and not err


def test_download_to_local_dir_and_remove(hf_env, fake_hub, capsys, tmp_path):
    target = tmp_path / "plain"
    code, out, _ = run(capsys, "models", "download", "ckpt", "--local-dir", str(target), "--quiet")
    assert code == 0 and Path(out.strip()) == target and (target / "config.json").is_file()
    code, out, _ = run(capsys, "models", "info", "ckpt", "--local-dir", str(target), "--json")
    assert json.loads(out)["cached"] and json.loads(out)["path"] == str(target)
    code, out, _ = run(capsys, "models", "remove", "ckpt", "--local-dir", str(target))
    assert code == 0 and out.startswith("removed ckpt:") and not (target / "model.safetensors").exists()


def test_local_dir_remove_keeps_the_users_files(hf_env, fake_hub, capsys, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes")
    (folder / "my.wav").write_bytes(b"RIFF....WAVE")
    code, out, _ = run(capsys, "models", "download", "test/other", "--local-dir", str(folder), "--quiet")
    assert code == 0 and (folder / "model.safetensors").is_file()
    code, out, err = run(capsys, "models", "remove", "test/other", "--local-dir", str(folder))
    assert code == 0 and out.strip() == f"removed test/other: {len(CONFIG) + 2 + 64} B freed" and not err
    assert sorted(p.name for p in folder.iterdir()) == ["my.wav", "notes.txt"]


def test_remove_refuses_a_manifest_entry_outside_the_folder(hf_env, fake_hub, capsys, tmp_path):
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    folder = tmp_path / "models"
    folder.mkdir()
    manifest = {"repo": "test/other", "files": ["../sentinel.txt"]}
    (folder / "nanoasr-package.json").write_text(json.dumps(manifest))
    code, out, err = run(capsys, "models", "remove", "test/other", "--local-dir", str(folder))
    assert code == 1 and not out and err.count("\n") == 1 and "entry '../sentinel.txt' climbs out" in err
    assert sentinel.read_text() == "keep me" and not fake_hub.requests


@pytest.mark.parametrize("argv", [
    ["models", "info", "q8", "--revision", "../x"],
    ["models", "info", "test/gguf@a..b:q8_0", "--json"],
    ["models", "download", "q8", "--revision", "main.lock", "--quiet"],
    ["models", "download", "test/gguf@-x:q8_0", "--quiet"],
    ["models", "download", "q8", "--revision", "", "--quiet"],
    ["models", "remove", "q8", "--revision=-x"],
    ["models", "remove", "test/gguf@a b:q8_0", "--local-dir", "somewhere"],
])
def test_bad_revisions_exit_1_without_asking_the_hub(hf_env, fake_hub, capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 1 and not out and err.count("\n") == 1
    assert err.startswith("nanoasr models: error: revision ")
    assert "expected a 40-hex commit or a branch or tag name" in err and not fake_hub.requests


def test_remove(hf_env, fake_hub, capsys):
    assert run(capsys, "models", "download", "ckpt", "--quiet")[0] == 0
    code, out, err = run(capsys, "models", "remove", "ckpt")
    assert code == 0 and out.strip() == f"removed ckpt: {len(CONFIG) + 2 + 64} B freed" and not err
    code, out, err = run(capsys, "models", "remove", "ckpt")
    assert code == 1 and not out and err.count("\n") == 1 and "not in the cache" in err


@pytest.mark.parametrize("argv, expected", [
    (["models", "download", "bad", "--quiet"], "sha256 mismatch"),
    (["models", "info", "nope"], "'nope' is not a model directory, .gguf file, package name (ckpt, q8"),
    (["models", "download", "nobody/nothing", "--quiet"], "no such model repository"),
])
def test_errors_are_one_line_exit_1(hf_env, fake_hub, capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    errors = [line for line in err.splitlines() if line.startswith("nanoasr models: error: ")]
    assert code == 1 and len(errors) == 1
    assert expected in errors[0] and err.endswith(errors[0] + "\n") and "Traceback" not in err


def test_offline_download_explains(hf_env, fake_hub, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "models", "download", "f16")
    assert code == 1 and "offline mode is on (HF_HUB_OFFLINE)" in err and "Unset HF_HUB_OFFLINE" in err
    assert "models download" not in err  # not the command that just failed
    assert not fake_hub.requests


@pytest.mark.parametrize("argv", [["models"], ["models", "remove"], ["models", "list", "--bogus"],
                                  ["models", "frobnicate"], ["doctor", "--bogus"]])
def test_usage_errors_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and "usage:" in err and not out


def test_doctor_text_sections(hf_env, fake_hub, capsys):
    code, out, _ = run(capsys, "doctor", "--model", "q8")
    assert code == 0
    sections = ("versions", "system", "backends", "blas", "numba", "cpu", "kernels", "kernel_cache",
                "environment", "model")
    assert [line[1:-1] for line in out.splitlines() if line.startswith("[")] == list(sections)
    assert f"python:          {sys.version.split()[0]}" in out and "huggingface_hub:" in out
    assert "cuda_status:" in out and "threading_layer:" in out and "features:" in out
    assert "resolved:  False" in out and "python -m nanoasr models download q8" in out
    assert not fake_hub.requests  # the doctor never downloads


def test_doctor_json_reports_a_cached_model(hf_env, fake_hub, capsys):
    run(capsys, "models", "download", "q8", "--quiet")
    code, out, _ = run(capsys, "doctor", "--model", "q8", "--json")
    data = json.loads(out)
    assert code == 0 and data["model"]["resolved"] and data["model"]["revision"] == OLD
    assert data["model"]["format"] == "gguf" and data["model"]["license"] == "Test License 1.0"
    assert data["model"]["quant"] == "q8_0" and data["model"]["package"] == "q8"
    assert data["versions"]["numpy"] == __import__("numpy").__version__
    assert data["numba"]["threads"] >= 1 and isinstance(data["cpu"]["features"].get("avx2"), bool)
    assert isinstance(data["backends"]["cuda"], bool) and isinstance(data["blas"], list)
    from nanoasr.kernels.int8.dot import host_path
    assert data["kernels"]["int8_many_rows"].startswith("int8 GEMM") == (host_path() is not None)
    assert data["kernels"]["int8_decode"] == (f"int8 ({host_path()})" if host_path() else "float32 (no AVX2)")
    import llvmlite.binding as llvm
    zen = llvm.get_host_cpu_name().startswith("znver")
    assert data["kernels"]["weight_prefetch"] == ("into L2, 8 rows ahead" if zen else "into L1, 4 rows ahead")


def test_doctor_counts_the_kernel_cache_entries_where_they_are_kept(tmp_path, monkeypatch):
    """The cache's place as kernels/jit.py chose it, and the compiled entries (.nbc, beside their .nbi
    indexes) of the kernel source folders' cache folders there, nothing else."""
    from nanoasr.kernels import jit

    place = jit.CachePlace("NUMBA_CACHE_DIR", tmp_path)
    monkeypatch.setattr(jit, "cache_place", lambda: place)
    kernels, int8 = place.directory(jit.KERNELS), place.directory(jit.KERNELS / "int8")
    for folder, names in ((kernels, ["a.nbi", "a.1.nbc", "a.2.nbc"]), (int8, ["b.nbi", "b.1.nbc", "b.py"]),
                          (tmp_path / "other_library", ["c.nbi", "c.1.nbc"])):
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_bytes(b"x" * 100_000)
    found = doctor.kernel_cache()
    assert {k: found[k] for k in ("directory", "where", "compiled")} == {
        "directory": str(tmp_path), "where": "NUMBA_CACHE_DIR", "compiled": 3}
    assert found["size_mb"] == round(5 * 100_000 / 2**20, 1) == 0.5
    assert found["sources_writable"] in ("yes", "no")


def test_doctor_never_shows_the_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    assert doctor.environment()["HF_TOKEN"] == "set"
    assert "hf_secret_value" not in json.dumps(doctor.environment())


def test_cpu_flags_fallback_reads_proc_cpuinfo():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo")
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    assert doctor._proc_flags()["avx2"] == ("avx2" in flags)
    assert doctor._proc_flags()["avx512bf16"] == ("avx512_bf16" in flags)


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
"""


def test_doctor_names_the_arm_features_on_aarch64(monkeypatch, tmp_path):
    """On aarch64 the doctor reports ARM's features (LLVM's names, or /proc/cpuinfo's Features line) and
    names dotprod as what the int8 path lacks."""
    import llvmlite.binding as llvm

    from nanoasr.kernels import target
    from nanoasr.kernels.int8 import dot as int8_dot

    monkeypatch.setattr(doctor.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: {"neon": True, "dotprod": True, "i8mm": False,
                                                                "sve": True, "avx2": True})
    assert doctor.cpu()["features"] == {"neon": True, "dotprod": True, "i8mm": False, "sve": True,
                                        "bf16": False}
    (tmp_path / "cpuinfo").write_text(ARM_CPUINFO)
    assert doctor._proc_flags(str(tmp_path / "cpuinfo")) == {"neon": True, "dotprod": True, "i8mm": False,
                                                             "sve": False, "bf16": False}
    monkeypatch.setattr(target, "architecture", lambda: "aarch64")
    for features, decode in ((("neon",), "float32 (no dotprod)"),
                             (("neon", "dotprod", "i8mm"), "int8 (i8mm)")):
        monkeypatch.setattr(target, "features", lambda: dict.fromkeys(features, True))
        int8_dot.host_path.cache_clear()
        try:
            assert doctor.kernels()["int8_decode"] == decode
        finally:
            int8_dot.host_path.cache_clear()


def test_real_package_through_a_fresh_process(tmp_path):
    """The shipped spec and environment variables alone (nothing patched): download, list, offline doctor."""
    from nanoasr import hub

    package = hub.default_package()
    files = {f.name: f"dummy {f.name}".encode() for f in package.files}
    repos = {package.repo: {"refs": {"main": package.revision}, "commits": {package.revision: files}}}
    server = FakeHub(repos)
    server.thread.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=server.url, PYTHONPATH=str(ROOT))
    try:
        def nanoasr(*argv, **extra):
            return subprocess.run([sys.executable, "-m", "nanoasr", *argv], capture_output=True, text=True,
                                  env=dict(env, **extra), cwd=tmp_path, timeout=120)

        done = nanoasr("models", "download", package.name)
        assert done.returncode == 0, done.stderr
        path = Path(done.stdout.strip())
        repo_dir = tmp_path / "hf" / "hub" / f"models--{package.repo.replace('/', '--')}"
        assert path == repo_dir / "snapshots" / package.revision
        assert sorted(p.name for p in path.iterdir()) == sorted(files)
        listed = nanoasr("models", "list")
        row = next(line for line in listed.stdout.splitlines() if line.startswith(package.name))
        size = sum(len(data) for data in files.values())  # the cached files' own sizes
        assert row.split()[2:5] == [str(size), "B", "yes"]
        report = nanoasr("doctor", "--json", HF_HUB_OFFLINE="1")
        model = json.loads(report.stdout)["model"]
        assert report.returncode == 0 and model["resolved"] and model["path"] == str(path)
        assert (model["repo"], model["revision"], model["license"]) == (package.repo, package.revision,
                                                                        package.license)
    finally:
        server.server.shutdown()
        server.server.server_close()
    assert all(package.revision in p for _, p in server.requests if "/resolve/" in p)


@pytest.mark.parametrize("text, expected", [("always [madvise] never\n", "madvise"),
                                            ("[always] madvise never\n", "always"), ("", None)])
def test_doctor_reads_the_huge_pages_setting(tmp_path, text, expected):
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert doctor.transparent_huge_pages(str(setting)) == expected
    assert doctor.transparent_huge_pages(str(tmp_path / "absent")) is None
