"""Each server's own directory for uploads in progress, and the sweep of those whose server was killed."""

import os
import tempfile

try:
    import fcntl
except ImportError:  # Windows: no flock, so abandoned upload directories are not swept
    fcntl = None

UPLOADS_PREFIX = "nanoasr-uploads-"  # one directory per running server
UPLOAD_PREFIX = "nanoasr-upload-"  # one file per upload in progress


class UploadDir:
    """This server's own directory for uploads in progress, `nanoasr-uploads-<pid>-<random>` in `parent`.

    Several servers may share `parent` (the system's temporary directory, say). Each holds an flock on
    its directory while it runs, and the kernel drops it when the process ends, even by SIGKILL. So at
    start a server sweeps only directories whose lock is free: those of servers killed before they could
    clean up. `parent` must be on a local disk: flock is not reliable over network file systems.
    """

    def __init__(self, parent: str | None):
        self.parent = parent or tempfile.gettempdir()
        self.path = None
        self._lock_fd = None

    def open(self) -> None:
        if fcntl is not None:
            remove_abandoned(self.parent)
        hidden = tempfile.mkdtemp(prefix=f".{UPLOADS_PREFIX}{os.getpid()}-", dir=self.parent)
        if fcntl is not None:
            self._lock_fd = os.open(hidden, os.O_RDONLY)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        # renamed into the swept namespace only once locked, so another server starting now never sees
        # it unlocked
        self.path = os.path.join(self.parent, os.path.basename(hidden)[1:])
        os.rename(hidden, self.path)

    def close(self) -> None:
        remove_uploads_dir(self.path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def remove_abandoned(parent: str) -> None:
    """Removes the upload directories in `parent` that no running server holds."""
    for entry in os.scandir(parent):
        if not (entry.name.startswith(UPLOADS_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # another user's, or gone already
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            remove_uploads_dir(entry.path)
        except OSError:
            pass  # locked by a running server, or not ours to remove
        finally:
            os.close(fd)


def remove_uploads_dir(path: str) -> None:
    """Removes our upload files from `path`, then `path` itself if nothing else was put there."""
    for entry in os.scandir(path):
        if entry.name.startswith(UPLOAD_PREFIX) and entry.is_file(follow_symlinks=False):
            remove(entry.path)
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty: what someone else put there is not ours to delete


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
