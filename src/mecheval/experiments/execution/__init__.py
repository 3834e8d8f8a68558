"""How a sweep's jobs run: jobs.py (what a worker does with a group of jobs, and what it sends
back), scheduling.py (which jobs stack, longest first, a GPU's share), pool.py (the local
process pool and how its workers stop), server.py (how they start), side_by_side.py (on one
GPU: the workers as threads, each on its own CUDA stream), cluster.py (Ray). None of it
changes what a run computes."""
