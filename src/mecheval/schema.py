"""The tidy results schema: one row per measured number, shared by every stage that writes or
reads results (the intervention measurements, the results store, the report tables).

A site's ``layer``/``component``/``io`` columns are its name parsed by
:func:`mecheval.models.sites.parse_site`.
"""

from __future__ import annotations

#: The measurement columns of a results row; a row also carries its run's config columns.
MEASUREMENT_COLUMNS = [
    # "behavioural" (metrics.csv), "mechanistic" (interventions) or the estimator of
    # attribution.csv (interventions/attribution.py's METHODS)
    "source",
    "step",
    "split",
    "condition",  # original / corrupted / restored
    "site",
    "layer",
    "component",
    "io",
    "role",
    "metric",
    "value",
]
