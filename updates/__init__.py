"""Updates: a model moved to new weights in one action.

The layer above ``gateway`` and below ``llmgw_admin``
(``agent`` <- ``catalog`` <- ``cluster`` <- ``guard`` <- ``gateway`` <- ``updates`` <- ``llmgw_admin``).

Its modules, by job:

- the weights mirror (``mirror/``: ``fetches``, a fetch asked for once per model and
  revision, its rows, a node's manifest; ``download``, one fetch run: resumable,
  sha256-checked, renamed into place; ``store``, the folder ``LLMGW_MIRROR_DIR``, its
  locks, the bytes held, the size cap and ``prune``; ``origin``, a done fetch written
  into the catalog);
- the registry (``registry.py``: the Hugging Face Hub through ``huggingface_hub`` at
  ``HF_ENDPOINT``, and a plain http(s) URL as its own registry: a repository's state at a
  revision) and the update check (``check.py``, pure: a model's origin against a
  repository's state -> current / available / error; ``checking.py``, its shell);
- the update flow: ``flow.py`` (pure: the plan, each step's decision), ``run.py`` (its
  shell: the eval gate, the candidate, the canary, promote, rollback), ``evals/``;
- the surfaces: ``api/`` (the nodes' file API, the update check, the flow's calls),
  ``views.py`` (the mirror's page, a model's panel, the Updates page), ``cli.py`` and
  ``command.py`` (the ``catalog update`` group), ``admin.py`` and ``admin_actions.py``,
  ``tasks.py`` (the beat job ``LLMGW_UPDATE_CHECK_EVERY``, fetches and evals on the
  workers), ``signals.py`` (the reconcile tick's receiver).
"""
