"""Models: one backbone, many sequence mixers, named intervention sites."""

from mecheval.models.backbone import LanguageModel, build_model, count_parameters, state_size
from mecheval.models.config import ModelConfig
from mecheval.models.registry import ARCHITECTURES, get_architecture
from mecheval.models.sites import Site, get_site, iter_sites, site_names

__all__ = [
    "ARCHITECTURES",
    "LanguageModel",
    "ModelConfig",
    "Site",
    "build_model",
    "count_parameters",
    "get_architecture",
    "get_site",
    "iter_sites",
    "site_names",
    "state_size",
]
