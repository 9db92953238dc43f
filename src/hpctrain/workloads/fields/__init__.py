"""Cosmological parameters (Omega_m, sigma_8) from 2-D matter fields: generators, CNN, task."""
