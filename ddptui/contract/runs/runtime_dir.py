"""The user's runtime folder (records, sockets, a run's output), opened once and never resolved
again: a symbolic link at it or in it is refused, and every file in it is reached by name from
the open folder, so that no one can swap it for another between a check and a use.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

# A name in the folder is data from a file, never a path: no separator, no dot-dot, nothing a
# terminal would take as a control sequence.
_BAD_NAME = set("/\\") | {chr(c) for c in range(32)} | {chr(127)}


class FolderRefused(PermissionError):
    """The folder is not this user's own, or is a symbolic link: nothing in it is trusted."""


def where() -> str:
    """$XDG_RUNTIME_DIR/ddptui, else /tmp/ddptui-UID."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "ddptui") if base else f"/tmp/ddptui-{os.getuid()}"


def safe_name(name: object) -> bool:
    """Whether `name` may name a file in the folder."""
    return (isinstance(name, str) and 0 < len(name) <= 200 and name not in (".", "..")
            and not _BAD_NAME & set(name))


class RuntimeDir:
    """The folder, open (a context manager; close() ends it). Made 0700 where it is missing;
    refused where it is a link, not a folder, another user's, or open to others."""

    def __init__(self, path: str | None = None):
        self.path = path or where()
        self.fd = _open_checked(self.path)

    def __enter__(self) -> RuntimeDir:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def inside(self, name: str) -> str:
        """A path to `name` through the open folder (for bind and connect, which take paths):
        valid in this process while the folder is open."""
        return f"/proc/self/fd/{self.fd}/{_checked(name)}"

    def names(self) -> Iterator[str]:
        """The names of the plain files and sockets in the folder."""
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if safe_name(entry.name) and not entry.is_symlink():
                    yield entry.name

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """os.open of `name` in the folder; a link there is refused (ELOOP)."""
        return os.open(_checked(name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                       dir_fd=self.fd)

    def read(self, name: str, limit: int = 1 << 16) -> bytes:
        """A plain file's first `limit` bytes."""
        fd = self.open(name, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{name} is not a plain file")
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes) -> None:
        """Replace `name` with `data` whole (a temporary file renamed over it)."""
        part = f".{_checked(name)}.{os.getpid()}.part"
        fd = self.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(part, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=self.fd)
            raise

    def remove(self, name: str) -> None:
        """Unlink `name` from the folder (a link there is removed, never followed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_checked(name), dir_fd=self.fd)

    def stat(self, name: str) -> os.stat_result:
        return os.stat(_checked(name), dir_fd=self.fd, follow_symlinks=False)


def _checked(name: str) -> str:
    if not safe_name(name):
        raise ValueError(f"not a name for the runtime folder: {name!r}")
    return name


def _open_checked(path: str) -> int:
    """Open the folder without following a link at its last step; its owner and mode are read
    from the open folder itself."""
    try:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)  # an XDG_RUNTIME_DIR not made
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise FolderRefused(f"cannot make {path}: {e.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(path):
            raise FolderRefused(f"{path} is a symbolic link, not this user's own folder: "
                                "remove it") from None
        raise FolderRefused(f"cannot open {path}: {e.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        os.close(fd)
        raise FolderRefused(f"{path} is not this user's own folder (owner {info.st_uid}, "
                            f"mode {oct(info.st_mode & 0o777)})")
    return fd
