"""Model packages and the Hugging Face hub: turn a `--model` value into local files.

A value is a local checkpoint directory or .gguf file, a package name from model_specs, or a hub id
`org/repo[@revision][:quant]`. Downloads go through huggingface_hub (its cache, `HF_ENDPOINT`, `HF_TOKEN`,
`HF_HUB_OFFLINE`, or a `local_dir`), fetch only a package's files, and check sizes and sha256 where the
spec gives them. huggingface_hub is imported on use, so importing nanoasr stays light.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import reprlib
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from nanoasr.checkpoints.spec import spec
from nanoasr.errors import ModelError
from nanoasr.formats.mapping import leave_page_cache
from nanoasr.untrusted import ReadRefused, load_json, read_regular

MANIFEST = "nanoasr-package.json"  # written into a local_dir: which package, repo and commit it holds
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^:@]*)|:(?P<quant>[\w.-]+))*")
COMMIT = re.compile(r"[0-9a-f]{40}")
REVISION_MAX = 255  # git sets no limit; the hub's branch and tag names are far shorter
REF_BAD_CHAR = re.compile(r"[^\x21-\x7e]|[~^:?*\[\\]")  # beyond printable ASCII, or special to git
CACHE_SNAPSHOT = re.compile(
    r"models--(?P<org>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\](?P<rev>[0-9a-f]{40})")
# A safetensors checkpoint of a repo no package describes: what load_checkpoint reads.
CHECKPOINT_PATTERNS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                       "chat_template.jinja", "processor_config.json", "*.safetensors",
                       "model.safetensors.index.json")
QUANT_SUFFIX = re.compile(r"[-.]((?:bf|iq|[qf])\d\w*)\.gguf$", re.IGNORECASE)
HASH_CHUNK = 1 << 24
MANIFEST_MAX_BYTES = 1 << 20  # a manifest lists a package's few files: a few hundred bytes
# What huggingface_hub writes in `local_dir/.cache/huggingface` besides its per-file records in download/:
# each name with the content it writes (None: an empty lock file). Removed only when that folder holds
# nothing else and each is as it was written.
HF_LOCAL_DIR_FILES = {".gitignore": b"*", ".gitignore.lock": None}
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_TAG_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"  # the Cache Directory Tagging spec's
MODEL_VARIABLE = "NANOASR_MODEL"  # the model used when none is given; before the config file's `model`
# A variant told by a name (a folder, file or repo): Fun-ASR-MLT-Nano's first; Fun-ASR-Nano's is in it.
VARIANT_NAMES = ((re.compile(r"fun.?asr.?mlt.?nano", re.IGNORECASE), "fun-asr-mlt-nano-2512"),
                 (re.compile(r"fun.?asr.?nano", re.IGNORECASE), "fun-asr-nano-2512"))


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlong, short.maxlevel = 120, 60, 40, 3
    short.maxlist = short.maxtuple = short.maxdict = 4
    return short


SHORT = _short_repr()  # what error messages show of a value read from a file: bounded in length and depth


@dataclass(frozen=True)
class PackageFile:
    name: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Package:
    name: str
    description: str
    format: str  # "safetensors" | "gguf" | "model.pt" (FunASR's folder)
    repo: str
    revision: str
    files: tuple[PackageFile, ...]
    license: str
    license_url: str | None = None
    variant: str = "fun-asr-nano-2512"  # or "fun-asr-mlt-nano-2512": which languages the model knows
    approx_size: int | None = None  # bytes, rounded: the download where a file's size is not recorded

    @property
    def size(self) -> int | None:
        """Total bytes, or None when a file's size is not recorded."""
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)

    @property
    def quant(self) -> str | None:
        """The `:quant` tag of a GGUF package (`q8_0` for `…-q8_0.gguf`)."""
        if self.format != "gguf":
            return None
        match = QUANT_SUFFIX.search(self.files[0].name)
        return match[1].lower() if match else None


@dataclass(frozen=True)
class Resolved:
    path: Path  # checkpoint directory or .gguf file
    repo: str | None
    revision: str | None
    package: Package | None

    @property
    def format(self) -> str:
        return "gguf" if self.path.suffix.lower() == ".gguf" else "safetensors"


@dataclass(frozen=True)
class Hints:
    """What a failed fetch tells the user, which depends on who asked: `models download`, or a load."""
    offline: str  # why nothing is fetched, after "is not downloaded"
    fetch: str  # what to do about it
    network: str  # after "check the network (or HF_ENDPOINT)"


@dataclass(frozen=True)
class Target:
    """What to fetch: a package's files, or (files None) a checkpoint snapshot of any repo."""
    label: str  # the name a user types to get it again
    repo: str
    revision: str
    files: tuple[PackageFile, ...] | None
    package: Package | None
    revision_arg: str | None = None  # a revision given apart from the label, repeated in commands we print
    patterns: tuple[str, ...] = CHECKPOINT_PATTERNS

    @property
    def pinned(self) -> bool:
        """Whether the revision is the one the package's sizes and hashes describe."""
        return self.package is not None and self.revision == self.package.revision


# --- packages --------------------------------------------------------------------------------------------

