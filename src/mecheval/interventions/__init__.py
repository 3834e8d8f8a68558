"""Interchange interventions: patch sites, batched restores, mechanism labels, and their
estimates from gradients (attribution patching) graded against them."""

from mecheval.interventions.attribution import METHODS, attribution_patching
from mecheval.interventions.engine import CleanRuns, clean_runs, interchange
from mecheval.interventions.grading import Grade, grade
from mecheval.interventions.labels import (
    MechanismLabel,
    Thresholds,
    label_mechanism,
    label_site,
    label_sites,
    readable_sites,
)
from mecheval.interventions.metrics import restore_view
from mecheval.interventions.patch import patch, record
from mecheval.interventions.reference import naive_interchange
from mecheval.interventions.result import InterchangeResult

__all__ = [
    "METHODS",
    "CleanRuns",
    "Grade",
    "InterchangeResult",
    "MechanismLabel",
    "Thresholds",
    "attribution_patching",
    "clean_runs",
    "grade",
    "interchange",
    "label_mechanism",
    "label_site",
    "label_sites",
    "naive_interchange",
    "patch",
    "readable_sites",
    "record",
    "restore_view",
]
