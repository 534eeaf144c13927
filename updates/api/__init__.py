"""The updates app's API: ``views`` (the nodes' side of the mirror, the update check, the
update flow) and ``urls`` (their routes)."""
