"""The muon networks (flow, generator, multiplicity head), their losses, and sampling from a trained one."""
