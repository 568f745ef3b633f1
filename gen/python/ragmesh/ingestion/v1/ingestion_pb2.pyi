import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DocumentFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOCUMENT_FORMAT_UNSPECIFIED: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_MARKDOWN: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_TEXT: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_HTML: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_PDF: _ClassVar[DocumentFormat]
    DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN: _ClassVar[DocumentFormat]

class SubmitOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMIT_OUTCOME_UNSPECIFIED: _ClassVar[SubmitOutcome]
    SUBMIT_OUTCOME_QUEUED: _ClassVar[SubmitOutcome]
    SUBMIT_OUTCOME_UNCHANGED: _ClassVar[SubmitOutcome]
    SUBMIT_OUTCOME_REJECTED: _ClassVar[SubmitOutcome]

class DocumentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOCUMENT_STATE_UNSPECIFIED: _ClassVar[DocumentState]
    DOCUMENT_STATE_QUEUED: _ClassVar[DocumentState]
    DOCUMENT_STATE_PROCESSING: _ClassVar[DocumentState]
    DOCUMENT_STATE_INDEXED: _ClassVar[DocumentState]
    DOCUMENT_STATE_FAILED: _ClassVar[DocumentState]
    DOCUMENT_STATE_DELETING: _ClassVar[DocumentState]
    DOCUMENT_STATE_DELETED: _ClassVar[DocumentState]

class ReindexPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REINDEX_PHASE_UNSPECIFIED: _ClassVar[ReindexPhase]
    REINDEX_PHASE_BUILDING: _ClassVar[ReindexPhase]
    REINDEX_PHASE_RETIRING: _ClassVar[ReindexPhase]
    REINDEX_PHASE_DONE: _ClassVar[ReindexPhase]
DOCUMENT_FORMAT_UNSPECIFIED: DocumentFormat
DOCUMENT_FORMAT_MARKDOWN: DocumentFormat
DOCUMENT_FORMAT_TEXT: DocumentFormat
DOCUMENT_FORMAT_HTML: DocumentFormat
DOCUMENT_FORMAT_PDF: DocumentFormat
DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN: DocumentFormat
SUBMIT_OUTCOME_UNSPECIFIED: SubmitOutcome
SUBMIT_OUTCOME_QUEUED: SubmitOutcome
SUBMIT_OUTCOME_UNCHANGED: SubmitOutcome
SUBMIT_OUTCOME_REJECTED: SubmitOutcome
DOCUMENT_STATE_UNSPECIFIED: DocumentState
DOCUMENT_STATE_QUEUED: DocumentState
DOCUMENT_STATE_PROCESSING: DocumentState
DOCUMENT_STATE_INDEXED: DocumentState
DOCUMENT_STATE_FAILED: DocumentState
DOCUMENT_STATE_DELETING: DocumentState
DOCUMENT_STATE_DELETED: DocumentState
REINDEX_PHASE_UNSPECIFIED: ReindexPhase
REINDEX_PHASE_BUILDING: ReindexPhase
REINDEX_PHASE_RETIRING: ReindexPhase
REINDEX_PHASE_DONE: ReindexPhase

class Document(_message.Message):
    __slots__ = ("doc_id", "title", "format", "content", "source_uri", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    title: str
    format: DocumentFormat
    content: bytes
    source_uri: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, doc_id: _Optional[str] = ..., title: _Optional[str] = ..., format: _Optional[_Union[DocumentFormat, str]] = ..., content: _Optional[bytes] = ..., source_uri: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IngestDocumentsRequest(_message.Message):
    __slots__ = ("collection", "documents")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    def __init__(self, collection: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ...) -> None: ...

class SubmitResult(_message.Message):
    __slots__ = ("doc_id", "outcome", "content_sha256", "reason")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    outcome: SubmitOutcome
    content_sha256: str
    reason: str
    def __init__(self, doc_id: _Optional[str] = ..., outcome: _Optional[_Union[SubmitOutcome, str]] = ..., content_sha256: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class IngestDocumentsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitResult, _Mapping]]] = ...) -> None: ...

