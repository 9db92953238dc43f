"""torch.compile in one room. compiler.py: the `Compiler` the trainer talks to; policy.py: modes, and where a
network compiles; cache.py: the compiled code kept beside the runs (checked as the user's alone); stats.py: what
the compiler did; ahead.py: the background helper (train.compile_background)."""
