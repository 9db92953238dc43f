"""Reaching files that are not on a local disk: the layer below both data/ (reading inputs) and track/ and
train/ (mirroring outputs), so that neither has to import the other.

    uris.py      which paths are remote, federation URIs, the errors a wrong path gives
    auth.py      the bearer token (sources, scrubbing from messages), the CA, HTTP client factories
    files.py     RemoteFiles: one filesystem per federation/protocol, the token only to Pelican endpoints
    expand.py    expand_paths: local paths/globs/folders and remote URIs/globs to a sorted file list
    failures.py  why a read failed (transient, bad file, fatal setup), folder and cache probes
    mirror.py    copies of a file or folder elsewhere (local or a URL) that are whole at every moment
    oidc.py      Pelican tokens from an OIDC issuer: device-flow login, the private cache, refresh
    pelican_write.py  uploads to a federation with the token (temporary name, MOVE, `latest` last), downloads
    upload.py    Uploader: one background upload at a time, the newest wins, retries, bounded close

pelicanfs 1.5 quirks handled here:
- `fs.glob()` on a full pelican://host:port/... URL returns []: we glob the bare namespace path instead.
- fsspec caches one PelicanFileSystem bound to the first federation it saw: we build our own instances
  (`skip_instance_cache=True`), one per federation.
- `pq.read_table(path, filesystem=pelicanfs)` fails (its mtime is a string): Arrow gets file objects
  (`pq.ParquetFile(fs.open(...))`, for footers) or staged copies (see `hpctrain.data.staging`).
"""