class DeleteDocumentsRequest(_message.Message):
    __slots__ = ("collection", "doc_ids")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteDocumentsResponse(_message.Message):
    __slots__ = ("queued",)
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    queued: int
    def __init__(self, queued: _Optional[int] = ...) -> None: ...

class DocumentStatus(_message.Message):
    __slots__ = ("collection", "doc_id", "state", "reason", "attempts", "chunks", "content_sha256", "updated_at")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    collection: str
    doc_id: str
    state: DocumentState
    reason: str
    attempts: int
    chunks: int
    content_sha256: str
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, collection: _Optional[str] = ..., doc_id: _Optional[str] = ..., state: _Optional[_Union[DocumentState, str]] = ..., reason: _Optional[str] = ..., attempts: _Optional[int] = ..., chunks: _Optional[int] = ..., content_sha256: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetDocumentStatusRequest(_message.Message):
    __slots__ = ("collection", "doc_ids")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collection: _Optional[str] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetDocumentStatusResponse(_message.Message):
    __slots__ = ("documents",)
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[DocumentStatus]
    def __init__(self, documents: _Optional[_Iterable[_Union[DocumentStatus, _Mapping]]] = ...) -> None: ...

class GetCollectionStatusRequest(_message.Message):
    __slots__ = ("collection",)
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    def __init__(self, collection: _Optional[str] = ...) -> None: ...

class GetCollectionStatusResponse(_message.Message):
    __slots__ = ("collection", "queued", "processing", "indexed", "failed", "deleting", "chunks", "calibration")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    collection: str
    queued: int
    processing: int
    indexed: int
    failed: int
    deleting: int
    chunks: int
    calibration: CollectionCalibration
    def __init__(self, collection: _Optional[str] = ..., queued: _Optional[int] = ..., processing: _Optional[int] = ..., indexed: _Optional[int] = ..., failed: _Optional[int] = ..., deleting: _Optional[int] = ..., chunks: _Optional[int] = ..., calibration: _Optional[_Union[CollectionCalibration, _Mapping]] = ...) -> None: ...

class CollectionCalibration(_message.Message):
    __slots__ = ("rerank", "keep_fused_margin", "weight_dense", "weight_bm25", "weight_exact", "queries", "documents", "measured", "rerank_gain", "rerank_gain_low", "rerank_gain_high", "method", "calibrated_at", "embedder_sha256")
    class MeasuredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RERANK_FIELD_NUMBER: _ClassVar[int]
    KEEP_FUSED_MARGIN_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DENSE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BM25_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_EXACT_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    RERANK_GAIN_FIELD_NUMBER: _ClassVar[int]
    RERANK_GAIN_LOW_FIELD_NUMBER: _ClassVar[int]
    RERANK_GAIN_HIGH_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_AT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDER_SHA256_FIELD_NUMBER: _ClassVar[int]
    rerank: bool
    keep_fused_margin: float
    weight_dense: float
    weight_bm25: float
    weight_exact: float
    queries: int
    documents: int
    measured: _containers.ScalarMap[str, float]
    rerank_gain: float
    rerank_gain_low: float
    rerank_gain_high: float
    method: str
    calibrated_at: _timestamp_pb2.Timestamp
    embedder_sha256: str
    def __init__(self, rerank: _Optional[bool] = ..., keep_fused_margin: _Optional[float] = ..., weight_dense: _Optional[float] = ..., weight_bm25: _Optional[float] = ..., weight_exact: _Optional[float] = ..., queries: _Optional[int] = ..., documents: _Optional[int] = ..., measured: _Optional[_Mapping[str, float]] = ..., rerank_gain: _Optional[float] = ..., rerank_gain_low: _Optional[float] = ..., rerank_gain_high: _Optional[float] = ..., method: _Optional[str] = ..., calibrated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., embedder_sha256: _Optional[str] = ...) -> None: ...

class SetCollectionCalibrationRequest(_message.Message):
    __slots__ = ("collection", "calibration", "clear")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    collection: str
    calibration: CollectionCalibration
    clear: bool
    def __init__(self, collection: _Optional[str] = ..., calibration: _Optional[_Union[CollectionCalibration, _Mapping]] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetCollectionCalibrationResponse(_message.Message):
    __slots__ = ("calibration",)
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    calibration: CollectionCalibration
    def __init__(self, calibration: _Optional[_Union[CollectionCalibration, _Mapping]] = ...) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, collections: _Optional[_Iterable[str]] = ...) -> None: ...