def list_packages() -> list[Package]:
    return [Package(p["name"], p.get("description", ""), p["format"], p["repo"], p["revision"],
                    tuple(PackageFile(f["name"], f.get("size"), f.get("sha256")) for f in p["files"]),
                    p.get("license", "unknown"), p.get("license_url"), p.get("variant", "fun-asr-nano-2512"),
                    p.get("approx_size"))
            for p in spec()["packages"]]


def default_package() -> Package:
    return get_package(spec()["default_package"])


def get_package(name: str) -> Package:
    for package in list_packages():
        if package.name == name:
            return package
    names = ", ".join(p.name for p in list_packages())
    raise ModelError(f"no model package named {name!r}; known packages: {names}")


def info(name: str | None = None, *, revision: str | None = None, local_dir=None) -> dict:
    """A package (or hub id) described: repo, revision, files, license, and whether it is already here."""
    target = _target(name, revision)
    package = target.package
    files = target.files or ()
    path = _present(target, local_dir)
    return {
        "name": package.name if package else target.label,
        "description": package.description if package else "",
        "format": package.format if package else _snapshot_format(target),
        "repo": target.repo,
        "revision": target.revision,
        "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files],
        "size": package.size if package and target.pinned and package.size else _local_size(target, path),
        "approx_size": package.approx_size if package else None,
        "license": package.license if package else None,
        "license_url": package.license_url if package else None,
        "cached": path is not None,
        "path": str(path) if path else None,
        "download": _command(target, local_dir),
    }


def _local_size(target: Target, path: Path | None) -> int | None:
    """Bytes of the target's files already here (what their download took); None when they are not."""
    if path is None:
        return None
    folder = _folder(path)
    if path.is_file():
        return path.stat().st_size
    names = ([f.name for f in target.files] if target.files
             else [p.name for p in folder.iterdir() if p.is_file()])
    return sum((folder / name).stat().st_size for name in names)


def _snapshot_format(target: Target) -> str:
    return "safetensors" if target.patterns == CHECKPOINT_PATTERNS else "gguf"


def download_command(label: str, revision: str | None = None, local_dir=None) -> str:
    extra = f" --revision {revision}" if revision else ""
    extra += f" --local-dir {local_dir}" if local_dir else ""
    return f"python -m nanoasr models download {label}{extra}"


def _command(target: Target, local_dir) -> str:
    return download_command(target.label, target.revision_arg, local_dir)


# --- resolving a --model value ----------------------------------------------------------------------------

def resolve(model=None, *, revision: str | None = None, local_dir=None, offline: bool | None = None,
            progress: bool = True) -> Resolved:
    """Local files for `model` (default: default_model()), downloading what is missing unless offline
    (default: `HF_HUB_OFFLINE`)."""
    model = default_model() if model is None else model
    local = _local(model)
    if local is not None:
        return local
    target = _target(model, revision)
    fetch = _command(target, local_dir)
    asked = (" and offline mode is on (HF_HUB_OFFLINE)", f"Download it once with network access: {fetch}")
    if offline is not None:  # the caller's choice, whatever HF_HUB_OFFLINE says
        asked = ("", f"Download it: {fetch}")
    return _fetch(target, local_dir, _offline(offline), progress, verify_all=False,
                  hints=Hints(*asked, network=f"then: {fetch}"))


def download(name: str | None = None, *, revision: str | None = None, local_dir=None,
             progress: bool = True) -> Resolved:
    """Fetch a package or hub id and check every file with a recorded size and sha256."""
    hints = Hints(" and offline mode is on (HF_HUB_OFFLINE)", "Unset HF_HUB_OFFLINE to download it.",
                  network="then run this again")
    return _fetch(_target(name, revision), local_dir, _offline(None), progress, verify_all=True, hints=hints)


def config_file() -> Path:
    """nanoasr's config file where XDG puts them: $XDG_CONFIG_HOME/nanoasr/config.toml (~/.config/...)."""
    home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(home) / "nanoasr" / "config.toml"


def default_model() -> str | None:
    """The model used when none is given: $NANOASR_MODEL, else the config file's `model = "..."`; None
    for the default package."""
    value = os.environ.get(MODEL_VARIABLE, "").strip()
    if value:
        return value
    path = config_file()
    if not path.is_file():
        return None
    import tomllib

    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get("model")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ModelError(f"{path}: cannot read it as TOML: {_one_line(exc)}") from None
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise ModelError(f"{path}: model must be a non-empty string (a package name, hub id or path); "
                         f"got {SHORT.repr(value)}")
    return value.strip() if value else None


def variant_of(model=None) -> str | None:
    """The model variant (which languages it knows) that `model` names, from its package or its file or repo
    name alone: nothing is read or downloaded. None when the name does not tell."""
    model = default_model() if model is None else model
    if model is None:
        return default_package().variant
    path = Path(os.fspath(model)).expanduser()
    if isinstance(model, Path) or looks_like_path(str(model)) or path.exists():
        package = describe_local(path).package if path.exists() else None
        # the file's name and its folder's: a folder further up names where the user keeps things, not this
        named = "/".join(Path(os.path.abspath(path)).parts[-2:])
        return package.variant if package else _variant_in_name(named)
    try:
        target = _target(str(model), None)
    except ModelError:  # said when the model is loaded
        return None
    return target.package.variant if target.package else _variant_in_name(target.repo)


