"""Runs of one shape trained as one stacked model: the speed machinery beside the single-run
trainer (training/trainer.py), equal to training the runs one by one.

group.py trains a group (which runs stack: grouping.py), group_trainer.py is the stacked
trainer, stacked.py its maths (AdamW with per-model factors, per-model clipping, functional
stacking), stack_feed.py gathers its batches and watches its losses on the device, and
captured.py replays its step as one CUDA graph.
"""
