"""What the command server of tests/cli_processes.py imports before it forks: mecheval's CLI
and the libraries its commands load, and torch's meta device (a config check builds its model
there; its first use loads torch's reference ops). Imports and a meta tensor only: the server
computes nothing, so it starts no thread pool a forked command could inherit."""

import pandas  # noqa: F401
import torch

import mecheval.cli
import mecheval.experiments.reproduce  # noqa: F401
import mecheval.report.render  # noqa: F401

mecheval.cli._register()  # every command's module

torch.empty(2, device="meta").normal_()
