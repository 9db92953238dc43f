"""The section models of a config, one module per group of sections; `config/schema.py` assembles them
into the root model and re-exports every name."""
