"""The fixed prose of docs/SCALE.md: how each figure is measured, and what the services lack for
the size bench (bench/size_report.py fills in the run's own figures)."""

from __future__ import annotations

METHOD = """\
## How each figure is measured

The bench (`bench/size_bench.py`, helpers `bench/size_*.py`) starts its own stack with
`ragmesh_cli.stack.Stack` (NATS, SeaweedFS, embedder, {index_shards} index shards, {sparse_shards} sparse,
gateway; no ingestion, planner or reranker: the gateway plans in process), fills one collection
up to each size in turn (incrementally) and measures it, then moves on to the next size.

- **Corpus** (`bench/size_corpus.py`, deterministic from `--seed`): documents of 5-15 chunks (10
  on average), each with a title, a `synthetic://` source URI and four metadata keys (`dept` one
  of ten values, uniform; `lang`, `year`, `kind`); ~150 words per chunk (~1.3 KB) drawn from a
  Zipf distribution (s = 1.07) over 50,000 made-up words, a quarter of them from the 40 topic
  words of the document's topic. Vectors (384 dimensions, the embedder's): `clustered` is a
  mixture of {clusters:,} Gaussian clusters on the unit sphere (topic centre, document around it, chunk
  around its document, normalised: cosine ~0.7 within a document, ~0.5 within a topic, ~0
  across), `random` uniform on the sphere. Queries: {queries} vectors near a topic's centre
  (perturbed), with text of that topic's words and two common ones.
- **Fill**: straight into the stores' `ReplaceDocuments` RPCs as the ingestion workers call them
  (`services/ingestion/pipeline.py`): batches of 100 documents, one request per index shard and
  one per sparse shard that own some of the batch's documents (a document goes whole to
  `meshkit.domain.ids.document_shard`), all in parallel, two batches in flight, fence = version
  + 1. `fill_chunks_per_s` is chunks over wall time; `fill_bound` the bench itself when it kept
  a core busy (generation, request building, one Python thread), else the store whose calls the
  batches waited on longest; the detail gives the cores every part used (CPU time from
  `/proc/<pid>/stat` over the fill).
- **Settling**: after a fill, the bench waits for the stores' snapshot intervals and until the
  index and sparse processes are idle (rebuilds, snapshots, uploads done), then calls `Snapshot`
  on every shard so what is on disk is one snapshot and no WAL.
- **Search through the gateway**: `Search` with `rerank=false`, `hyde_mode=OFF`,
  `max_variations=1`, `strategy=PRECISE` (pool 50), top 10, the server's RRF weights: a plain
  hybrid search (dense + BM25; the synthetic queries hold no hard keyword, so no exact leg),
  its query text embedded by the real embedder (MiniLM). p50/p99 at concurrency 1 over every
  query after a warm-up; `throughput_c8` is {throughput_calls} searches at concurrency 8 over their wall
  time; `gateway_dense_p50_ms_c1` the same search with weights dense 1, BM25 0, exact 0;
  `filtered_p50_ms` with the filter `dept == d3` (~10% of documents).
- **Index shards directly**: `index_search_p50_ms` is one shard's `Search` (top 10, shards
  alternating) at concurrency 1 with the bench's query vectors; `recall_at_10` searches every
  shard, merges by score and compares the top 10 with exact search (numpy, float32 inner product
  over every vector the bench wrote, the changed documents' new vectors included);
  `recall_at_10_filtered` the same with the `dept == d3` filter against exact search over those
  documents only.
- **Memory**: VmRSS (`/proc/<pid>/status`) and Pss (`/proc/<pid>/smaps_rollup`) summed over every
  process of each component's session (the stack starts each in its own), minus what the same
  components had on the empty stack at the start, divided by the chunks. Index shard 0 has been
  SIGKILLed and restarted at every smaller size (the restart measurement), so it holds what it
  reloaded plus what was written since. Peak RSS is VmHWM summed over the processes (each one's
  peak since it started, at any moment: snapshots copy the state while they write it).
- **Disk**: bytes allocated (as `du` counts) under the components' data dirs after the settling
  snapshot, per chunk; the NATS JetStream directory (the replicated logs: every write ever made)
  and the SeaweedFS directory (uploaded snapshots) are given apart.
- **Checkpoint**: {changed:,}+ chunks changed (whole documents, rewritten with new text, vectors
  and chunk ids: the old chunks removed), then `Snapshot` on every index shard at once
  (`checkpoint_s`, upload to the object store included). `checkpoint_bytes` is the growth of
  `write_bytes` in `/proc/<pid>/io` of the shard processes across the Snapshot calls (the WAL
  records of the change itself are before it: `checkpoint_wal_bytes`); the ratio divides it by
  the shards' bytes on disk after it.
- **Restart**: SIGKILL index shard 0 (`stack.kill`), `stack.start`, then poll until its `GetStats`
  shows every chunk it had and a `Search` answers: `restart_s` from the kill (process start,
  snapshot load, WAL replay, log catch-up); `restart_healthy_s` until the stack's health probe
  passed.
"""

LACKS = """\
## What the services lack for this bench

- **No query vector through the gateway.** `GatewayService.Search` takes text only and its dense
  leg embeds it with the embedder, so the bench's own query vectors cannot reach the dense leg
  through the gateway: dense recall is measured on the index shards directly
  (`recall_at_10_gateway` is null), and gateway latency with text queries (the synthetic text
  embedded by MiniLM lands anywhere in the synthetic vector space: the dense leg's work is the
  same, its hits are not meaningful).
- **Sparse shards hold whole documents** (`--sparse-shards`, 2 by default): the filler sends each
  document to its shard (`meshkit.domain.ids.document_shard`), as the ingestion workers do.
- **No snapshot RPC on sparse**: its checkpoints run on their own interval; only the index's
  checkpoint is measured.
- **GetStats has no index parameters**: it reports the index type and dimension per shard, not
  the IVF list count, nprobe or HNSW settings; `index_params` gives the settings the stack was
  started with (`RAGMESH_INDEX_*`, the same environment the shards read) beside what GetStats says.
"""
