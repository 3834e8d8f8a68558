"""A sweep's jobs on a Ray cluster (``--backend ray``): each group a Ray task, asking for the
cluster's GPUs in shares (scheduling.py's :func:`gpu_share`)."""

from __future__ import annotations

from collections.abc import Sequence

from mecheval.errors import ConfigError
from mecheval.experiments.execution.jobs import Job, Outcome, execute_group
from mecheval.experiments.execution.scheduling import gpu_share, group_jobs, in_job_order, on_gpu


def run_on_ray(jobs: Sequence[Job], address: str | None, group_size: int = 1) -> list[Outcome]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray: needs Ray (pip install 'mecheval[ray]')") from None
    groups = group_jobs(jobs, group_size)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        share = gpu_share(groups, ray.cluster_resources().get("GPU", 0))
        remote = ray.remote(num_cpus=jobs[0].threads if jobs else 1)(execute_group)
        results = ray.get(
            [
                remote.options(num_gpus=share if on_gpu(group) else 0).remote(group)
                for group in groups
            ]
        )
    finally:
        if started_here:
            ray.shutdown()
    return in_job_order(jobs, groups, results)
