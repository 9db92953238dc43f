"""The muon event files: layouts, the index, decoding, the stream of ragged batches a task reads."""
