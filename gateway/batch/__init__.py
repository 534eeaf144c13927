"""The Files and Batch APIs (``/v1/files``, ``/v1/batches``) and the runner that sends a
batch's lines through the gateway's own path.

``lines`` and ``status`` are pure (a JSONL file's checks, a batch's statuses and the
API's objects); ``multipart`` reads an upload; ``store`` keeps files and batches on disk
under ``LLMGW_FILES_DIR`` (a folder every web and worker process reaches); ``routes``
answers the API on the gateway's ``/v1/`` route; ``token`` is the credential a batch's
lines are sent with; ``window`` says whether a batch held to its models' schedule windows
may send a line now (pure); ``runner`` runs them.
"""
