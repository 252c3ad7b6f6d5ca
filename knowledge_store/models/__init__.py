"""The embedding models: which one serves a corpus (``serving``)."""
