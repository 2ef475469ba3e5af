"""Die with the parent process: Linux's ``PR_SET_PDEATHSIG``, shared by the node daemon's and the
Ray actor's etrun children and etrun's zygote with its forks. Standard library only: the zygote
calls it before importing anything else."""

from __future__ import annotations

import ctypes
import signal

__all__ = ["set_pdeathsig"]


def set_pdeathsig(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (even by SIGKILL);
    False where it cannot (not Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    return True
