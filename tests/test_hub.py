"""nanoasr.hub against a local fake hub: a threaded HTTP server on 127.0.0.1 that answers the few hub
endpoints huggingface_hub calls (HEAD/GET resolve, revision info, tree). Nothing touches the network."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import threading
from pathlib import Path

import pytest

from nanoasr import hub
from nanoasr.errors import ModelError

OLD, NEW = "a" * 40, "b" * 40  # two commits of the GGUF repo; packages pin OLD, main points at NEW
CKPT = "c" * 40


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeHub:
    """Repos as {repo: {"refs": {name: commit}, "commits": {commit: {filename: bytes}}}}."""

    def __init__(self, repos: dict):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def commit(self, repo: str, revision: str) -> str | None:
        refs, commits = self.repos[repo]["refs"], self.repos[repo]["commits"]
        commit = refs.get(revision, revision)
        return commit if commit in commits else None

    def downloads(self, filename: str) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and path.endswith("/" + filename)]


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: FakeHub
    API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/?]+)")
    RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>[^?]+)")

    def log_message(self, *args):  # keep test output clean
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool):
        self.hub.requests.append((self.command, self.path))
        api, resolve = self.API.match(self.path), self.RESOLVE.fullmatch(self.path)
        match = api or resolve
        if match is None or match["repo"] not in self.hub.repos:
            return self._error(404 if match else 400, "RepoNotFound", None)
        commit = self.hub.commit(match["repo"], match["rev"])
        if commit is None:
            return self._error(404, "RevisionNotFound", None)
        files = self.hub.repos[match["repo"]]["commits"][commit]
        if api and api["kind"] == "revision":
            info = {"id": api["repo"], "sha": commit, "siblings": [{"rfilename": n} for n in files]}
            return self._send(json.dumps(info).encode(), commit, body)
        if api:
            tree = [{"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                    for n, d in files.items()]
            return self._send(json.dumps(tree).encode(), commit, body)
        if resolve["file"] not in files:
            return self._error(404, "EntryNotFound", commit)
        data = files[resolve["file"]]
        self._send(data, commit, body, etag=sha256(data))

    def _send(self, data: bytes, commit: str, body: bool, etag: str | None = None):
        self.send_response(200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{etag or hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, commit: str | None):
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", "0")
        self.end_headers()


GGUF_OLD, GGUF_NEW = b"GGUF old revision " * 50, b"GGUF new revision " * 60
CONFIG = b'{"model_type": "fun_asr_nano"}'
REPOS = {
    "test/gguf": {"refs": {"main": NEW}, "commits": {
        OLD: {"m-q8_0.gguf": GGUF_OLD, "m-f16.gguf": GGUF_OLD + b"f16", "bad-q4_k_m.gguf": b"tampered"},
        NEW: {"m-q8_0.gguf": GGUF_NEW, "m-f16.gguf": GGUF_NEW + b"f16"},
    }},
    "test/ckpt": {"refs": {"main": CKPT}, "commits": {
        CKPT: {"config.json": CONFIG, "tokenizer.json": b"{}", "model.safetensors": b"\0" * 64,
               "README.md": b"x"},
    }},
    "test/funasr": {"refs": {"main": CKPT}, "commits": {  # FunASR's folder, with its Qwen3-0.6B/ subfolder
        CKPT: {"model.pt": b"PK\x03\x04 weights", "config.yaml": b"model: FunASRNano\n",
               "Qwen3-0.6B/tokenizer.json": b"{}", "README.md": b"x"},
    }},
    "test/other": {"refs": {"main": CKPT}, "commits": {  # a repo no package describes
        CKPT: {"config.json": CONFIG, "tokenizer.json": b"{}", "model.safetensors": b"\0" * 64,
               "README.md": b"x", "other-Q4_K_M.gguf": b"GGUF q4"},
    }},
}


def package(name, fmt, repo, revision, files):
    return {"name": name, "description": f"test {name}", "format": fmt, "repo": repo, "revision": revision,
            "files": files, "license": "Test License 1.0", "license_url": "https://example.org/license"}


SPEC = {"default_package": "ckpt", "packages": [
    package("ckpt", "safetensors", "test/ckpt", CKPT,
            [{"name": "config.json"}, {"name": "tokenizer.json"},
             {"name": "model.safetensors", "size": 64, "sha256": sha256(b"\0" * 64)}]),
    package("q8", "gguf", "test/gguf", OLD,
            [{"name": "m-q8_0.gguf", "size": len(GGUF_OLD), "sha256": sha256(GGUF_OLD)}]),
    package("f16", "gguf", "test/gguf", OLD, [{"name": "m-f16.gguf", "size": None, "sha256": None}]),
    package("bad", "gguf", "test/gguf", OLD,
            [{"name": "bad-q4_k_m.gguf", "sha256": sha256(b"what the spec says")}]),
    dict(package("mlt", "model.pt", "test/funasr", CKPT,
                 [{"name": "model.pt"}, {"name": "config.yaml"}, {"name": "Qwen3-0.6B/tokenizer.json"}]),
         variant="fun-asr-mlt-nano-2512"),
]}


@pytest.fixture
def fake_hub():
    server = FakeHub(REPOS)
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def hf_env(fake_hub, tmp_path, monkeypatch):
    """HF_HOME and HF_ENDPOINT for this test. huggingface_hub reads them when first imported, so its
    constants are set to the same values, as a fresh process would compute them."""
    home = tmp_path / "hf"
    point_hf_at(monkeypatch, home, fake_hub.url)
    monkeypatch.setattr(hub, "spec", lambda: SPEC)
    return home


def point_hf_at(monkeypatch, home: Path, url: str) -> None:
    """HF_HOME (with its hub cache, xet cache and token files) at `home`, and the hub at `url`."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name, value in {"ENDPOINT": url, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"),
                        "HF_XET_CACHE": str(home / "xet"), "HF_ASSETS_CACHE": str(home / "assets"),
                        "HF_HUB_OFFLINE": False, "AGENT_HARNESSES_PATH": str(home / "agents.json"),
                        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
                        "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "tokens")
                        }.items():
        monkeypatch.setattr(constants, name, value, raising=False)


