"""The lock that keeps two runs from writing into one directory."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from perfcheck.errors import UserError

LOCK = ".perfcheck.lock"


class RunLock:
    """An exclusive lock on a directory that one run writes into (``flock`` on ``LOCK`` inside it).

    The lock file is created atomically (``O_CREAT``) and locked without waiting: a second run into the
    same directory gets a UserError instead of mixing its rows with the first's. The kernel drops the
    lock when the holder exits, killed or not, so a stale lock file never blocks a later run; it holds
    the holder's pid, for the message."""

    def __init__(self, directory):
        self.path = Path(directory) / LOCK
        self._fd = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UserError(f"{self.path.parent}: another perfcheck run{f' (pid {holder})' if holder else ''} "
                                    "is writing into this directory; choose a new out_dir") from None
                raise
            try:  # the holder before us may have removed the file after we opened it: lock the one in place
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self):
        """Remove the lock file, then unlock (a run that opened the removed file retries on the new one)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # already removed, or a read-only directory: the unlock below frees it
                self.path.unlink()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

