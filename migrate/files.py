"""The files roundpipe-migrate works on: finding them, reading them, writing them back.

Nothing here parses Python. Reading never blocks (a FIFO or a device is reported, not
opened for a blocking read), decoding is exact (UTF-8, line endings kept, a BOM set aside
and put back), and writing keeps what the user had: owner, group, mode, hard links, and
the file itself when it is read-only or reached through a symlink that leads out of the
folders given.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import stat
from typing import BinaryIO, FrozenSet, List, Optional, Sequence, Union

__all__ = [
    "BOM",
    "Job",
    "Refusal",
    "Source",
    "collect_jobs",
    "decode",
    "read_source",
    "save",
    "write_atomically",
]

BOM = "\ufeff"
_SKIPPED_FOLDER_NAMES = frozenset({"venv", "__pycache__", "site-packages"})
_NOTEBOOK_SUFFIX = ".ipynb"
_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


@dataclasses.dataclass(frozen=True)
class Job:
    """One file to process.

    ``path`` is what is opened and what diagnostics show; ``rel`` is the path relative to
    the PATH argument it was found under (where ``-o`` puts its copy). ``in_folder`` is
    true when it was found inside a folder PATH, false when it was named directly.
    ``problem``, when set, says why the file's folder could not be listed.
    """

    path: str
    rel: str
    in_folder: bool = False
    problem: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Source:
    """A file's text as the engine sees it: decoded, without its BOM (``bom`` says if it
    had one), line endings exactly as stored."""

    text: str
    bom: bool = False

    def restore(self, text: str) -> str:
        """``text`` (the original or the migrated version) as it is to be stored."""
        return BOM + text if self.bom else text


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a file was not read or not written: a code (RPM9xx), 1-based line and column,
    and the message."""

    code: str
    message: str
    line: int = 1
    col: int = 1


# ----------------------------------------------------------------------------- finding


def collect_jobs(
    paths: Sequence[str], excludes: Sequence[str], skip_folders: FrozenSet[str] = frozenset()
) -> List[Job]:
    """The files named by ``paths``: in argument order, each folder's files sorted by path.

    A PATH that is not a folder is taken as a file whatever its name (a missing one is
    reported as unreadable when processed). ``--exclude`` globs and the folder rules only
    apply below a folder PATH. Folders whose real path is in ``skip_folders`` are not
    entered, nor are symlinks to folders found inside a folder. A file reached twice
    (also through a symlink) is kept once, at its first place.
    """
    jobs: List[Job] = []
    seen = set()
    for root in paths:
        if os.path.isdir(root):
            found = _walk(root, excludes, skip_folders)
        else:
            found = [Job(root, os.path.basename(root))]
        for job in found:
            key = os.path.realpath(job.path)
            if key not in seen:
                seen.add(key)
                jobs.append(job)
    return jobs


def _walk(root: str, excludes: Sequence[str], skip_folders: FrozenSet[str]) -> List[Job]:
    """The ``*.py`` entries below folder ``root``, sorted by their path relative to it
    (compared folder by folder, so ``a/z.py`` comes before ``a.py``).

    A folder that cannot be listed becomes a job carrying the reason, so it is reported.
    """
    found: List[Job] = []

    def unlistable(err: OSError) -> None:
        folder = os.fspath(err.filename)
        reason = err.strerror or str(err)
        rel = os.path.relpath(folder, root)
        found.append(Job(os.path.normpath(folder), rel, True, reason))

    for folder, subfolders, names in os.walk(root, onerror=unlistable):
        rel_folder = os.path.relpath(folder, root)
        subfolders[:] = [
            name
            for name in subfolders
            if not _skip_folder(folder, name, _join_rel(rel_folder, name), excludes, skip_folders)
        ]
        for name in names:
            rel = _join_rel(rel_folder, name)
            if name.endswith(".py") and not _excluded(rel, name, excludes):
                found.append(Job(os.path.normpath(os.path.join(folder, name)), rel, True))
    found.sort(key=lambda job: job.rel.split(os.sep))
    return found


def _join_rel(rel_folder: str, name: str) -> str:
    """``name`` inside the folder at relative path ``rel_folder`` (``.`` for the root)."""
    return name if rel_folder == os.curdir else os.path.join(rel_folder, name)


def _excluded(rel: str, name: str, excludes: Sequence[str]) -> bool:
    """True if an ``--exclude`` glob matches ``rel`` (with ``/`` separators) or ``name``."""
    posix_rel = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatch(posix_rel, glob) or fnmatch.fnmatch(name, glob) for glob in excludes)


def _skip_folder(parent: str, name: str, rel: str, excludes: Sequence[str], skip_folders: FrozenSet[str]) -> bool:
    """True for a folder not to enter: hidden, ``venv``, ``__pycache__``, ``site-packages``,
    any folder holding ``pyvenv.cfg`` (a virtualenv), a symlink, an excluded one, or one
    in ``skip_folders`` (real paths)."""
    full = os.path.join(parent, name)
    return (
        name.startswith(".")
        or name in _SKIPPED_FOLDER_NAMES
        or os.path.islink(full)
        or os.path.exists(os.path.join(full, "pyvenv.cfg"))
        or _excluded(rel, name, excludes)
        or (bool(skip_folders) and os.path.realpath(full) in skip_folders)
    )


# ----------------------------------------------------------------------------- reading


