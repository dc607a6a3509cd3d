"""Test servers on 127.0.0.1, port 0: an ASGI app on a thread, or `nanoasr serve` in a subprocess; and raw
socket clients that misbehave in ways an HTTP library will not."""
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import uvicorn

from nanoasr.server.connections import uvicorn_config

UPLOAD_PREFIX = "nanoasr-upload-"


@contextmanager
def running(app, **connection_limits):
    """`app` served as `nanoasr serve` serves it (nanoasr.server.connections), with `connection_limits`
    (header_timeout_s, max_header_connections) when given."""
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=0, log_level="warning",
                                           **connection_limits))
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
def serving(args, log_path, timeout=600):
    """`python -m nanoasr serve ARGS --port 0` in a subprocess; yields (process, base URL).

    uvicorn prints the port it bound once the server has warmed its model up, which compiles the kernels
    where their disk cache is cold (minutes on a busy two-core machine): hence the long `timeout`. The log
    goes to a file so a chatty server never blocks on a pipe.
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


def upload_files(root) -> list[pathlib.Path]:
    """Upload files in progress anywhere under `root` (each server keeps them in its own directory)."""
    return [p for p in pathlib.Path(root).rglob(UPLOAD_PREFIX + "*") if p.is_file()]


def wait_until(condition, timeout=10.0, what="the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.01)


def stalled_upload(base: str, sent: int = 100_000, length: int = 900_000,
                   expect_continue=False) -> socket.socket:
    """A client that announces a `length`-byte multipart upload, sends its first `sent` bytes of file data,
    then goes silent; with `expect_continue` it sends only the headers and waits for "100 Continue", as
    curl does with large uploads. The caller closes it."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    part = b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + bytes(sent)
    sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: multipart/form-data; boundary=xx\r\n"
                 + (b"Expect: 100-continue\r\n" if expect_continue else b"")
                 + f"Content-Length: {length}\r\n\r\n".encode() + (b"" if expect_continue else part))
    return sock


def response_head(sock: socket.socket, timeout: float) -> tuple[int | None, bytes]:
    """(status, lower-cased head) of the response on `sock`; (None, b"") when the server closed it first."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return None, b""
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    return int(head.split(b" ", 2)[1]), head


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes `sock` within `timeout` (the rest of the response is read and dropped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


HALF_HEADER = b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"


def half_header(base: str, sent: bytes = HALF_HEADER) -> socket.socket:
    """A client that sends the start of a request's headers (`sent`), then nothing. The caller closes it."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(sent)
    return sock


def trickle_until_closed(sock: socket.socket, every_s: float, limit_s: float = 20,
                         chunk: bytes = b"\0") -> bytes:
    """Sends `chunk` every `every_s` until the server closes the connection; returns what it sent back.
    AssertionError if it is still open after `limit_s`."""
    deadline, received = time.monotonic() + limit_s, b""
    while time.monotonic() < deadline:
        if select.select([sock], [], [], every_s)[0]:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return received
            received += data
            continue
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed: the next recv sees it
    raise AssertionError(f"the server did not close the connection within {limit_s} s")