def _variant_in_name(name: str) -> str | None:
    return next((variant for pattern, variant in VARIANT_NAMES if pattern.search(name)), None)


def looks_like_path(model: str) -> bool:
    seps = {os.sep, os.altsep} - {None, "/"}
    return (model.startswith((".", "~", "/")) or model.lower().endswith(".gguf") or model.count("/") > 1
            or any(s in model for s in seps))


def _local(model) -> Resolved | None:
    if model is None:
        return None
    path = Path(os.fspath(model)).expanduser()
    if path.is_file() and path.suffix.lower() in (".safetensors", ".json"):
        raise ModelError(f"{model}: a safetensors checkpoint is loaded from its folder: give the folder "
                         f"({path.parent}), not a file in it")
    if path.exists():
        return describe_local(path)
    if isinstance(model, Path) or looks_like_path(str(model)):
        raise ModelError(f"{model}: no such model directory or .gguf file")
    return None


def describe_local(path: Path) -> Resolved:
    """Repo, revision and package of local files: from an HF cache path or a nanoasr manifest beside them."""
    folder = _folder(path)
    match = CACHE_SNAPSHOT.search(os.path.abspath(path))
    repo = revision = package = None
    if match:
        repo, revision = f"{match['org']}/{match['name']}", match["rev"]
    else:  # an unreadable or odd manifest only loses the provenance, never the model
        manifest = _read_manifest(folder) or {}
        repo, revision, name = (_text_field(manifest, key) for key in ("repo", "revision", "package"))
        if repo is not None and not HUB_ID.fullmatch(repo):
            repo = None
        if revision is not None and _revision_problem(revision) is not None:
            revision = None
        named = next((p for p in list_packages() if p.name == name), None)
        # one folder may hold several GGUFs; the manifest names the package downloaded last
        if named is not None and (path.is_dir() or any(f.name == path.name for f in named.files)):
            package = named
    if package is None and repo is not None:
        package = _package_for(repo, path.name if path.is_file() else None)
    return Resolved(path, repo, revision, package)


def _package_for(repo: str, filename: str | None) -> Package | None:
    for p in list_packages():
        if p.repo == repo and (p.format == "gguf") == (filename is not None):
            if filename is None or any(f.name == filename for f in p.files):
                return p
    return None


def check_revision(revision) -> str:
    """`revision` when it is a 40-hex commit or a branch or tag name by git's ref-name rules (a stricter
    form); else one ModelError that says what is wrong, before huggingface_hub puts it in a URL or path."""
    problem = _revision_problem(revision)
    if problem is not None:
        raise ModelError(f"revision {revision!r} {problem}; expected a 40-hex commit or a branch or tag name "
                         "(main, v1.0, refs/pr/1)")
    return revision


def _revision_problem(revision) -> str | None:
    if not isinstance(revision, str):
        return f"is a {type(revision).__name__}, not a string"
    if not revision:
        return "is empty"
    if COMMIT.fullmatch(revision):
        return None
    parts = revision.split("/")
    rules = ((len(revision) > REVISION_MAX, f"is longer than {REVISION_MAX} characters"),
             (REF_BAD_CHAR.search(revision),
              "has a space, control or non-ASCII character, or one of ~^:?*[\\"),
             (".." in revision, "contains '..'"),
             ("//" in revision, "contains '//'"),
             (revision.startswith(("/", "-")), "starts with '/' or '-'"),
             (revision.endswith(("/", ".")), "ends with '/' or '.'"),
             (any(p.startswith(".") or p.endswith(".lock") for p in parts),
              "has a part that starts with '.' or ends with '.lock'"),
             (revision == "@" or "@{" in revision, "is '@' or contains '@{'"))
    return next((problem for broken, problem in rules if broken), None)


def _target(model: str | None, revision: str | None) -> Target:
    if revision is not None:
        check_revision(revision)
    if model is None:
        model = default_package().name
    names = {p.name: p for p in list_packages()}
    if model in names:
        p = names[model]
        return Target(p.name, p.repo, revision or p.revision, p.files, p, revision)
    match = HUB_ID.fullmatch(model)
    if not match:
        raise ModelError(f"{model!r} is not a model directory, .gguf file, package name ({', '.join(names)}) "
                         "or hub id org/repo[@revision][:quant]")
    repo, quant = match["repo"], match["quant"]
    if match["revision"] is not None:
        check_revision(match["revision"])
    revision_arg, revision = revision, revision or match["revision"]
    candidates = [p for p in names.values() if p.repo == repo]
    if quant is not None:
        candidates = [p for p in candidates if p.quant == quant.lower()]
    if len(candidates) == 1:
        p = candidates[0]
        return Target(model, repo, revision or p.revision, p.files, p, revision_arg)
    if len(candidates) > 1:
        choices = ", ".join(f"{p.name} ({repo}:{p.quant})" for p in candidates)
        raise ModelError(f"{repo} holds several packages; name one: {choices}")
    if any(p.repo == repo for p in names.values()):
        quants = ", ".join(p.quant for p in names.values() if p.repo == repo and p.quant)
        raise ModelError(f"{repo} has no package with quant {quant!r}; known: {quants}")
    patterns = CHECKPOINT_PATTERNS if quant is None else (f"*{quant}.gguf", f"*{quant.upper()}.gguf",
                                                          f"*{quant.lower()}.gguf")
    return Target(model, repo, revision or "main", None, None, revision_arg, tuple(dict.fromkeys(patterns)))


