"""hpctrain: train PyTorch models on SLURM clusters across walltime limits without losing a step."""

__version__ = "0.1.0"
