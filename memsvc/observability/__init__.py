"""Metrics and logs: used by every layer above the domain, importing nothing above it."""