class ListDocumentsRequest(_message.Message):
    __slots__ = ("collection", "source_uri_prefix", "limit", "after_doc_id", "by_source_uri", "after_source_uri")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_DOC_ID_FIELD_NUMBER: _ClassVar[int]
    BY_SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    AFTER_SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    collection: str
    source_uri_prefix: str
    limit: int
    after_doc_id: str
    by_source_uri: bool
    after_source_uri: str
    def __init__(self, collection: _Optional[str] = ..., source_uri_prefix: _Optional[str] = ..., limit: _Optional[int] = ..., after_doc_id: _Optional[str] = ..., by_source_uri: _Optional[bool] = ..., after_source_uri: _Optional[str] = ...) -> None: ...

class DocumentSummary(_message.Message):
    __slots__ = ("doc_id", "state", "source_uri", "content_sha256")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    state: DocumentState
    source_uri: str
    content_sha256: str
    def __init__(self, doc_id: _Optional[str] = ..., state: _Optional[_Union[DocumentState, str]] = ..., source_uri: _Optional[str] = ..., content_sha256: _Optional[str] = ...) -> None: ...

class ListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "next_after_doc_id", "next_after_source_uri")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_DOC_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SOURCE_URI_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[DocumentSummary]
    next_after_doc_id: str
    next_after_source_uri: str
    def __init__(self, documents: _Optional[_Iterable[_Union[DocumentSummary, _Mapping]]] = ..., next_after_doc_id: _Optional[str] = ..., next_after_source_uri: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("sequence", "collection", "doc_id", "reason", "attempts", "failed_at")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    collection: str
    doc_id: str
    reason: str
    attempts: int
    failed_at: _timestamp_pb2.Timestamp
    def __init__(self, sequence: _Optional[int] = ..., collection: _Optional[str] = ..., doc_id: _Optional[str] = ..., reason: _Optional[str] = ..., attempts: _Optional[int] = ..., failed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("collection", "limit", "after_sequence")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    collection: str
    limit: int
    after_sequence: int
    def __init__(self, collection: _Optional[str] = ..., limit: _Optional[int] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_after_sequence")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_after_sequence: int
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_after_sequence: _Optional[int] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("sequences", "collection", "after_sequence")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    collection: str
    after_sequence: int
    def __init__(self, sequences: _Optional[_Iterable[int]] = ..., collection: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("replayed", "superseded", "next_after_sequence")
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    replayed: int
    superseded: int
    next_after_sequence: int
    def __init__(self, replayed: _Optional[int] = ..., superseded: _Optional[int] = ..., next_after_sequence: _Optional[int] = ...) -> None: ...

class ReindexCollectionRequest(_message.Message):
    __slots__ = ("collection", "start")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    collection: str
    start: bool
    def __init__(self, collection: _Optional[str] = ..., start: _Optional[bool] = ...) -> None: ...

class ReindexCollectionResponse(_message.Message):
    __slots__ = ("collection", "phase", "serving_generation", "other_generation", "documents", "indexed", "pending", "failed", "retiring", "serving_model", "building_model")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SERVING_GENERATION_FIELD_NUMBER: _ClassVar[int]
    OTHER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RETIRING_FIELD_NUMBER: _ClassVar[int]
    SERVING_MODEL_FIELD_NUMBER: _ClassVar[int]
    BUILDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    collection: str
    phase: ReindexPhase
    serving_generation: int
    other_generation: int
    documents: int
    indexed: int
    pending: int
    failed: int
    retiring: int
    serving_model: str
    building_model: str
    def __init__(self, collection: _Optional[str] = ..., phase: _Optional[_Union[ReindexPhase, str]] = ..., serving_generation: _Optional[int] = ..., other_generation: _Optional[int] = ..., documents: _Optional[int] = ..., indexed: _Optional[int] = ..., pending: _Optional[int] = ..., failed: _Optional[int] = ..., retiring: _Optional[int] = ..., serving_model: _Optional[str] = ..., building_model: _Optional[str] = ...) -> None: ...
