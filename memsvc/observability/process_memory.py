"""This process's resident memory, for a memory budget that bounds the node and not only
what it estimates of its store."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """Resident set size now (Linux: /proc/self/statm); 0 where the system does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0
