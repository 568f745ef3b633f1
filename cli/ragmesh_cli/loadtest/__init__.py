"""``ragmesh loadtest SERVICE``: drive one stage of the mesh (or the gateway) through its own
contract with realistic requests, and report throughput, latency percentiles and errors by status.

    ragmesh loadtest reranker --dataset ../shared/bench/scifact --concurrency 8 --duration 30
    ragmesh loadtest gateway --dataset ../shared/bench/scifact --rate 20 --duration 60 --json
    ragmesh loadtest health --address 127.0.0.1:50057 --concurrency 32   # the driver's ceiling

Requests are built once, before the run, from a BEIR dataset (the split's judged queries; passages
are each query's relevant documents padded with other corpus documents) and sent pre-serialised;
responses are not parsed, so the driver's own cost stays small and visible (client CPU%).

Two modes. Closed loop (``--concurrency N``): N workers, each sends its next request when the last
one answers. Open loop (``--rate R``): requests are scheduled every 1/R s whatever the answers do,
and latency runs from the *scheduled* start, so a stalled server shows up in the percentiles
instead of silently slowing the driver down (coordinated omission). ``--max-outstanding`` caps the
calls in flight; a request that has to wait for a slot starts late, and the late starts and the
requests still unsent at the end are reported.

A call counts when it starts (is scheduled) inside the measured window, after ``--warmup``; its
outcome is awaited. Latency percentiles are over successful calls; failures are counted by gRPC
status code name.

Modules: ``targets`` (workload and request builders), ``runner`` (the loops and the recorder),
``report`` (human output), ``command`` (arguments and the run). The names below are the package's
interface (the CLI, bench/ and the tests use them).
"""

from __future__ import annotations

from ragmesh_cli.loadtest.command import add_arguments, prepare_requests, request_options, run_loadtest
from ragmesh_cli.loadtest.report import format_report
from ragmesh_cli.loadtest.runner import DriveOptions, drive, scheduled_count
from ragmesh_cli.loadtest.targets import (
    TARGETS,
    LoadData,
    RequestOptions,
    Target,
    hard_keywords,
    load_data,
    random_unit_vectors,
)

__all__ = [
    "TARGETS",
    "DriveOptions",
    "LoadData",
    "RequestOptions",
    "Target",
    "add_arguments",
    "drive",
    "format_report",
    "hard_keywords",
    "load_data",
    "prepare_requests",
    "random_unit_vectors",
    "request_options",
    "run_loadtest",
    "scheduled_count",
]