def test_default_package_downloads_only_its_files(hf_env, fake_hub):
    resolved = hub.resolve(progress=False)
    assert resolved.path.is_dir() and (resolved.path / "config.json").read_bytes() == CONFIG
    assert (resolved.repo, resolved.revision, resolved.package.name) == ("test/ckpt", CKPT, "ckpt")
    assert resolved.package.license == "Test License 1.0" and resolved.format == "safetensors"
    assert str(resolved.path).startswith(str(hf_env / "hub"))
    assert not (resolved.path / "README.md").exists() and not fake_hub.downloads("README.md")


def test_pinned_revision_is_fetched_not_main(hf_env, fake_hub):
    resolved = hub.resolve("q8", progress=False)
    assert resolved.path.name == "m-q8_0.gguf" and resolved.path.read_bytes() == GGUF_OLD
    assert resolved.revision == OLD and resolved.format == "gguf"
    assert all(f"/resolve/{OLD}/" in p for p in fake_hub.downloads("m-q8_0.gguf"))
    latest = hub.resolve("test/gguf@main:q8_0", progress=False)
    assert latest.path.read_bytes() == GGUF_NEW and latest.revision == NEW and latest.package.name == "q8"
    assert hub.resolve("q8", revision=NEW, progress=False).path.read_bytes() == GGUF_NEW
    assert hub.resolve("test/gguf:q8_0", progress=False).revision == OLD  # a package's repo: pinned commit


def test_a_funasr_folder_package_brings_its_subfolder_and_its_variant(hf_env, fake_hub):
    resolved = hub.resolve("mlt", progress=False)
    assert resolved.path.is_dir() and (resolved.path / "Qwen3-0.6B" / "tokenizer.json").read_bytes() == b"{}"
    assert (resolved.path / "config.yaml").is_file() and not (resolved.path / "README.md").exists()
    assert resolved.package.format == "model.pt" and resolved.package.variant == "fun-asr-mlt-nano-2512"
    assert hub.get_package("q8").variant == "fun-asr-nano-2512"  # the default


def test_second_resolve_uses_the_cache(hf_env, fake_hub):
    first = hub.resolve("q8", progress=False)
    count = len(fake_hub.requests)
    assert hub.resolve("q8", progress=False).path == first.path
    assert len(fake_hub.requests) == count  # a pinned commit already cached needs no request


