"""Updates: a model moved to new weights in one action (issue 19).

The layer above ``gateway`` and below ``llmgw_admin``
(``agent`` <- ``catalog`` <- ``cluster`` <- ``guard`` <- ``gateway`` <- ``updates`` <- ``llmgw_admin``).

Who owns which module (two helpers build it at once; keep to your own):

- the weights mirror and the update check (H19mirror): ``mirror.py`` (fetching a model's
  files once into ``LLMGW_MIRROR_DIR``: resumable, sha256-checked, renamed into place; the
  fetch's state per model and revision; the size cap), ``registry.py`` (the Hugging Face
  Hub through ``huggingface_hub`` at ``HF_ENDPOINT``, and a plain http(s) URL as its own
  registry: a repository's state at a revision), ``check.py`` (pure: a model's origin
  against a repository's state -> current / available / error), the node-facing file API,
  their models, migrations and tasks (the beat job ``LLMGW_UPDATE_CHECK_EVERY``), the
  ``catalog update check`` command, the update-check API call and buttons, the mirror page;
- the update flow (H19flow): the eval gate, the candidate, the canary, promote, rollback
  and the Updates page, built on the mirror's interface.
"""
