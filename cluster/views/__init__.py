"""The cluster's console pages, one module a job: ``actions`` (the operators' actions on
the live dashboard), ``pages`` (a node's page, a replica's engine log, a model page's
Scale and Wake) and ``quotas`` (the Quotas page, an owner's page)."""