def test_sha256_mismatch_names_file_and_removes_it(hf_env, fake_hub):
    with pytest.raises(ModelError) as err:
        hub.resolve("bad", progress=False)
    message = str(err.value)
    assert "bad-q4_k_m.gguf" in message and "sha256 mismatch" in message
    assert f"expected {sha256(b'what the spec says')}" in message and f"got {sha256(b'tampered')}" in message
    leftovers = [p for p in (hf_env / "hub").rglob("*") if p.is_file() or p.is_symlink()]
    assert not [p for p in leftovers if "bad-q4_k_m" in p.name or p.name == sha256(b"tampered")]
    assert not os.path.lexists(hf_env / "hub" / "models--test--gguf" / "snapshots" / OLD / "bad-q4_k_m.gguf")


def test_download_verifies_cached_files_again(hf_env, fake_hub):
    path = hub.download("ckpt", progress=False).path / "model.safetensors"
    blob = Path(os.path.realpath(path))
    blob.chmod(0o644)
    blob.write_bytes(b"\1" * 64)  # same size, other content
    assert hub.resolve("ckpt", progress=False).path == path.parent  # cached: trusted without rereading
    with pytest.raises(ModelError, match="model.safetensors: sha256 mismatch"):
        hub.download("ckpt", progress=False)
    assert not os.path.lexists(path) and not blob.exists()


def test_size_mismatch_is_reported(hf_env, fake_hub, monkeypatch):
    spec = json.loads(json.dumps(SPEC))
    spec["packages"][1]["files"][0].update(size=7, sha256=None)
    monkeypatch.setattr(hub, "spec", lambda: spec)
    with pytest.raises(ModelError, match=f"size mismatch: expected 7 bytes, got {len(GGUF_OLD)} bytes"):
        hub.resolve("q8", progress=False)


