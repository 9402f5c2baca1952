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

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
THRESHOLD = 128 * 1024


def map_large_buffers() -> bool:
    """Fix glibc's mmap threshold; True when it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
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
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        malloc_trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False  # not glibc
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True