def read_source(path: str) -> Union[bytes, Refusal]:
    """The bytes of the regular file ``path``, or why they were not read.

    The file is opened without blocking and checked before any read, so a FIFO, a
    device or a socket is reported (RPM905) instead of hanging the run; so is a Jupyter
    notebook. A file that cannot be opened or read gives RPM902.
    """
    if path.endswith(_NOTEBOOK_SUFFIX):
        return Refusal(
            "RPM905",
            "Jupyter notebooks are not supported; export the notebook as a script "
            "(jupyter nbconvert --to script) and migrate that; file skipped",
        )
    try:
        kind = _kind(os.stat(path).st_mode)
        if kind is None:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with open(descriptor, "rb") as handle:
                kind = _kind(os.fstat(handle.fileno()).st_mode)  # replaced since the stat?
                if kind is None:
                    return handle.read()
    except OSError as err:
        return Refusal("RPM902", f"file could not be read: {err.strerror or err}")
    return Refusal("RPM905", f"not a regular file ({kind}); file skipped, never read")


def _kind(mode: int) -> Optional[str]:
    """None for a regular file, else what it is (``a FIFO``, ...)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def decode(data: bytes) -> Union[Source, Refusal]:
    """``data`` decoded as UTF-8 (line endings untouched, a leading BOM set aside), or an
    RPM903 refusal pointing at the first byte that is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line, col = data.count(b"\n", 0, err.start) + 1, err.start - line_start + 1
        return Refusal("RPM903", f"file is not UTF-8 ({err.reason}); file skipped", line, col)
    if text.startswith(BOM):
        return Source(text[len(BOM) :], bom=True)
    return Source(text)


# ----------------------------------------------------------------------------- writing


def save(path: str, text: str, in_folder: bool, roots: FrozenSet[str]) -> Optional[Refusal]:
    """Rewrite the file at ``path`` (``-w``) to hold ``text``; None when done.

    Refused, with the file untouched: a read-only file, and a symlink found inside a
    folder PATH (``in_folder``) whose target lies outside every folder PATH (``roots``,
    real paths).
    A file with several hard links, or one whose owner or group this process cannot give
    a new file, is rewritten in place so the links and the ownership stay; any other file
    is replaced atomically. Raises OSError when the write itself fails (the file is then
    as it was).
    """
    target = os.path.realpath(path)
    if in_folder and os.path.islink(path) and not _inside(target, roots):
        return Refusal(
            "RPM902",
            f"not written: {path} is a symlink to {target}, outside the folders "
            "given; name the link or its target directly to rewrite it",
        )
    info = os.stat(target)
    if not (info.st_mode & 0o222 and os.access(target, os.W_OK)):
        message = "not written: the file is read-only; make it writable to migrate it"
        return Refusal("RPM902", message)
    if info.st_nlink > 1:
        _write_in_place(target, text)
    else:
        write_atomically(target, text, stat.S_IMODE(info.st_mode), owner=info)
    return None


def _inside(path: str, roots: FrozenSet[str]) -> bool:
    """True if the real path ``path`` lies below one of the real folder paths ``roots``."""
    return any(os.path.commonpath([path, root]) == root for root in roots)


def write_atomically(target: str, text: str, mode: int, owner: Optional[os.stat_result] = None) -> None:
    """Make ``target`` hold exactly ``text`` (UTF-8) with permission bits ``mode``, through
    a temporary file renamed over it; with ``owner`` (the stat of the file replaced), the
    new file also gets its owner and group.

    Missing parent folders are created. Readers see the old file or the new one, never a
    mix. When ``owner``'s owner or group cannot be given to the new file, ``target`` is
    rewritten in place instead. On any failure ``target`` is left as it was, the temporary
    file is removed and the exception propagates.
    """
    import tempfile  # only a run that writes pays for it (and for shutil, random, ...)

    folder = os.path.dirname(target) or os.curdir
    os.makedirs(folder, exist_ok=True)
    prefix = f".{os.path.basename(target)}."
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        with open(descriptor, "w", encoding="utf-8", newline="") as handle:
            if owner is not None and not _take_ownership(handle.fileno(), owner):
                os.unlink(temporary)
                _write_in_place(target, text)
                return
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _take_ownership(descriptor: int, like: os.stat_result) -> bool:
    """Give the open file ``descriptor`` the owner and group of ``like``; False if this
    process may not."""
    current = os.fstat(descriptor)
    if (current.st_uid, current.st_gid) == (like.st_uid, like.st_gid):
        return True
    try:
        os.fchown(descriptor, like.st_uid, like.st_gid)
    except OSError:
        return False
    return True


def _write_in_place(target: str, text: str) -> None:
    """Overwrite ``target`` through its own inode (hard links and ownership stay).

    Not atomic: a reader may see a mix while it runs. If the write fails, the old bytes
    are written back before the exception propagates.
    """
    new = text.encode("utf-8")
    with open(target, "r+b") as handle:
        old = handle.read()
        try:
            _overwrite(handle, new)
        except BaseException:
            _overwrite(handle, old)
            raise


def _overwrite(handle: BinaryIO, data: bytes) -> None:
    """Replace the whole content of the open binary file ``handle`` with ``data``."""
    handle.seek(0)
    handle.write(data)
    handle.truncate()
    handle.flush()
    os.fsync(handle.fileno())
