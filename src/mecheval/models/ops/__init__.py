"""Sequence-mixing kernels, one file per recurrence: each holds its readable reference (the
recurrence step by step) beside its fast forms (chunked or parallel PyTorch, and the C forms
of models/native.py). The mixer modules (models/mixers/) wire them; nothing here imports a
mixer."""
