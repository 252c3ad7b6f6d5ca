"""Shards split the missing texts by content hash: every hash in exactly one shard, shards roughly even
(the sharded embeddings asset: tests/integration/test_sharded_embeddings.py)."""

from __future__ import annotations

from knowledge_store.ingest.embed import shard_of


def test_every_content_hash_falls_in_exactly_one_shard():
    import hashlib

    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    for shards in (1, 2, 3, 8):
        owners = [shard_of(h, shards) for h in hashes]
        assert set(owners) == set(range(shards))
        counts = [owners.count(s) for s in range(shards)]
        assert min(counts) > 0.7 * len(hashes) / shards  # roughly even
