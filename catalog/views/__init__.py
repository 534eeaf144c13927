"""The catalog's console pages, one module a job: ``pages`` (the list, a model's page,
delete and revert), ``form`` (the create and edit form, its live checks and added rows) and
``schedule`` (the schedule editor)."""
