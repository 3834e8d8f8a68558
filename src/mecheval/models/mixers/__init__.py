"""One file per sequence-mixer architecture; wired together in mecheval.models.registry."""
