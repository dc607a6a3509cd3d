"""Ray Data batch transcription (the `ray` extra): one Model per actor, loaded once, many files per actor.

    import ray
    from nanoasr.ray import transcribe_dataset

    audio = ray.data.read_binary_files("s3://bucket/calls/", include_paths=True)
    transcripts = transcribe_dataset(audio, model="/models/fun-asr-nano-q8_0.gguf", language="en")
    transcripts.write_parquet("s3://bucket/transcripts/")

Each input row ({"path", "bytes"}: an encoded audio file) becomes one transcript row (`row_schema()`); a file
that fails (it does not decode, it is too long) becomes a row whose `error` says why, and the job goes on.
Ray is imported when a dataset is transcribed, never by `import nanoasr`.
"""
from __future__ import annotations

import io
import os
import time

from nanoasr.errors import NanoasrError, OptionError
from nanoasr.transcript import Transcript

# Model.transcribe's options that apply to rows of encoded files (sample_rate and on_segment do not)
OPTIONS = ("language", "itn", "hotwords", "context", "reference", "max_new_tokens", "ignore_stop",
           "max_duration_s", "word_timestamps", "vad")
STAGES = ("load_audio", "frontend", "encoder", "adaptor", "ctc", "prefill", "decode", "total")  # its timings
INSTALL_HINT = 'pip install ".[ray]" in the nanoasr checkout'


def transcribe_dataset(ds, model=None, *, workers: int | None = None, threads_per_worker: int = 1, llm=None,
                       **transcribe_options):
    """A Dataset of transcript rows (`row_schema()`, one per input row, in no particular order) for `ds`,
    a Dataset of encoded audio files with a `path` and a `bytes` column, as
    `ray.data.read_binary_files(paths, include_paths=True)` makes it.

    `model` (and `llm`): what Model.load takes, loaded once by each actor, so a path must exist on every
    node. `workers`: actors, each holding a model and `threads_per_worker` CPUs; by default the pool grows
    from 1 to as many as the cluster's CPUs hold, so Ray Data keeps CPUs for the read tasks. A fixed
    `workers` that takes every CPU needs a read that takes none (`read_binary_files(..., num_cpus=0)`):
    Ray starts the actors first, and a read task waiting for a CPU would wait for ever.
    `transcribe_options`: Model.transcribe's (language, itn, hotwords, context, reference, max_new_tokens,
    ignore_stop, max_duration_s, word_timestamps, vad), checked here before anything runs (OptionError).
    """
    ray = require_ray()
    options = check_options(transcribe_options)
    threads = _at_least_one("threads_per_worker", threads_per_worker)
    if workers is None:
        compute = ray.data.ActorPoolStrategy(min_size=1, max_size=most_workers(threads))
    else:
        compute = ray.data.ActorPoolStrategy(size=_at_least_one("workers", workers))
    load = dict(model=_absolute_if_local(model), llm=_absolute_if_local(llm), threads=threads)
    return ds.map_batches(Transcriber, fn_constructor_kwargs=dict(load=load, options=options), batch_size=1,
                          batch_format="pyarrow", compute=compute, num_cpus=threads)


def most_workers(threads_per_worker: int) -> int:
    """How many actors of `threads_per_worker` CPUs the cluster's CPUs hold, at least 1 (Ray is started
    when it is not running)."""
    ray = require_ray()
    if not ray.is_initialized():
        init_ray()
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // threads_per_worker)


def init_ray(**kwargs):
    """ray.init(**kwargs), also from a process whose command line holds a file name that is not valid
    UTF-8: Ray sends the command line to its runtime as the job's entrypoint, a UTF-8 string, and fails
    with a UnicodeEncodeError on such bytes; here they reach it as \\xNN."""
    ray = require_ray()
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    entrypoint = getattr(utils, "get_entrypoint_name", None)
    if entrypoint is None:  # another Ray than the one this was written for: its own behaviour
        return ray.init(**kwargs)
    utils.get_entrypoint_name = lambda: _utf8(entrypoint())
    try:
        return ray.init(**kwargs)
    finally:
        utils.get_entrypoint_name = entrypoint


