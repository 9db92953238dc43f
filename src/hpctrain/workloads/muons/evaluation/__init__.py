"""The judge of generated bundles (quality), the run of a model against truth or held-out files, its figures."""