def test_offline_cached_works_without_requests(hf_env, fake_hub, monkeypatch):
    online = hub.resolve("q8", progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    count = len(fake_hub.requests)
    offline = hub.resolve("q8")
    assert (offline.path, offline.revision, offline.package.name) == (online.path, OLD, "q8")
    assert hub.resolve("test/gguf@main:q8_0", offline=False, progress=False).revision == NEW
    assert hub.resolve("test/gguf@main:q8_0").path.read_bytes() == GGUF_NEW  # refs/main was recorded
    assert len(fake_hub.requests) > count
    count = len(fake_hub.requests)
    hub.resolve("q8")
    assert len(fake_hub.requests) == count


def test_offline_missing_says_what_and_how(hf_env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        hub.resolve("f16")
    message = str(err.value)
    assert "offline" in message and "m-f16.gguf" in message and str(hf_env / "hub") in message
    assert "python -m nanoasr models download f16" in message
    assert not fake_hub.requests
    with pytest.raises(ModelError, match=r"models download test/ckpt@main"):
        hub.resolve("test/ckpt@main")
    with pytest.raises(ModelError, match=r"models download q8 --revision " + NEW):
        hub.resolve("q8", revision=NEW)
    assert not fake_hub.requests


def test_offline_parameter_overrides_environment(hf_env, fake_hub):
    with pytest.raises(ModelError, match="is not downloaded: missing m-q8_0.gguf") as err:
        hub.resolve("q8", offline=True)
    assert "HF_HUB_OFFLINE" not in str(err.value)  # the caller asked, not the environment
    assert not fake_hub.requests


def test_package_repo_at_a_branch_uses_the_package_files(hf_env, fake_hub):
    resolved = hub.resolve("test/ckpt@main", progress=False)
    assert resolved.revision == CKPT and resolved.package.name == "ckpt"
    assert not fake_hub.downloads("README.md")


def test_other_repo_snapshot_takes_checkpoint_files_only(hf_env, fake_hub):
    resolved = hub.resolve("test/other", progress=False)
    assert (resolved.repo, resolved.revision, resolved.package) == ("test/other", CKPT, None)
    names = sorted(p.name for p in resolved.path.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    quant = hub.resolve("test/other:q4_k_m", progress=False)
    assert quant.path.name == "other-Q4_K_M.gguf" and quant.format == "gguf" and quant.revision == CKPT
    assert hub.resolve("test/other:q4_k_m", offline=True).path == quant.path


def test_local_dir_download_manifest_and_remove(hf_env, fake_hub, tmp_path):
    target = tmp_path / "models" / "q8"
    resolved = hub.download("q8", local_dir=target, progress=False)
    assert resolved.path == target / "m-q8_0.gguf" and resolved.path.read_bytes() == GGUF_OLD
    assert not (hf_env / "hub" / "models--test--gguf").exists()
    manifest = json.loads((target / hub.MANIFEST).read_text())
    assert manifest == {"package": "q8", "repo": "test/gguf", "revision": OLD, "files": ["m-q8_0.gguf"]}
    local = hub.resolve(str(resolved.path))  # a path: provenance from the manifest beside it
    assert (local.repo, local.revision, local.package.name) == ("test/gguf", OLD, "q8")
    assert hub.resolve("q8", local_dir=target, offline=True).path == resolved.path
    hub.download("f16", local_dir=target, progress=False)  # a second package in the same folder
    assert json.loads((target / hub.MANIFEST).read_text())["files"] == ["m-f16.gguf", "m-q8_0.gguf"]
    assert hub.resolve(str(resolved.path)).package.name == "q8"
    assert hub.resolve(str(target / "m-f16.gguf")).package.name == "f16"
    assert hub.remove("f16", local_dir=target) == len(GGUF_OLD) + 3
    assert json.loads((target / hub.MANIFEST).read_text())["files"] == ["m-q8_0.gguf"]
    assert hub.remove("q8", local_dir=target) == len(GGUF_OLD)
    assert not target.exists()  # nothing else was in it, huggingface_hub's bookkeeping included
    with pytest.raises(ModelError, match="is not downloaded"):
        hub.resolve("q8", local_dir=target, offline=True)


@pytest.mark.parametrize("name", ["ckpt", "test/other"])  # a package, and a snapshot of a repo none describes
def test_local_dir_records_and_removes_only_what_the_download_wrote(hf_env, fake_hub, tmp_path, name):
    folder = tmp_path / "mixed"
    folder.mkdir()
    mine = {"notes.txt": b"my notes", "my.wav": b"RIFF....WAVE", "mine.safetensors": b"my own weights"}
    for file, data in mine.items():
        (folder / file).write_bytes(data)
    hub.download(name, local_dir=folder, progress=False)
    manifest = json.loads((folder / hub.MANIFEST).read_text())
    assert manifest["files"] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert hub.remove(name, local_dir=folder) == len(CONFIG) + 2 + 64
    assert sorted(p.name for p in folder.iterdir()) == sorted(mine)  # no manifest, no .cache left
    assert all((folder / file).read_bytes() == data for file, data in mine.items())


def test_local_dir_remove_needs_the_manifest(hf_env, fake_hub, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "m-q8_0.gguf").write_bytes(GGUF_OLD)  # the package's file name, but not put here by nanoasr
    with pytest.raises(ModelError, match=f"{folder}: no {hub.MANIFEST}; nanoasr removes only files its"):
        hub.remove("q8", local_dir=folder)
    hub.download("f16", local_dir=tmp_path / "f16", progress=False)
    with pytest.raises(ModelError, match=f"q8: {tmp_path / 'f16' / hub.MANIFEST} records none of its files"):
        hub.remove("q8", local_dir=tmp_path / "f16")
    assert (folder / "m-q8_0.gguf").is_file() and (tmp_path / "f16" / "m-f16.gguf").is_file()


@pytest.fixture
def crafted(tmp_path):
    """A folder with a config.json to take and links to a sentinel outside it; a manifest writer."""
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "escape.safetensors").symlink_to(sentinel)
    (folder / "m-q8_0.gguf").symlink_to(sentinel)
    (folder / "outside").symlink_to(tmp_path, target_is_directory=True)

    def write(files):
        manifest = {"package": None, "repo": "test/other", "revision": CKPT, "files": files}
        (folder / hub.MANIFEST).write_text(json.dumps(manifest))
        return folder

    return write, sentinel


@pytest.mark.parametrize("name, entry, problem", [
    ("test/other", "../sentinel.txt", "climbs out of the folder with '..'"),
    ("test/other", "SENTINEL", "is an absolute path"),
    ("test/other", "escape.safetensors", "leads outside the folder through a symlink"),
    ("test/other", "outside/sentinel.txt", "leads outside the folder through a symlink"),
    ("q8", "m-q8_0.gguf", "leads outside the folder through a symlink"),  # the package file is such a link
])
def test_manifest_entries_leading_outside_delete_nothing(hf_env, fake_hub, crafted, name, entry, problem):
    write, sentinel = crafted
    entry = str(sentinel) if entry == "SENTINEL" else entry
    folder = write(["config.json", entry])  # config.json first: nothing goes before every entry is checked
    with pytest.raises(ModelError) as err:
        hub.remove(name, local_dir=folder)
    assert str(err.value).startswith(f"{folder / hub.MANIFEST}: entry {entry!r} {problem}; ")
    assert "nothing was deleted" in str(err.value) and "\n" not in str(err.value)
    assert sentinel.read_text() == "keep me" and (folder / "config.json").read_bytes() == CONFIG
    assert all(os.path.lexists(folder / link) for link in ("escape.safetensors", "m-q8_0.gguf", "outside"))
    with pytest.raises(ModelError, match="nothing was deleted"):  # a download refuses it before fetching
        hub.download(name, local_dir=folder, progress=False)
    assert not fake_hub.requests and sentinel.read_text() == "keep me"


def test_a_recorded_link_inside_the_folder_goes_but_not_its_target(hf_env, fake_hub, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "mine.bin").write_bytes(b"my file")
    (folder / "model.safetensors").symlink_to("mine.bin")
    (folder / hub.MANIFEST).write_text(json.dumps({"repo": "test/other", "files": ["model.safetensors"]}))
    hub.remove("test/other", local_dir=folder)
    assert not os.path.lexists(folder / "model.safetensors")
    assert (folder / "mine.bin").read_bytes() == b"my file"
    assert sorted(p.name for p in folder.iterdir()) == ["mine.bin"]


# --- issue 39, item 1: removal deletes only what the manifest records, never the Hugging Face home ---------

def hugging_face_home(home: Path) -> dict[Path, bytes]:
    """A Hugging Face home with another model's blob, a snapshot link to it and a login token: what must
    survive any removal. Returns {path: bytes} of its files."""
    blob = home / "hub" / "models--other--model" / "blobs" / ("d" * 64)
    link = home / "hub" / "models--other--model" / "snapshots" / CKPT / "model.safetensors"
    kept = {blob: b"another model's weights", home / "token": b"hf_secret_token",
            home / "stored_tokens": b"[work]\nhf_token = hf_other\n"}
    for path, data in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return {**kept, link: kept[blob]}


def survived(files: dict[Path, bytes]) -> bool:
    return all(path.read_bytes() == data for path, data in files.items())


def test_remove_with_the_home_directory_as_local_dir_keeps_the_hugging_face_home(
        hf_env, fake_hub, tmp_path, monkeypatch, capsys):
    """`models remove PKG --local-dir ~` used to rmtree ~/.cache/huggingface: the user's whole cache and
    login token, with "removed ..." and exit 0."""
    from nanoasr import cli

    home = tmp_path / "home"
    hf_home = home / ".cache" / "huggingface"  # HF_HOME where huggingface_hub puts it by default
    point_hf_at(monkeypatch, hf_home, fake_hub.url)
    kept = hugging_face_home(hf_home)
    (home / "notes.txt").write_text("mine")
    assert cli.main(["models", "download", "q8", "--local-dir", str(home), "--quiet"]) == 0
    record = hf_home / "download" / "m-q8_0.gguf.metadata"
    assert (home / "m-q8_0.gguf").is_file() and record.is_file()  # huggingface_hub writes into the home
    capsys.readouterr()
    assert cli.main(["models", "remove", "q8", "--local-dir", str(home)]) == 0
    assert capsys.readouterr().out == f"removed q8: {len(GGUF_OLD)} B freed\n"
    assert not (home / "m-q8_0.gguf").exists() and not (home / hub.MANIFEST).exists()
    assert survived(kept) and (home / "notes.txt").read_text() == "mine"
    assert record.is_file()  # in the Hugging Face home not even huggingface_hub's own record is deleted
    assert {p.name for p in hf_home.iterdir()} >= {"hub", "token", "stored_tokens"}


@pytest.mark.parametrize("where", ["the Hugging Face home", "another folder"])
def test_remove_never_deletes_through_a_cache_link(hf_env, fake_hub, tmp_path, monkeypatch, where):
    """local_dir/.cache a symlink: the old guard looked at the last component only, so the delete went
    wherever the link led."""
    elsewhere = tmp_path / "elsewhere"
    if where == "the Hugging Face home":
        point_hf_at(monkeypatch, elsewhere / "huggingface", fake_hub.url)
    kept = hugging_face_home(elsewhere / "huggingface")
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / ".cache").symlink_to(elsewhere, target_is_directory=True)
    hub.download("q8", local_dir=folder, progress=False)
    record = elsewhere / "huggingface" / "download" / "m-q8_0.gguf.metadata"
    assert record.is_file()  # huggingface_hub followed the link
    assert hub.remove("q8", local_dir=folder) == len(GGUF_OLD)
    assert not (folder / "m-q8_0.gguf").exists() and not (folder / hub.MANIFEST).exists()
    assert survived(kept) and record.is_file()  # nothing behind the link was touched
    assert (folder / ".cache").is_symlink() and sorted(p.name for p in folder.iterdir()) == [".cache"]


def test_an_entry_through_a_link_inside_the_folder_deletes_nothing(hf_env, fake_hub, tmp_path):
    folder = tmp_path / "models"
    (folder / "real").mkdir(parents=True)
    (folder / "real" / "config.json").write_bytes(b"the user's own config")
    (folder / "alias").symlink_to("real", target_is_directory=True)
    (folder / hub.MANIFEST).write_text(json.dumps({"repo": "test/other", "files": ["alias/config.json"]}))
    with pytest.raises(ModelError, match="entry 'alias/config.json' passes through the symlink alias; "):
        hub.remove("test/other", local_dir=folder)
    assert (folder / "real" / "config.json").read_bytes() == b"the user's own config"


def test_an_entry_in_the_hugging_face_home_deletes_nothing(hf_env, fake_hub, tmp_path, monkeypatch):
    home = tmp_path / "home"
    point_hf_at(monkeypatch, home / ".cache" / "huggingface", fake_hub.url)
    kept = hugging_face_home(home / ".cache" / "huggingface")
    entry = f".cache/huggingface/hub/models--other--model/snapshots/{CKPT}/model.safetensors"
    (home / hub.MANIFEST).write_text(json.dumps({"repo": "test/other", "files": [entry]}))
    with pytest.raises(ModelError, match="lies in the Hugging Face home or cache .*nothing was deleted"):
        hub.remove("test/other", local_dir=home)
    assert survived(kept)


def test_removal_runs_no_rmtree(hf_env, fake_hub, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: pytest.fail("rmtree called"))
    hub.download("mlt", local_dir=tmp_path / "m", progress=False)  # with a subfolder, Qwen3-0.6B/
    hub.remove("mlt", local_dir=tmp_path / "m")
    assert not (tmp_path / "m").exists()  # emptied folder by folder, huggingface_hub's records included


# --- issue 39, item 7: manifests that are deep, huge or not files are one clear error ---------------------

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "1" * 5000


@pytest.mark.parametrize("content, problem", [
    ('{"files": ' + DEEP + "}", "not a nanoasr manifest (ValueError: the JSON is nested too deeply)"),
    ('{"files": [' + HUGE_INT + "]}", "not a nanoasr manifest (ValueError: Exceeds the limit (4300 digits)"),
    ('{"files": ' + "[" * 500 + "]" * 500 + "}", "entry [[[[...]]]] is not a file path"),
    ('{"files": ["/' + "x" * 100_000 + '"]}', "entry '/xxxxxxxx"),  # said in a few dozen characters
    ("FIFO", "not a nanoasr manifest: it is a FIFO (named pipe), not a regular file"),
    (" " * (2 << 20), "not a nanoasr manifest: it is 2097152 bytes, more than the 1 MiB it may be"),
])
def test_hostile_manifest_is_one_clear_error(hf_env, fake_hub, tmp_path, content, problem):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "config.json").write_bytes(CONFIG)
    if content == "FIFO":
        os.mkfifo(folder / hub.MANIFEST)  # opening it to read would wait for a writer for ever
    else:
        (folder / hub.MANIFEST).write_text(content)
    for call in (lambda: hub.remove("test/other", local_dir=folder),
                 lambda: hub.download("test/other", local_dir=folder, progress=False)):
        with pytest.raises(ModelError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{folder / hub.MANIFEST}: ") and problem in message, message[:300]
        assert len(message) < 600 and "\n" not in message
    assert (folder / "config.json").is_file() and not fake_hub.requests


@pytest.mark.parametrize("content", [
    '{"repo": ' + DEEP + "}", '{"repo": "test/gguf", "revision": ' + HUGE_INT + "}",
    '{"repo": ["test/gguf"], "revision": {"a": 1}, "package": 7}', "FIFO",
    '{"repo": "test/gguf\nforged", "revision": "' + "a" * 400 + '"}',
])
def test_a_hostile_manifest_beside_a_model_only_loses_its_provenance(hf_env, fake_hub, tmp_path, content):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "m-q8_0.gguf").write_bytes(GGUF_OLD)
    if content == "FIFO":
        os.mkfifo(folder / hub.MANIFEST)
    else:
        (folder / hub.MANIFEST).write_text(content)
    for path in (folder, folder / "m-q8_0.gguf"):
        resolved = hub.resolve(str(path))
        assert (resolved.path, resolved.repo, resolved.revision, resolved.package) == (path, None, None, None)
    assert not fake_hub.requests