def path_problem(path: str) -> str | None:
    """Why `ray.data.read_binary_files` cannot read the file at `path`, or None: bytes that are not UTF-8
    (Arrow's strings cannot hold them), or a tab, newline or carriage return (dropped from the path when
    Ray parses it as a URL, so another file's name is opened)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8, which Ray's paths cannot carry"
    if any(ch in path for ch in "\t\n\r"):
        return "its name has a tab, newline or carriage return, which Ray drops from a path"
    return None


def _utf8(text: str) -> str:
    """`text` with a file name's bytes that are not UTF-8 (surrogate escapes) written as \\xNN."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name's byte stands for
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_options(options: dict) -> dict:
    """`options` for Model.transcribe, checked as it checks them (OptionError names the bad one)."""
    from nanoasr.api import Options
    from nanoasr.audio.io import _check_limit

    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise OptionError(f"unknown transcription option {', '.join(unknown)}; "
                          f"expected some of {', '.join(OPTIONS)}")
    _check_limit(options.get("max_duration_s"))
    Options(**{name: value for name, value in options.items() if name != "max_duration_s"})
    return dict(options)


def row_schema():
    """The pyarrow schema of the transcript rows: path, text, language, duration_s, segments (start, end,
    text, finish_reason, token_ids, avg_logprob; words, ctc_text and ctc_agreement, null unless
    word_timestamps), timings (ms per stage) and error (None unless the file failed)."""
    import pyarrow as pa

    word = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()),
                      ("probability", pa.float64())])
    segment = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
                         ("finish_reason", pa.string()), ("token_ids", pa.list_(pa.int64())),
                         ("avg_logprob", pa.float64()), ("words", pa.list_(word)), ("ctc_text", pa.string()),
                         ("ctc_agreement", pa.float64())])
    return pa.schema([("path", pa.string()), ("text", pa.string()), ("language", pa.string()),
                      ("duration_s", pa.float64()), ("segments", pa.list_(segment)),
                      ("timings", pa.struct([(stage, pa.float64()) for stage in STAGES])),
                      ("error", pa.string())])


def to_transcript(row) -> Transcript:
    """The Transcript a row without an error was made from."""
    timings = {stage: ms for stage, ms in (row["timings"] or {}).items() if ms is not None}
    return Transcript.from_dict(dict(row, timings=timings))


class Transcriber:
    """The callable class map_batches runs: Ray makes one per actor, which loads the model once."""

    def __init__(self, load: dict, options: dict):
        from nanoasr.api import Model

        self.model = Model.load(load["model"], threads=load["threads"], llm=load["llm"])
        # once, in the actor's start, rather than as every file's error
        self.model.check_options(options.get("language"), options.get("word_timestamps", False))
        self.options = options

    def __call__(self, batch):  # pyarrow Table with path, bytes [B] -> Table of row_schema() [B]
        import pyarrow as pa

        if "path" not in batch.column_names:
            raise OptionError("the dataset has no 'path' column: read it with include_paths=True")
        paths, files = batch.column("path").to_pylist(), batch.column("bytes").to_pylist()
        rows = [self.transcribe(path, data) for path, data in zip(paths, files)]
        return pa.Table.from_pylist(rows, schema=row_schema())

    def transcribe(self, path: str, data: bytes) -> dict:
        start = time.perf_counter()
        named = io.BytesIO(data)
        named.name = path  # what the audio errors name
        try:
            transcript = self.model.transcribe(named, **self.options)
        except NanoasrError as exc:
            failed_ms = (time.perf_counter() - start) * 1e3
            return dict(path=path, text="", language=None, duration_s=None, segments=[],
                        timings={"total": failed_ms}, error=str(exc))
        return dict(transcript.to_dict(), path=path, error=None)


def require_ray():
    """The ray module with ray.data loaded; ImportError with the install command when the extra is missing."""
    try:
        import ray
        import ray.data  # noqa: F401  (ray.data is a subpackage that `import ray` does not load)
    except ImportError as exc:
        raise ImportError(f"nanoasr.ray needs Ray Data, which is not installed ({exc.name} is missing): "
                          f"{INSTALL_HINT}") from exc
    return ray


def _at_least_one(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a whole number of at least 1; got {value!r}")
    return value


def _absolute_if_local(model):
    """A local path made absolute (actors do not share the caller's working directory); other names as
    they are."""
    if isinstance(model, (str, os.PathLike)) and os.path.exists(model):
        return os.path.abspath(model)
    return model
