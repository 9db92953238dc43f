"""Stage remote input files to node-local scratch just ahead of use, and delete them after.

    with Stager(uris, cfg, local_rank=env.local_rank, local_world_size=env.local_world_size,
                job_id=env.job_id, pelican=data.pelican) as st:
        for i in range(len(uris)):
            path = st.get(i)        # blocks until file i is local; time spent is added to st.wait_seconds
            read(path)
            st.release(i)           # done with it: deleted once every local rank released it

Every local rank builds a Stager over the SAME ordered list. Local rank 0 downloads (a background thread
keeps `ahead` files in advance within `max_files`/`max_bytes`); the other local ranks never download: they
wait for the file to appear under its final name. Ranks talk through small files in `<root>/ctl/` (peers.py):
each rank publishes the lowest index it may still read ("floor") and the index it waits for; rank 0 deletes
files below every rank's floor. A file appears under its final name only when complete, so a complete final
file left by a killed job is reused after a requeue; leftover temporary files are removed.

    errors.py    BadFileError (one file), StagingError (staging itself)
    scratch.py   the scratch folder: where, file names, leftovers of a killed job
    peers.py     NodePeers: the local ranks' protocol through ctl/ files
    stager.py    Stager: the per-file state machine (FileState), downloads, retries, the budget
"""

from hpctrain.data.staging.errors import BadFileError, StagingError
from hpctrain.data.staging.scratch import local_name, staging_root
from hpctrain.data.staging.stager import FileState, Stager

__all__ = ["BadFileError", "FileState", "Stager", "StagingError", "local_name", "staging_root"]
