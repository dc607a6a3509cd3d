"""Test servers on 127.0.0.1, port 0: an ASGI app on a thread, or `nanoasr serve` in a subprocess."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import uvicorn


@contextmanager
def running(app):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def serving(args, log_path, timeout=120):
    """`python -m nanoasr serve ARGS --port 0` in a subprocess; yields (process, base URL).

    uvicorn prints the port it bound; the log goes to a file so a chatty server never blocks on a pipe.
    On exit the server gets SIGTERM (a clean shutdown) and is waited for.
    """
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "nanoasr", "serve", "--port", "0", *args], cwd=root,
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        pattern = re.compile(rb"running on (http://127\.0\.0\.1:\d+)")
        while (found := pattern.search(pathlib.Path(log_path).read_bytes())) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{pathlib.Path(log_path).read_text()}")
            time.sleep(0.05)
        yield process, found[1].decode()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
