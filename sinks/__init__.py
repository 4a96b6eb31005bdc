"""Sinks: the controller that respawns torch gangs, alerts, Prometheus metrics, archive."""
