"""Plain-text tables for the command line (status, simulation reports)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["table"]


def table(rows: Sequence[Sequence[str]], right_align: bool = True) -> str:
    """Columns padded to their widest cell; the first column left-aligned, the others right-aligned
    (or all left-aligned with ``right_align=False``)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) if i and right_align else v.ljust(w)
                               for i, (v, w) in enumerate(zip(r, widths))).rstrip() for r in rows)
