"""The guarded clients (deadline, retries for idempotent calls, a breaker each) of every
downstream the gateway calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshkit.domain.ids import sparse_shard_name
from meshkit.rpc.client import ClientPolicy, Downstream
from meshkit.settings import GatewaySettings
from ragmesh.embedder.v1 import embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2_grpc
from ragmesh.planner.v1 import planner_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2_grpc
from services.gateway.degradations import EMBEDDER, PLANNER
from services.gateway.rerank import RERANKER


class Backends:
    """The guarded clients of every downstream the gateway calls."""

    def __init__(
        self,
        planner: Downstream[planner_pb2_grpc.PlannerServiceStub],
        embedder: Downstream[embedder_pb2_grpc.EmbedderServiceStub],
        shards: Sequence[Downstream[index_pb2_grpc.IndexServiceStub]],
        sparse_shards: Sequence[Downstream[sparse_pb2_grpc.SparseServiceStub]],
        reranker: Downstream[reranker_pb2_grpc.RerankerServiceStub] | None = None,
    ) -> None:
        self.planner = planner
        self.embedder = embedder
        self.shards = list(shards)
        # A document's chunks all live on sparse shard meshkit.domain.ids.document_shard(doc_id, n).
        self.sparse_shards = list(sparse_shards)
        # None: no reranker tier is deployed (reranker_address is empty).
        self.reranker = reranker

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Backends:
        policy = ClientPolicy.from_settings(settings)
        size = settings.max_message_bytes
        sparse = settings.sparse_address_list()
        return cls(
            Downstream(PLANNER, settings.planner_address, planner_pb2_grpc.PlannerServiceStub, policy, size),
            Downstream(
                EMBEDDER, settings.embedder_address, embedder_pb2_grpc.EmbedderServiceStub, policy, size
            ),
            [
                Downstream(f"index-{i}", address, index_pb2_grpc.IndexServiceStub, policy, size)
                for i, address in enumerate(settings.index_address_list())
            ],
            [
                Downstream(
                    sparse_shard_name(i, len(sparse)),
                    address,
                    sparse_pb2_grpc.SparseServiceStub,
                    policy,
                    size,
                )
                for i, address in enumerate(sparse)
            ],
            Downstream(
                RERANKER, settings.reranker_address, reranker_pb2_grpc.RerankerServiceStub, policy, size
            )
            if settings.reranker_address
            else None,
        )

    async def close(self) -> None:
        downstreams: list[Downstream[Any]] = [self.planner, self.embedder, *self.shards, *self.sparse_shards]
        if self.reranker is not None:
            downstreams.append(self.reranker)
        for downstream in downstreams:
            await downstream.close()