def _offline(offline: bool | None) -> bool:
    if offline is not None:
        return offline
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true"):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)  # read by huggingface_hub when it was imported


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


# --- fetching ---------------------------------------------------------------------------------------------

def _fetch(target: Target, local_dir, offline: bool, progress: bool, verify_all: bool,
           hints: Hints) -> Resolved:
    local_dir = Path(local_dir).expanduser() if local_dir is not None else None
    if offline:  # nothing is written, so the manifest stays as it is
        path = _present(target, local_dir)
        if path is None:
            raise ModelError(_offline_message(target, local_dir, hints))
        return _resolved(target, path, local_dir, verify_all, fresh=())
    earlier = _manifest_files(local_dir) if local_dir is not None else []  # a bad one fails before fetching
    if progress:
        _announce(target, local_dir)
    with _hub_errors(target, local_dir, hints), _hub_logs_silenced():
        if target.files is None:
            before = _file_ids(local_dir if local_dir is not None else _repo_cache(target) / "blobs")
            path = _snapshot(target, local_dir, progress)
            fresh = tuple(p.name for p in sorted(_folder(path).iterdir())
                          if p.is_file() and _file_id(p) not in before)
        else:
            path, fresh = _download_package(target, local_dir, progress)
    resolved = _resolved(target, path, local_dir, verify_all, fresh)
    for name in fresh:  # after their checks have read them
        leave_page_cache(_folder(path) / name)
    if local_dir is not None:
        _write_manifest(local_dir, target, resolved.revision, earlier)
    return resolved


def _announce(target: Target, local_dir) -> None:
    """One stderr line before a download starts: what, from where, how big, to where."""
    missing = _missing(target, local_dir)
    if not missing:
        return
    sizes = {f.name: f.size for f in target.files or ()}
    known = target.pinned and all(sizes.get(name) is not None for name in missing)
    size = (_human_size(sum(sizes[name] for name in missing)) if known
            else f"about {_human_size(target.package.approx_size)}"
            if target.package and target.package.approx_size and target.pinned else "size unknown")
    print(f"nanoasr: downloading {target.label} ({target.repo}@{target.revision[:12]}, {size}) to "
          f"{local_dir or cache_dir()}", file=sys.stderr, flush=True)


def _human_size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n} bytes"


@contextmanager
def _hub_logs_silenced():
    """huggingface_hub logs each retry as a warning (a dozen lines when the hub is out of reach); its
    failure comes out once, as the ModelError of _hub_errors."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _download_package(target: Target, local_dir, progress: bool) -> tuple[Path, tuple[str, ...]]:
    """The package's path, and the names of the files that were not here before (checked in full)."""
    fresh, paths = [], []
    for f in target.files:
        was_here = _file_present(target, f.name, local_dir) is not None
        paths.append(_download_file(target, f.name, local_dir, progress))
        if not was_here:
            fresh.append(f.name)
    path = paths[0] if target.package.format == "gguf" else paths[0].parent
    return path, tuple(fresh)


def _folder(path: Path) -> Path:
    """The folder of a package's files: a checkpoint's directory itself, a .gguf file's parent."""
    return path if path.is_dir() else path.parent


def _file_ids(folder: Path) -> set[tuple[int, int, int]]:
    """_file_id of every file under a folder (none if there is no such folder)."""
    return {_file_id(p) for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()


def _file_id(path: Path) -> tuple[int, int, int]:
    """(device, inode, modification time) of the file a path leads to: a file written later has another."""
    stat = path.stat()
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def _resolved(target: Target, path: Path, local_dir, verify_all: bool, fresh: tuple[str, ...]) -> Resolved:
    if target.pinned:
        for f in target.files:
            if verify_all or f.name in fresh:
                _verify(target, f, _folder(path) / f.name, local_dir)
            elif f.sha256:
                _check_blob_name(target, f, _folder(path) / f.name, local_dir)
    match = CACHE_SNAPSHOT.search(os.path.abspath(path))
    revision = match["rev"] if match else _local_dir_commit(local_dir, target, path) or target.revision
    return Resolved(path, target.repo, revision, target.package)


def _download_file(target: Target, filename: str, local_dir, progress: bool) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(target.repo, filename, revision=target.revision,
                                local_dir=str(local_dir) if local_dir else None,
                                tqdm_class=None if progress else _silent_tqdm()))


def _snapshot(target: Target, local_dir, progress: bool) -> Path:
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(target.repo, revision=target.revision,
                                    allow_patterns=list(target.patterns),
                                    local_dir=str(local_dir) if local_dir else None,
                                    tqdm_class=None if progress else _silent_tqdm()))
    return _snapshot_path(target, folder)


