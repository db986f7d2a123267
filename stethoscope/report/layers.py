"""The catalog layer of a metric (compute, communication, storage, network, job): the catalog's own
`layer` where an entry has one, else from the name's prefix, so every metric lands in one board band."""

from __future__ import annotations

from stethoscope.catalog import Catalog

LAYERS = ("compute", "communication", "storage", "network", "job")
_PREFIXES = (
    ("nvlink_", "communication"),
    ("bench_allreduce", "communication"),
    ("nccl_", "communication"),
    ("smart_", "storage"),
    ("nvme_", "storage"),
    ("disk_", "storage"),
    ("bench_fio", "storage"),
    ("ib_", "network"),
    ("rdma_", "network"),
    ("net_", "network"),
    ("bench_rdma", "network"),
    ("ansible_host_unreachable", "network"),
    ("telemetry_", "network"),
    ("train_", "job"),
    ("cuda_memory", "job"),
)


def layer_of(catalog: Catalog, metric: str) -> str:
    spec = catalog.get(metric)
    declared = getattr(spec, "layer", "") if spec else ""
    if declared in LAYERS:
        return declared
    for prefix, layer in _PREFIXES:
        if metric.startswith(prefix):
            return layer
    return "compute"  # gpu_, pcie_, cpu_, numa_, bench_gemm, bench_fft, node_fingerprint
