"""The shared server's state directory: where it is, and whether fairq may trust it.

The directory holds the shared server's socket, its state file and its data, so whoever
controls it controls which server fairq talks to and who reads the payloads. fairq
trusts it only when, checked with ``lstat`` before any file in it is read:

* it is a real directory (not a symlink), owned by the current uid, with mode 0700
  (no access for group or others);
* its parent cannot be written by other users, unless the parent has the sticky bit
  (as ``/tmp`` has: then nobody else can rename or replace what is ours in it).

A directory that fails is refused with an error naming what is wrong and the fix;
nothing in it is read, used or changed. The files fairq reads or locks there are opened
without following a symlink (``O_NOFOLLOW``), without blocking on a FIFO
(``O_NONBLOCK``), and used only if they are regular files of the current uid; a state
file is read only up to :data:`MAX_STATE_BYTES`.

:func:`fallback_state_dir` is the directory to suggest when the default one is too long
for a unix socket: per uid, under the temporary directory, created 0700 and checked like
any other (so one another user made first is refused, not used).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Final

from fairq.errors import EmbeddedServerError

#: Environment variable naming the shared server's state directory.
STATE_DIR_ENV: Final = "FAIRQ_STATE_DIR"
#: The most of a state file fairq reads (bytes): a record is a few hundred.
MAX_STATE_BYTES: Final = 64 * 1024
#: Flags of every open of a file in the state directory.
_OPEN_FLAGS: Final = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def state_dir() -> Path:
    """Per-user directory of the shared embedded server (``FAIRQ_STATE_DIR``, else
    ``$XDG_STATE_HOME/fairq``, else ``~/.local/state/fairq``), as an absolute path."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get(STATE_DIR_ENV) or str(Path(base) / "fairq")).expanduser().absolute()


def fallback_state_dir() -> Path:
    """A short state directory of the current uid: ``<temp dir>/fairq-<uid>``."""
    return Path(tempfile.gettempdir()) / f"fairq-{os.getuid()}"


def _refuse(directory: Path, problem: str, fix: str) -> EmbeddedServerError:
    return EmbeddedServerError(
        f"fairq does not trust the state directory {directory}: {problem}; {fix}"
    )


def _own_directory_hint() -> str:
    return f"set {STATE_DIR_ENV} to a directory of your own (fairq creates it, mode 0700)"


def check_private_dir(directory: Path) -> None:
    """Refuse a state directory fairq must not trust (see the module docstring).

    Raises:
        EmbeddedServerError: naming the directory, what is wrong and the fix.
        FileNotFoundError: it does not exist.
    """
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(directory, "it is a symlink", _own_directory_hint())
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(directory, "it is not a directory", _own_directory_hint())
    uid = os.getuid()
    if info.st_uid != uid:
        raise _refuse(
            directory, f"it belongs to uid {info.st_uid}, not to you (uid {uid})",
            _own_directory_hint(),
        )  # fmt: skip
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise _refuse(
            directory, f"its mode is {mode:04o}, so other users may use it (it must be 0700)",
            f"run `chmod 700 {directory}` if only you ever had it, or " + _own_directory_hint(),
        )  # fmt: skip
    parent = os.stat(directory.parent)
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        raise _refuse(
            directory,
            f"other users may write to its parent {directory.parent} (no sticky bit), so "
            "they could replace it", _own_directory_hint(),
        )  # fmt: skip


def make_private_dir(directory: Path) -> None:
    """Create the state directory if it is missing (mode 0700: created by this call, so
    nobody else had it), then check it as :func:`check_private_dir` does.

    Raises:
        EmbeddedServerError: it cannot be created, or cannot be trusted.
    """
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # whoever made it, the check below decides
        else:
            # (a umask may have taken owner bits away; the new directory is ours)
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot create the state directory {directory}: {exc}") from None
    check_private_dir(directory)


def _own_regular_file(fd: int, path: Path) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file")
    if info.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {info.st_uid}, not to you")
    return info


def read_state_file(path: Path) -> bytes | None:
    """The bytes of a file of the (trusted) state directory, or None when there is none.

    Raises:
        OSError: it is a symlink, a FIFO or anything but a regular file of this uid, it
            is larger than :data:`MAX_STATE_BYTES`, or it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise OSError(f"{path} is a symlink") from None
        raise
    try:
        if _own_regular_file(fd, path).st_size > MAX_STATE_BYTES:
            raise OSError(f"{path} is larger than {MAX_STATE_BYTES} bytes")
        data = os.read(fd, MAX_STATE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_STATE_BYTES:
        raise OSError(f"{path} is larger than {MAX_STATE_BYTES} bytes")
    return data


def open_lock_file(path: Path) -> int:
    """A descriptor of a lock file of the (trusted) state directory, created 0600 if
    missing.

    Raises:
        EmbeddedServerError: it is a symlink or anything but a regular file of this uid.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600)
    except OSError as exc:
        raise EmbeddedServerError(f"cannot open the lock file {path}: {exc}") from None
    try:
        _own_regular_file(fd, path)
    except OSError as exc:
        os.close(fd)
        raise EmbeddedServerError(f"cannot use the lock file {path}: {exc}: remove it") from None
    return fd


__all__ = [
    "MAX_STATE_BYTES",
    "STATE_DIR_ENV",
    "check_private_dir",
    "fallback_state_dir",
    "make_private_dir",
    "open_lock_file",
    "read_state_file",
    "state_dir",
]
