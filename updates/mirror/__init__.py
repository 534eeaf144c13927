"""The weights mirror: a model's files fetched once into the control plane, for every node.

The mirror is a folder every web and worker process reaches (``LLMGW_MIRROR_DIR``;
embedded, ``var/mirror``). A model whose source is a Hugging Face repository or an
http(s) file is fetched into it once, whatever the number of nodes that need it:

- ``request_fetch(model, revision=None, by=..., surface=...)`` queues a fetch (a
  ``Fetch`` row) and has it run in the background (a Celery worker in production, a
  thread embedded); a second request for the same model and revision while one is queued
  or fetching gets that one, so four nodes asking cost one download;
- ``run_fetch(pk)`` (the worker's part) asks the registry (``updates.registry.latest``)
  for the revision's commit and files, refuses a fetch the size cap
  (``LLMGW_MIRROR_MAX_GB``) or the disk cannot take, with the reason, then downloads every
  file into ``<commit>.part/`` (each file into ``<name>.part`` first, resumed with HTTP
  Range after a broken transfer, hashed as it arrives), checks each
  against the sha256 the registry published (an LFS file's, a URL's ``X-Linked-Etag``),
  or git's blob id for a file kept in git, keeps each as a blob (``blobs/<sha256>``: each
  content once, shared by every revision holding it), and renames the revision's folder
  of links to them into place in one step. A file whose content the mirror holds already
  is linked, not fetched: an update that changes one file of eight fetches one. A file
  whose bytes differ is deleted and nothing is renamed. Done, the model's catalog
  ``origin`` is written through ``catalog.services`` (logged like any edit) when it is at
  that commit or has none yet (moving a model to another revision is the update's
  promote, never a fetch's);
- ``local_path(model, revision)`` is the folder a done fetch's files are in (``intact``:
  each file whole, a blob changed since it was checked set aside and fetched again);
- ``manifest(model)`` is what a node is told to download from the mirror
  (``updates/api/``), queueing the fetch when the mirror does not hold it yet;
- ``prune()`` drops what is neither a model's current nor its previous revision, nor its
  newest fetch (an update's candidate), then each blob no kept revision links;
  ``holdings()`` says what the mirror holds, for whom and how much.

Progress (bytes done of the total) is on the row, moved at most every half second, and
marked live for the model's page (``events.changed(models=[name])``).

Its modules, by job: ``store`` (the folder: the blobs and each commit's links to them,
the locks, the bytes held, ``prune``, ``holdings``), ``origin`` (a done fetch written into the
catalog), ``download`` (one fetch run), ``fetches`` (asking for one, the rows, a node's
manifest). This package's names are the mirror's interface.
"""

from __future__ import annotations

from updates.mirror.download import run_fetch
from updates.mirror.fetches import (
    Manifest,
    dispatch,
    latest_fetch,
    local_path,
    manifest,
    request_fetch,
    resume_stale,
)
from updates.mirror.origin import origin_files, write_origin
from updates.mirror.store import (
    Holding,
    MirrorError,
    blob_path,
    enabled,
    file_in,
    folder_for,
    git_blob_id,
    held_bytes,
    held_for_resume,
    holdings,
    intact,
    kept_bytes,
    kept_revisions,
    pinned_revision,
    prune,
    root,
    served_file,
    used_bytes,
)

__all__ = [
    "Holding",
    "Manifest",
    "MirrorError",
    "blob_path",
    "dispatch",
    "enabled",
    "file_in",
    "folder_for",
    "git_blob_id",
    "held_bytes",
    "held_for_resume",
    "holdings",
    "intact",
    "kept_bytes",
    "kept_revisions",
    "latest_fetch",
    "local_path",
    "manifest",
    "origin_files",
    "pinned_revision",
    "prune",
    "request_fetch",
    "resume_stale",
    "root",
    "run_fetch",
    "served_file",
    "used_bytes",
    "write_origin",
]
