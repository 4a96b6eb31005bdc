"""Sinks: consumers of verdicts (alerts, Prometheus metrics, archive, the web view's data)."""