@pytest.mark.parametrize("content, problem", [
    ("not json", "not a nanoasr manifest (JSONDecodeError"),
    ('["config.json"]', "not a nanoasr manifest (TypeError"),
    ('{"repo": "test/other"}', "not a nanoasr manifest (KeyError"),
    ('{"files": "config.json"}', "'files' is a str; expected a list of file paths"),
    ('{"files": [3]}', "entry 3 is not a file path"),
    ('{"files": ["."]}', "entry '.' is not a file path"),
    ('{"files": ["a\\u0000b"]}', "entry 'a\\x00b' is not a usable file path"),
])
def test_malformed_manifest_is_one_clear_error(hf_env, fake_hub, tmp_path, content, problem):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "config.json").write_bytes(CONFIG)
    (folder / hub.MANIFEST).write_text(content)
    for call in (lambda: hub.remove("test/other", local_dir=folder),
                 lambda: hub.download("test/other", local_dir=folder, progress=False)):
        with pytest.raises(ModelError) as err:
            call()
        assert str(err.value).startswith(f"{folder / hub.MANIFEST}: ") and problem in str(err.value)
    assert (folder / "config.json").is_file() and not fake_hub.requests


def test_remove_cached_revision(hf_env, fake_hub):
    from huggingface_hub import scan_cache_dir

    ckpt = hub.resolve("ckpt", progress=False)
    assert hub.info("ckpt")["cached"]
    freed = hub.remove("ckpt")
    assert freed == len(CONFIG) + 2 + 64 and not ckpt.path.exists() and not hub.info("ckpt")["cached"]
    assert not [r for r in scan_cache_dir(hf_env / "hub").repos if r.repo_id == "test/ckpt" and r.revisions]
    with pytest.raises(ModelError, match="not in the cache"):
        hub.remove("ckpt")


