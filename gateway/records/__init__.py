"""What the gateway records after a request, off its path: the listeners the path hands
each ended request to (``observe``: the record types and the in-memory counts), the usage
rows (``usage``), the guard's refusals (``refusals``), traffic over time (``history``), the
Prometheus series (``metrics``), the console's live traffic (``traffic``), the load the
reconciler scales on (``loadreport``), the canary's watch (``watch``), and the table's
loader that reads the database on its own thread (``state``).

Each writes in batches or on threads of its own; nothing here is awaited by a request.
``gateway.path`` imports of it only the record types it hands over (``observe``'s).
"""
