"""How pilot's C heap gives memory back: large buffers get mappings of their own.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB
on 64-bit), after which 1 MiB requests and responses come from the heap, where
they fragment it and stay resident. Under `python -m bench.fuzz` pilot's RSS
peaked at 409 MB and ended 11-44 MB above where it started. With the threshold
fixed at glibc's initial 128 KiB every large buffer is mapped on its own and
unmapped when freed: the same run peaked at 235 MB and ended below its start.
Nothing is done off glibc, or when MALLOC_MMAP_THRESHOLD_ is set (the
operator's choice wins).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
THRESHOLD = 128 * 1024


def _glibc(function: str) -> Any | None:
    """A function of the C library, or None off glibc (musl has neither mallopt nor
    malloc_trim)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None


def map_large_buffers() -> bool:
    """Fix glibc's mmap threshold; True when it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's malloc_trim); True when
    it ran.

    Many small blocks freed together (a TLS context holds the system's CA store
    as ~1 MB of them) leave pages the heap keeps: 100 remote clusters gone left
    pilot 90 MB above where it started until trimmed.
    """
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True