def _snapshot_path(target: Target, folder: Path) -> Path:
    """The directory itself for a checkpoint; the one matching .gguf for a `:quant` id."""
    if target.patterns == CHECKPOINT_PATTERNS:
        if not (folder / "config.json").is_file():
            raise ModelError(f"{target.repo}@{target.revision}: no config.json; not a safetensors checkpoint "
                             "(for a GGUF repo add :quant, e.g. org/repo:q8_0)")
        return folder
    ggufs = sorted(p for p in (folder.iterdir() if folder.is_dir() else ()) if p.suffix.lower() == ".gguf"
                   and any(p.match(pattern) for pattern in target.patterns))
    if len(ggufs) != 1:
        raise ModelError(f"{target.label}: expected one .gguf matching {target.patterns[0]}; "
                         f"found {[p.name for p in ggufs] or 'none'}")
    return ggufs[0]


def _silent_tqdm():
    from huggingface_hub.utils import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


@contextmanager
def _hub_errors(target: Target, local_dir, hints: Hints):
    """huggingface_hub's many exception types -> one ModelError line naming what failed."""
    from huggingface_hub import errors

    where = f"{target.repo}@{target.revision}"
    try:
        yield
    except errors.RepositoryNotFoundError:
        raise ModelError(f"{target.repo}: no such model repository on the hub, or it is private or gated "
                         "(log in with `hf auth login` or set HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise ModelError(f"{target.repo}: no revision {target.revision!r} on the hub") from None
    except errors.RemoteEntryNotFoundError as exc:
        raise ModelError(f"{where}: a package file is not in the repository ({_one_line(exc)})") from None
    except errors.LocalEntryNotFoundError:
        raise ModelError(f"{target.label}: cannot reach the hub and the files are not in "
                         f"{local_dir or cache_dir()}; check the network (or HF_ENDPOINT), "
                         f"{hints.network}") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelError(f"{where}: download failed ({type(exc).__name__}: {_one_line(exc)})") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


# --- what is already here ---------------------------------------------------------------------------------

def _file_present(target: Target, filename: str, local_dir) -> Path | None:
    if local_dir is not None:
        path = Path(local_dir) / filename
        recorded = (_read_manifest(Path(local_dir)) or {}).get("revision")
        other = recorded is not None and COMMIT.fullmatch(target.revision) and recorded != target.revision
        return path if path.is_file() and not other else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(target.repo, filename, cache_dir=str(cache_dir()),
                                   revision=target.revision)
    return Path(found) if isinstance(found, str) else None


def _present(target: Target, local_dir) -> Path | None:
    """The path resolve() would return, when every file is already here (never touches the network)."""
    local_dir = Path(local_dir).expanduser() if local_dir is not None else None
    if target.files is None:
        folder = _cached_snapshot(target, local_dir)
        if folder is None:
            return None
        try:
            return _snapshot_path(target, folder)
        except ModelError:
            return None
    found = [_file_present(target, f.name, local_dir) for f in target.files]
    if None in found:
        return None
    return found[0] if target.package.format == "gguf" else found[0].parent


def _cached_snapshot(target: Target, local_dir) -> Path | None:
    if local_dir is not None:
        return local_dir if (local_dir / MANIFEST).is_file() else None
    repo_dir = _repo_cache(target)
    commit = target.revision
    if not COMMIT.fullmatch(commit):
        ref = repo_dir / "refs" / commit
        commit = ref.read_text().strip() if ref.is_file() else None
    folder = repo_dir / "snapshots" / commit if commit else None
    return folder if folder is not None and folder.is_dir() else None


def _repo_cache(target: Target) -> Path:
    return cache_dir() / f"models--{target.repo.replace('/', '--')}"


def _missing(target: Target, local_dir) -> list[str]:
    if target.files is None:
        return [f"a snapshot of {target.repo}@{target.revision}"]
    return [f.name for f in target.files if _file_present(target, f.name, local_dir) is None]


def _offline_message(target: Target, local_dir, hints: Hints) -> str:
    where = local_dir if local_dir is not None else f"the Hugging Face cache ({cache_dir()})"
    return (f"{target.label} ({target.repo}@{target.revision}) is not downloaded{hints.offline}: "
            f"missing {', '.join(_missing(target, local_dir))} in {where}. {hints.fetch}")


# --- verification -----------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(target: Target, f: PackageFile, path: Path, local_dir) -> None:
    if f.size is not None and path.stat().st_size != f.size:
        _reject(target, f.name, path, local_dir, "size", f"{f.size} bytes", f"{path.stat().st_size} bytes")
    if f.sha256 is not None:
        got = sha256_file(path)
        if got != f.sha256.lower():
            _reject(target, f.name, path, local_dir, "sha256", f.sha256.lower(), got)


def _check_blob_name(target: Target, f: PackageFile, path: Path, local_dir) -> None:
    """A cached LFS blob is named by the sha256 the hub reported: a cheap check without rereading it."""
    blob = Path(os.path.realpath(path)).name
    if local_dir is None and re.fullmatch(r"[0-9a-f]{64}", blob) and blob != f.sha256.lower():
        _reject(target, f.name, path, local_dir, "sha256", f.sha256.lower(), blob)


def _reject(target: Target, name: str, path: Path, local_dir, what: str, expected: str, got: str) -> None:
    _delete_file(path, local_dir, name)
    raise ModelError(f"{target.repo}@{target.revision} {name}: {what} mismatch: "
                     f"expected {expected}, got {got}; "
                     f"the file was removed, download it again: {_command(target, local_dir)}")


def _delete_file(path: Path, local_dir, name: str) -> None:
    """A downloaded file and what belongs to it: the blob behind a cache link, or huggingface_hub's
    record of it in local_dir. A link in local_dir is not nanoasr's to follow: only the link goes."""
    if local_dir is None:
        blob = Path(os.path.realpath(path))
        path.unlink(missing_ok=True)
        if blob != path.absolute() and blob.parent.name == "blobs" and blob.is_relative_to(
                Path(os.path.realpath(cache_dir()))):  # a cache link leads to its repo's blobs, nowhere else
            blob.unlink(missing_ok=True)
        return
    root = Path(local_dir).resolve()
    _unlink_below(root, name)
    if _may_tidy_records(root):
        _forget_record(root, name)


# --- local_dir manifest -----------------------------------------------------------------------------------

def _load_manifest(folder: Path):
    """The JSON value in folder's manifest; ReadRefused, OSError or ValueError when there is none to read."""
    return load_json(read_regular(folder / MANIFEST, MANIFEST_MAX_BYTES))


def _read_manifest(folder: Path) -> dict | None:
    """folder's manifest as a dict, or None when there is none, or it cannot be read or is not a dict."""
    try:
        manifest = _load_manifest(folder)
    except (OSError, ValueError):  # ReadRefused is a ValueError
        return None
    return manifest if isinstance(manifest, dict) else None


def _text_field(manifest: dict, key: str) -> str | None:
    """A manifest's string field; None when it is missing, not a string, or not one line of sane length."""
    value = manifest.get(key)
    return value if isinstance(value, str) and 0 < len(value) <= 300 and value.isprintable() else None


def _manifest_files(folder: Path) -> list[str]:
    """The files folder's manifest records, each checked to be a file path inside folder; [] without one."""
    manifest = folder / MANIFEST
    if not os.path.lexists(manifest):
        return []
    try:
        files = _load_manifest(folder)["files"]
    except ReadRefused as exc:
        raise ModelError(f"{manifest}: not a nanoasr manifest: it {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{manifest}: not a nanoasr manifest ({type(exc).__name__}: {_one_line(exc)}); "
                         "expected a JSON object with a list of files") from None
    if not isinstance(files, list):
        raise ModelError(f"{manifest}: 'files' is a {type(files).__name__}; expected a list of file paths")
    root = folder.resolve()
    for name in files:
        problem = _entry_problem(root, name)
        if problem is not None:
            raise ModelError(f"{manifest}: entry {SHORT.repr(name)} {problem}; expected a file path inside "
                             f"{root} (nothing was deleted; fix or delete the manifest)")
    return files


def _entry_problem(root: Path, name) -> str | None:
    """Why a manifest entry may not be deleted: any way it could reach outside root, or pass a link."""
    if not isinstance(name, str) or not Path(name).parts:
        return "is not a file path"
    if Path(name).is_absolute() or PurePosixPath(name).is_absolute():  # Windows calls "/x" relative
        return "is an absolute path"
    if ".." in Path(name).parts:
        return "climbs out of the folder with '..'"
    try:
        inside = (root / name).resolve().is_relative_to(root)
        linked = next((part for part in _parents_below(root, name) if part.is_symlink()), None)
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        return "is not a usable file path"
    if not inside:
        return "leads outside the folder through a symlink"
    if linked is not None:
        return f"passes through the symlink {linked.relative_to(root).as_posix()}"
    return None


def _parents_below(root: Path, name: str) -> list[Path]:
    """The folders from root down to name's own (root itself not included)."""
    parts = Path(name).parts[:-1]
    return [root.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]


def _write_manifest(local_dir: Path, target: Target, revision: str, earlier: list[str]) -> None:
    """Record this download beside its files: the files nanoasr downloads put here, and no others."""
    written = [f.name for f in target.files] if target.files else _snapshot_files(target, local_dir, revision)
    files = sorted({n for n in earlier + written if (local_dir / n).is_file()})
    _save_manifest(local_dir, {"package": target.package.name if target.package else None,
                               "repo": target.repo, "revision": revision, "files": files})


def _save_manifest(local_dir: Path, manifest: dict) -> None:
    (local_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _snapshot_files(target: Target, local_dir: Path, commit: str) -> list[str]:
    """What a snapshot download put in local_dir: files its patterns select that huggingface_hub fetched or
    checked at this commit. A user's own files have no such record."""
    records = _hf_download_dir(local_dir)
    names = [m.relative_to(records).as_posix().removesuffix(".metadata") for m in records.rglob("*.metadata")]
    return [n for n in names if _belongs(target, n) and _downloaded_at(local_dir, n) == commit]


def _belongs(target: Target, name: str) -> bool:
    """Whether a file is one of the target's: a package's by name, a snapshot's by its patterns."""
    if target.files is not None:
        return any(f.name == name for f in target.files)
    return any(fnmatch(name, pattern) for pattern in target.patterns)


def _hf_download_dir(local_dir: Path) -> Path:
    """Where huggingface_hub keeps a record (`NAME.metadata`) of each file it downloads into local_dir."""
    return local_dir / ".cache" / "huggingface" / "download"


def _downloaded_at(local_dir: Path, name: str) -> str | None:
    """The commit huggingface_hub recorded for a file it downloaded into local_dir (line 1 of its record)."""
    try:
        commit = (_hf_download_dir(local_dir) / f"{name}.metadata").read_text("utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return None
    return commit if COMMIT.fullmatch(commit) else None


def _local_dir_commit(local_dir, target: Target, path: Path) -> str | None:
    """The commit behind a branch or tag downloaded into local_dir, from the record of a file it holds."""
    if local_dir is None or COMMIT.fullmatch(target.revision):
        return None
    name = target.files[0].name if target.files else path.name if path.is_file() else "config.json"
    return _downloaded_at(Path(local_dir), name)


# --- removal ----------------------------------------------------------------------------------------------

def remove(name: str | None = None, *, revision: str | None = None, local_dir=None) -> int:
    """Delete a package's files (the cached revision, or the files in local_dir); returns bytes freed."""
    target = _target(name, revision)
    if local_dir is not None:
        return _remove_local(target, Path(local_dir).expanduser())
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(cache_dir())
    except CacheNotFound:
        cache = None
    repos = cache.repos if cache else ()
    repo = next((r for r in repos if r.repo_id == target.repo and r.repo_type == "model"), None)
    explicit = target.revision_arg is not None or target.package is not None or "@" in target.label
    revisions = [r for r in (repo.revisions if repo else ())
                 if not explicit or r.commit_hash == target.revision or target.revision in r.refs]
    if not revisions:
        raise ModelError(f"{target.label} ({target.repo}@{target.revision}) is not in the cache "
                         f"({cache_dir()})")
    wanted = {f.name for f in target.files} if target.files else None
    freed = 0
    for rev in revisions:
        names = {f.file_name for f in rev.files}
        if wanted is None or names <= wanted:
            strategy = cache.delete_revisions(rev.commit_hash)
            freed += strategy.expected_freed_size
            strategy.execute()
        else:  # the revision holds other packages too (one GGUF repo, several quants): delete ours alone
            freed += _remove_cached_files(repo, rev, wanted)
    return freed


def _remove_cached_files(repo, rev, wanted: set[str]) -> int:
    others = {f.blob_path for r in repo.revisions for f in r.files
              if r is not rev or f.file_name not in wanted}
    freed = 0
    for f in rev.files:
        if f.file_name in wanted:
            f.file_path.unlink(missing_ok=True)
            if f.blob_path not in others and f.blob_path.exists():
                freed += f.size_on_disk
                f.blob_path.unlink()
    return freed


def _remove_local(target: Target, local_dir: Path) -> int:
    """Delete the target's files that local_dir's manifest records; whatever else is there stays.

    Only recorded files are deleted, each reached from local_dir without following a link on the way (a
    recorded link goes, not what it leads to), never one in the Hugging Face home or cache; then
    huggingface_hub's record of each (in local_dir/.cache/huggingface/download, and trees/COMMIT.json for
    a snapshot, unless that folder is reached through a link or lies in the Hugging Face home), and the
    folders left empty."""
    manifest = local_dir / MANIFEST
    if not os.path.lexists(manifest):
        raise ModelError(f"{local_dir}: no {MANIFEST}; nanoasr removes only files its downloads put there")
    listed = _manifest_files(local_dir)  # every entry is checked before anything is deleted
    root = local_dir.resolve()
    ours = [n for n in listed if _belongs(target, n) and (local_dir / n).is_file()]
    if not ours:
        raise ModelError(f"{target.label}: {manifest} records none of its files")
    for name in ours:
        home = next((p for p in _hf_places(root) if (root / name).resolve().is_relative_to(p)), None)
        if home is not None:
            raise ModelError(f"{manifest}: entry {SHORT.repr(name)} lies in the Hugging Face home or cache "
                             f"({home}), which nanoasr never deletes from (nothing was deleted; fix or "
                             "delete the manifest)")
    tidy_records = _may_tidy_records(root)
    commit = _text_field(_read_manifest(local_dir) or {}, "revision")
    freed = 0
    for name in ours:
        freed += _unlink_below(root, name) or 0
        if tidy_records:
            _forget_record(root, name)
    if tidy_records and commit is not None and COMMIT.fullmatch(commit):  # a snapshot's cached file list
        _unlink_below(root, f".cache/huggingface/trees/{commit}.json")
    _keep_recorded(local_dir, [n for n in listed if n not in ours])
    _tidy(root, ours, tidy_records)
    _rmdir_if_empty(local_dir)  # the folder as named: a link to a folder stays
    return freed


def _keep_recorded(local_dir: Path, kept: list[str]) -> None:
    """The manifest after a removal: the files still recorded, or no manifest once none is left."""
    kept = [n for n in kept if (local_dir / n).is_file()]
    if not kept:
        (local_dir / MANIFEST).unlink()
        return
    manifest = _read_manifest(local_dir) or {}
    fields = {key: _text_field(manifest, key) for key in ("package", "repo", "revision")}
    _save_manifest(local_dir, dict(fields, files=kept))


def _hf_places(root: Path) -> list[Path]:
    """The Hugging Face home, its caches and token files (resolved), except those that hold root itself: a
    local_dir the user put inside the home is theirs."""
    from huggingface_hub import constants

    names = ("HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE", "HF_TOKEN_PATH",
             "HF_STORED_TOKENS_PATH")
    values = (getattr(constants, name, None) for name in names)
    places = {Path(os.path.realpath(value)) for value in values if value}
    return sorted(p for p in places if not root.is_relative_to(p))


def _may_tidy_records(root: Path) -> bool:
    """Whether huggingface_hub's records in root/.cache/huggingface are nanoasr's to delete: reached without
    a link, and neither in nor around the Hugging Face home (root = the home directory, say)."""
    records = root / ".cache" / "huggingface"
    if any(p.is_symlink() for p in (root / ".cache", records)):
        return False
    real = Path(os.path.realpath(records))
    return not any(real.is_relative_to(p) or p.is_relative_to(real) for p in _hf_places(root))


def _forget_record(root: Path, name: str) -> None:
    """huggingface_hub's record of a file it put in local_dir: download/NAME.metadata and its lock."""
    record = (Path(".cache") / "huggingface" / "download" / name).as_posix()
    _unlink_below(root, record + ".metadata")
    _unlink_below(root, record + ".lock")


def _tidy(root: Path, removed: list[str], tidy_records: bool) -> None:
    """Folders a removal emptied, and huggingface_hub's folder once it records no file: rmdir only ever takes
    an empty folder, and only the few files huggingface_hub writes there go, as it wrote them."""
    download = Path(".cache") / "huggingface" / "download"
    folders = {parent for name in removed for parent in Path(name).parents if parent != Path(".")}
    if tidy_records:
        folders |= {download / parent for name in removed for parent in Path(name).parents}
        folders.add(download.parent / "trees")
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):  # the deepest first
        _rmdir_below(root, folder.as_posix())
    if tidy_records and _remove_hf_files(root):
        _rmdir_below(root, ".cache/huggingface")
        _rmdir_below(root, ".cache")


def _remove_hf_files(root: Path) -> bool:
    """The files huggingface_hub writes in local_dir/.cache/huggingface (.gitignore, its lock, CACHEDIR.TAG)
    deleted when nothing else is there and each holds what huggingface_hub writes; whether they went."""
    if not _DIR_FD:
        return False
    try:
        fd = _open_below(root, (".cache", "huggingface"))
    except OSError:
        return False
    if fd is None:
        return False
    try:
        names = os.listdir(fd)
        if not all(_hf_file(fd, name) for name in names):
            return False
        for name in names:
            os.unlink(name, dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _hf_file(fd: int, name: str) -> bool:
    """Whether folder fd's `name` is a small regular file huggingface_hub writes there, as it writes it."""
    if name not in HF_LOCAL_DIR_FILES and name != CACHEDIR_TAG:
        return False
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(file).st_mode):
            return False
        data = os.read(file, 4096)
    finally:
        os.close(file)
    if name == CACHEDIR_TAG:
        return data.startswith(CACHEDIR_TAG_SIGNATURE)
    expected = HF_LOCAL_DIR_FILES[name]
    return data == (expected or b"")


# --- deleting below a folder without following links -------------------------------------------------------

# Where the system can, each folder on the way is opened relative to the one before with O_NOFOLLOW, so a
# link put in the path after any check still stops the walk; elsewhere each part is checked with lstat.
_DIR_FD = (hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")
           and {os.open, os.stat, os.unlink, os.rmdir} <= os.supports_dir_fd and os.listdir in os.supports_fd)


def _open_below(root: Path, parts) -> int | None:
    """A descriptor of the folder root/parts..., each part opened in the one before without following a
    link; None when a part is a link, not a folder, or missing. The caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        try:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:  # ELOOP or ENOTDIR for a link, ENOENT
            os.close(fd)
            return None
        os.close(fd)
        fd = below
    return fd


def _unlink_below(root: Path, name: str) -> int | None:
    """Delete root/name, a file or a link (only the link: never what it leads to, never a folder), reached
    without following a link on the way. The bytes freed, or None when nothing was deleted."""
    *folders, last = Path(name).parts
    if not _DIR_FD:
        path = root.joinpath(*folders, last)
        if any(p.is_symlink() for p in _parents_below(root, name)):
            return None
        try:
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode):
                return None
            path.unlink()
        except OSError:
            return None
        return info.st_size
    try:
        fd = _open_below(root, folders)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        info = os.stat(last, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            return None
        os.unlink(last, dir_fd=fd)
        return info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _rmdir_below(root: Path, name: str) -> None:
    """Remove the folder root/name when it is empty, reached without following a link (rmdir itself never
    follows one); anything else stays as it is."""
    *folders, last = Path(name).parts
    if not _DIR_FD:
        if not any(p.is_symlink() for p in _parents_below(root, name)):
            _rmdir_if_empty(root.joinpath(*folders, last))
        return
    try:
        fd = _open_below(root, folders)
    except OSError:
        return
    if fd is None:
        return
    try:
        os.rmdir(last, dir_fd=fd)
    except OSError:  # not empty, not there, a link or a file: it stays
        pass
    finally:
        os.close(fd)


def _rmdir_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty, or not there: it stays as it is
        pass
