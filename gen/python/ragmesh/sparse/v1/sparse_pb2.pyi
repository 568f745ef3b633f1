from ragmesh.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkText(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "title", "text", "location", "source_uri", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    title: str
    text: str
    location: _common_pb2.ChunkLocation
    source_uri: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., location: _Optional[_Union[_common_pb2.ChunkLocation, _Mapping]] = ..., source_uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DocumentReplacement(_message.Message):
    __slots__ = ("doc_id", "upserts", "keep_chunk_ids", "fence", "source")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    upserts: _containers.RepeatedCompositeFieldContainer[ChunkText]
    keep_chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    fence: int
    source: _common_pb2.DocumentSource
    def __init__(self, doc_id: _Optional[str] = ..., upserts: _Optional[_Iterable[_Union[ChunkText, _Mapping]]] = ..., keep_chunk_ids: _Optional[_Iterable[str]] = ..., fence: _Optional[int] = ..., source: _Optional[_Union[_common_pb2.DocumentSource, _Mapping]] = ...) -> None: ...

class ReplaceDocumentsRequest(_message.Message):
    __slots__ = ("collection", "documents")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    documents: _containers.RepeatedCompositeFieldContainer[DocumentReplacement]
    def __init__(self, collection: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[DocumentReplacement, _Mapping]]] = ...) -> None: ...

class ReplaceDocumentsResponse(_message.Message):
    __slots__ = ("upserted", "removed", "missing_chunk_ids", "stale_doc_ids")
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    MISSING_CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    STALE_DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    upserted: int
    removed: int
    missing_chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    stale_doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, upserted: _Optional[int] = ..., removed: _Optional[int] = ..., missing_chunk_ids: _Optional[_Iterable[str]] = ..., stale_doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("collection", "chunk_ids", "doc_ids")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., chunk_ids: _Optional[_Iterable[str]] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class SearchBm25Request(_message.Message):
    __slots__ = ("collection", "query", "top_k", "doc_ids", "filter", "with_text")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    WITH_TEXT_FIELD_NUMBER: _ClassVar[int]
    collection: str
    query: str
    top_k: int
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    filter: _common_pb2.MetadataFilter
    with_text: int
    def __init__(self, collection: _Optional[str] = ..., query: _Optional[str] = ..., top_k: _Optional[int] = ..., doc_ids: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[_common_pb2.MetadataFilter, _Mapping]] = ..., with_text: _Optional[int] = ...) -> None: ...

class SearchExactRequest(_message.Message):
    __slots__ = ("collection", "keywords", "top_k", "doc_ids", "filter")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    keywords: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    filter: _common_pb2.MetadataFilter
    def __init__(self, collection: _Optional[str] = ..., keywords: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ..., doc_ids: _Optional[_Iterable[str]] = ..., filter: _Optional[_Union[_common_pb2.MetadataFilter, _Mapping]] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "score", "matched_keywords")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    MATCHED_KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    score: float
    matched_keywords: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., score: _Optional[float] = ..., matched_keywords: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchBm25Response(_message.Message):
    __slots__ = ("hits", "unknown_terms", "chunks", "novel_terms")
    HITS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TERMS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NOVEL_TERMS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    unknown_terms: _containers.RepeatedScalarFieldContainer[str]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkText]
    novel_terms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., unknown_terms: _Optional[_Iterable[str]] = ..., chunks: _Optional[_Iterable[_Union[ChunkText, _Mapping]]] = ..., novel_terms: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchExactResponse(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ...) -> None: ...

class GetChunksRequest(_message.Message):
    __slots__ = ("collection", "chunk_ids")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., chunk_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetChunksResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkText]
    def __init__(self, chunks: _Optional[_Iterable[_Union[ChunkText, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    def __init__(self, collection: _Optional[str] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("collection", "chunks", "documents", "log_position")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    LOG_POSITION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    chunks: int
    documents: int
    log_position: int
    def __init__(self, collection: _Optional[str] = ..., chunks: _Optional[int] = ..., documents: _Optional[int] = ..., log_position: _Optional[int] = ...) -> None: ...

class ListDocumentsRequest(_message.Message):
    __slots__ = ("collection", "page_size", "page_token")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    collection: str
    page_size: int
    page_token: str
    def __init__(self, collection: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class DocumentEntry(_message.Message):
    __slots__ = ("doc_id", "fence", "chunk_ids")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    fence: int
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, doc_id: _Optional[str] = ..., fence: _Optional[int] = ..., chunk_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "next_page_token")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[DocumentEntry]
    next_page_token: str
    def __init__(self, documents: _Optional[_Iterable[_Union[DocumentEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
