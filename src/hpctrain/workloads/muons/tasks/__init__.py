"""The muon tasks the trainer runs: the shared data plumbing, the WGAN, the flow and the multiplicity model."""
