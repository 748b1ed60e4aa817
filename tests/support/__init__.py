"""Helpers for tests and benchmarks: never imported by the server."""
