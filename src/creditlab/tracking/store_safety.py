"""Whether an MLflow store is safe for many jobs on many nodes: a SQLite file on a network filesystem is not.

SQLite locks through the filesystem; on NFS, Lustre, GPFS, BeeGFS, CephFS, SMB and the like those locks are
unreliable across nodes (SQLite's own documentation, "How To Corrupt An SQLite Database File", section 2.1), so many
SLURM jobs writing ``results/mlflow.db`` at once meet locking errors or a corrupted store, which the ledger then
reads. :func:`store_refusal` says why such a store is refused at paper scale (the plan calls it from
``workflow/rules/common.smk`` before any job starts); a cluster runs a tracking server instead
(``python -m creditlab mlflow-server``, :mod:`creditlab.jobs.tracking`).

The filesystem type is read from the kernel's mount table (``/proc/self/mounts``): the type of the longest mount
point that holds the store's directory.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")

NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.ceph",
        "fuse.cephfs",
        "fuse.sshfs",
        "fuse.beegfs",
        "panfs",
        "wekafs",
        "afs",
        "orangefs",
        "pvfs2",
        "ocfs2",
        "gfs2",
        "9p",
        "virtiofs",
    }
)
"""Filesystem types (as the mount table names them) whose locks SQLite cannot rely on across nodes."""


def _unescape(field: str) -> str:
    """A mount table field with its octal escapes (``\\040`` = space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_type(path: str | Path, mounts: Path = MOUNTS) -> str:
    """The type of the filesystem that holds ``path`` (which need not exist yet): the longest mount point of the
    mount table ``mounts`` that contains it ("" when the table cannot be read)."""
    real = os.path.realpath(path)  # symlinks of the existing part resolved; a path yet to be made is fine
    best, fstype = -1, ""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # later mounts over the same point win
            best, fstype = len(point), parts[2]
    return fstype


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS or fstype.startswith("nfs")


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def store_refusal(uri: str, scale: str, accept: bool = False, mounts: Path = MOUNTS) -> str | None:
    """Why the tracking store ``uri`` is refused for a pipeline at ``scale``, or None.

    Refused: at paper scale, a SQLite store on a network filesystem (unless ``accept``: the pipeline config's
    ``accept_sqlite_on_network_fs: true``). A server (http/https), a SQL database (postgresql://, mysql://) or a
    SQLite file on a local filesystem is not refused.
    """
    path = sqlite_path(uri)
    if scale != "paper" or accept or path is None:
        return None
    fstype = filesystem_type(path.parent, mounts)
    if not is_network_fs(fstype):
        return None
    return (
        f"the MLflow store {uri} is a SQLite file on a {fstype} filesystem: SQLite's locks are unreliable there, and "
        f"many jobs on many nodes writing it at once meet locking errors or corrupt it (the ledger reads it). Start a "
        f"tracking server with a SQL backend (`python -m creditlab mlflow-server --backend-store-uri "
        f"postgresql://... --artifacts-destination /shared/mlartifacts`, docs/cluster.md) and pass "
        f"--config mlflow_uri=http://<host>:<port>; or accept this store with --config "
        f"accept_sqlite_on_network_fs=true"
    )
