"""Judge the cluster's traffic with guard models.

``guard.formats`` writes each judge format's prompt exactly as the model's own chat
template writes it and reads the model's verdict; see /work/shared/spec/guard-formats.md.
"""
