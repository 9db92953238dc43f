"""The ragged event stream's plumbing: an epoch's order over files read a unit at a time (epoch_plan), the files
staged to scratch just ahead of it (staged), units decoded ahead (read_ahead), ragged Arrow columns to flat
arrays (ragged), shared-memory buffers lent to workers (lent_buffers) and batches kept ahead (prefetch). A
workload's event reader (workloads/muons/events/stream.py) is built from these; nothing here names a workload."""