def test_remove_one_package_of_a_shared_revision(hf_env, fake_hub):
    q8, f16 = hub.resolve("q8", progress=False), hub.resolve("f16", progress=False)
    assert hub.remove("q8") == len(GGUF_OLD)
    assert not os.path.lexists(q8.path) and f16.path.read_bytes() == GGUF_OLD + b"f16"
    assert hub.info("f16")["cached"] and not hub.info("q8")["cached"]


def test_existing_local_paths_are_used_directly(hf_env, fake_hub, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    for model in (tmp_path / "ckpt", str(tmp_path / "x.gguf")):
        resolved = hub.resolve(model)
        assert resolved.path == Path(model)
        assert (resolved.repo, resolved.revision, resolved.package) == (None, None, None)
    cached = hub.resolve("q8", progress=False)
    from_cache = hub.resolve(str(cached.path))
    assert (from_cache.repo, from_cache.revision, from_cache.package.name) == ("test/gguf", OLD, "q8")
    assert not [r for r in fake_hub.requests if "x.gguf" in r[1] or "ckpt" in r[1]]


@pytest.mark.parametrize("model", ["./missing", "~/missing-dir", "missing.gguf", "/abs/missing", "a/b/c"])
def test_missing_paths_fail_without_hub_lookup(hf_env, fake_hub, model):
    with pytest.raises(ModelError, match="no such model directory or .gguf file"):
        hub.resolve(model)
    assert not fake_hub.requests


def test_hub_errors_are_one_clear_line(hf_env, fake_hub):
    cases = {"nobody/nothing@main": "no such model repository",
             "test/gguf@feature:q8_0": "no revision 'feature'",
             "test/other@main:q4_0": "expected one .gguf", "test/gguf:q2_k": "no package with quant 'q2_k'",
             "unknown name": "not a model directory"}
    for model, expected in cases.items():
        with pytest.raises(ModelError, match=expected) as err:
            hub.resolve(model, progress=False)
        assert "\n" not in str(err.value)
    with pytest.raises(ModelError, match="name one: q8 .test/gguf:q8_0., f16"):
        hub.resolve("test/gguf")
    with pytest.raises(ModelError, match="no model package named 'nope'; known packages: ckpt, q8"):
        hub.get_package("nope")


def test_real_spec_packages_are_pinned_and_licensed():
    packages = {p.name: p for p in hub.list_packages()}
    raw = json.loads(Path(hub.__file__).with_name("model_specs").joinpath("fun_asr_nano.json").read_text())
    assert set(packages) == {p["name"] for p in raw["packages"]}
    default = hub.default_package()
    assert default.name == raw["default_package"] and default.repo == "FunAudioLLM/Fun-ASR-Nano-2512-hf"
    for p in packages.values():
        assert re.fullmatch(r"[0-9a-f]{40}", p.revision) and p.license and p.files
    assert {p.quant for p in packages.values() if p.format == "gguf"} >= {"q8_0", "f16"}
    assert {p.variant for p in packages.values()} == {"fun-asr-nano-2512", "fun-asr-mlt-nano-2512"}


def test_import_is_light():
    import subprocess
    import sys

    code = "import nanoasr, nanoasr.hub, sys; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


BAD_REVISIONS = ["", " ", "a b", "main\n", "a\tb", "a\x01b", "a\x7fb", "a\x00b", "a..b", "..", "-x", "x.lock",
                 "x.", ".x", "a~1", "a^", "a?", "a*", "a[b", "a\\b", "é", "x" * 256, "@", "a@{1}", "a:b",
                 "/x", "a//b", "x/", "refs/../x", "a/.b", "a/b.lock/c"]


@pytest.mark.parametrize("bad", BAD_REVISIONS)
def test_bad_revisions_are_refused_at_every_entry_point(hf_env, fake_hub, tmp_path, bad):
    calls = [lambda: hub.info("q8", revision=bad), lambda: hub.resolve("q8", revision=bad, progress=False),
             lambda: hub.download("q8", revision=bad, progress=False), lambda: hub.remove("q8", revision=bad),
             lambda: hub.remove("q8", revision=bad, local_dir=tmp_path)]
    hub_id = f"test/gguf@{bad}:q8_0"
    if not set(bad) & set(":@"):  # these end the revision of an id
        calls += [lambda: hub.info(hub_id), lambda: hub.download(hub_id, progress=False),
                  lambda: hub.remove(hub_id), lambda: hub.remove(hub_id, local_dir=tmp_path)]
        if "/" not in bad:  # more slashes make it a path, refused as such
            calls.append(lambda: hub.resolve(hub_id, progress=False))
    expected = r"^revision .* expected a 40-hex commit or a branch or tag name"
    for call in calls:
        with pytest.raises(ModelError, match=expected):
            call()
    assert not fake_hub.requests and not (hf_env / "hub").exists()


def test_good_revisions_pass():
    for revision in ("main", "v1.0", "refs/pr/1", "release/2025-01_b", "A" * 40, OLD, "x" * 255):
        assert hub.check_revision(revision) == revision
    assert hub.info(f"test/gguf@{NEW}:q8_0")["revision"] == NEW
