"""The small default job: an MLP regression on synthetic data it generates itself."""
