"""The console's own pages, one module a job: ``dashboard`` (the console's home, every
app at once), ``tokens`` (API and join tokens) and ``status`` (the reconciler's last
tick, polled by the dashboard)."""
