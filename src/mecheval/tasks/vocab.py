"""The special tokens every task starts its vocabulary with.

Ids 0 = ``<pad>``, 1 = ``<bos>``, 2 = ``<div>``; a task's own ids follow from
:data:`N_SPECIAL` on (each task module writes its layout once: tasks/ar.py, tasks/atr.py).
"""

from __future__ import annotations

PAD, BOS, DIV = 0, 1, 2
N_SPECIAL = 3
SPECIAL_NAMES = ("<pad>", "<bos>", "<div>")
