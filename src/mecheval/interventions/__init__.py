"""Interchange interventions: patch sites, batched restores, mechanism labels."""

from mecheval.interventions.engine import interchange
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
    "InterchangeResult",
    "MechanismLabel",
    "Thresholds",
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
