"""The catalog layer of a metric (compute, communication, storage, network, job): the catalog's own
`layer` where an entry has one, else from the name's prefix, so every metric lands in one board band.
A model class speaks for one or more of them (CLASS_LAYERS)."""

from __future__ import annotations

from stethoscope.catalog import Catalog

LAYERS = ("compute", "communication", "storage", "network", "job")
# the model's fault classes (docs/design.md: communication = catalog layers communication + network);
# a job's step time is the compute class's, as in the model's features
CLASS_LAYERS = {
    "communication": ("communication", "network"),
    "storage": ("storage",),
    "compute": ("compute", "job"),
}
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


def layer_of(catalog: Catalog | None, metric: str) -> str:
    spec = catalog.get(metric) if catalog is not None else None
    declared = getattr(spec, "layer", "") if spec else ""
    if declared in LAYERS:
        return declared
    for prefix, layer in _PREFIXES:
        if metric.startswith(prefix):
            return layer
    return "compute"  # gpu_, pcie_, cpu_, numa_, bench_gemm, bench_fft, node_fingerprint
