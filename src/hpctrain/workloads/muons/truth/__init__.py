"""The synthetic truths of muon bundles: v1.py (the documented generative process), v2.py (with event-wide
structure: a shower latent shared by a bundle's muons), versions.py (the truth by version, and a file's)."""
