"""The gateway's REST API under ``/api/v1/gateway/``, as every app's: ``serializers``,
``views`` (client keys, usage, the guard's refusals, traffic over time, federated peers)
and ``urls`` (their routes, mounted by ``llmgw_admin.urls``)."""
