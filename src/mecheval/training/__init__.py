"""Training: the paper's recipe (§4.1), behavioural metrics, checkpoints and run folders."""

from mecheval.training.config import (
    RunConfig,
    TrainConfig,
    dump_yaml,
    load_config,
    resolve,
    total_steps,
)
from mecheval.training.folder import RunFolder, load_run, read_status
from mecheval.training.metrics import answer_loss, evaluate
from mecheval.training.reporter import NullReporter, Reporter
from mecheval.training.run import train
from mecheval.training.schedule import lr_factor, make_scheduler
from mecheval.training.stacking.group import groupable, train_group
from mecheval.training.trainer import Callback, Diverged, Trainer

__all__ = [
    "Callback",
    "Diverged",
    "NullReporter",
    "Reporter",
    "RunConfig",
    "RunFolder",
    "TrainConfig",
    "Trainer",
    "answer_loss",
    "dump_yaml",
    "evaluate",
    "groupable",
    "load_config",
    "load_run",
    "lr_factor",
    "make_scheduler",
    "read_status",
    "resolve",
    "total_steps",
    "train",
    "train_group",
]
