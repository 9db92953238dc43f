"""Cosmic-ray muon bundles: the physicists' file layouts, physics, synthetic truth, event loader."""
