"""The downstream services one ingestion worker writes to: the embedder, every index shard and
every sparse shard, as ``meshkit.rpc.client.Downstream`` clients built from the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshkit.domain.ids import sparse_shard_name
from meshkit.rpc.client import ClientPolicy, Downstream
from meshkit.settings import IngestionSettings
from ragmesh.embedder.v1 import embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2_grpc


class Stores:
    """The downstream services one worker writes to."""

    def __init__(
        self,
        embedder: Downstream[embedder_pb2_grpc.EmbedderServiceStub],
        shards: Sequence[Downstream[index_pb2_grpc.IndexServiceStub]],
        sparse_shards: Sequence[Downstream[sparse_pb2_grpc.SparseServiceStub]],
    ) -> None:
        self.embedder = embedder
        self.shards = list(shards)
        # A document goes to sparse shard meshkit.domain.ids.document_shard(doc_id, n).
        self.sparse_shards = list(sparse_shards)

    @classmethod
    def from_settings(cls, settings: IngestionSettings) -> Stores:
        policy = ClientPolicy.from_settings(settings)
        sparse = settings.sparse_address_list()
        return cls(
            Downstream("embedder", settings.embedder_address, embedder_pb2_grpc.EmbedderServiceStub, policy),
            [
                Downstream(f"index-{i}", address, index_pb2_grpc.IndexServiceStub, policy)
                for i, address in enumerate(settings.index_address_list())
            ],
            [
                Downstream(
                    sparse_shard_name(i, len(sparse)), address, sparse_pb2_grpc.SparseServiceStub, policy
                )
                for i, address in enumerate(sparse)
            ],
        )

    async def close(self) -> None:
        downstreams: list[Downstream[Any]] = [self.embedder, *self.shards, *self.sparse_shards]
        for downstream in downstreams:
            await downstream.close()
