"""mecheval: mechanistic evaluation of sequence-model architectures.

Pipeline (data flows left to right only):
tasks -> models -> training -> interventions -> report, orchestrated by experiments and cli.
"""

__version__ = "0.1.0"
