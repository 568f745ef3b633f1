"""A document's lifecycle: its states, the transitions between them and every compare-and-set
on the two JetStream key-value buckets that hold them. The API, the workers, the pipeline and
the reconciler use it; none of them writes a bucket directly. Import the modules, not this
package:

- ``machine``: the state machine: states, events, the transition table (rendered in
  docs/ARCHITECTURE.md) and the check every status write passes.
- ``store``: ``Lifecycle``, the one writer of both buckets (requests, replays, claims, leases,
  records, outcomes) and its reads.
- ``buckets``: the buckets' names and opening, reads, compare-and-set, and ``update_status``,
  the one write of the status bucket (decide, check the transition, compare-and-set).
- ``requests``: the API's side: whether a request is needed, the request and replay decisions,
  what they did.
- ``claims``: the workers' side: the claim, renew and finish decisions.
- ``outcomes``: what a claim and an outcome answer (``Claim``, ``Skip``, ``Busy``, ``GiveUp``,
  ``Success``, ``Failure``, ``Done``, ``Retry``...).
- ``entries``: the buckets' entries (``DocStatus``, ``DocRecord``) and what a status says about
  a request.
- ``retry``: compare-and-set conflicts and their retry policy, and redelivery delays.
- ``view``: an in-memory view of the status bucket kept current by a watcher.

Both buckets are keyed by ``meshkit.domain.ids.doc_key(collection, doc_id)``:

- **status**: the document's state, its *current request* (the ingest event of the latest
  submission, delete or replay: the status write is the commit point of a request, and its
  event is published after), the claim of the worker processing it (owner, fence, lease) and
  the attempt counters.
- **records** (the record manager): what the stores hold for the document: content hash,
  chunk ids, object key, and the fence of the claim that wrote it.

**Fencing.** A claim is a compare-and-set of the status at revision R; R is the claim's fence
and is written into the claimed entry. A later claim of the same document must compare-and-set
a revision at least as new as the one our claim wrote, so fences of one document strictly
increase. Every later write of the claim holder (lease renewal, record, outcome) succeeds only
while the entry still names this owner *and* this fence, so a worker whose lease expired and
whose document was claimed again has every write refused. The stores get the fence too
(``DocumentReplacement.fence``) and refuse a replacement older than one they applied.

**Attempts.** JetStream redelivers without limit (the consumer's max_deliver is -1); the
lifecycle counts processing attempts itself. ``attempts`` counts every claim of the current
request; ``charged`` counts those that count against ``ingest_max_deliver``: a claim charges
one up front (a worker that dies mid-document leaves it charged) and a transient
infrastructure failure gives it back. Transient failures are bounded by time instead
(``ingest_transient_retry_window_s``); a document held by another live worker is "busy" and
costs nothing. A claim that finds the charge at the limit dead-letters the document itself:
no advisory subscription, no other process involved.
"""
