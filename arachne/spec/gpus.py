"""The GPU catalog: sourced figures per GPU type, with aliases (including Sailor's names)."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from arachne.errors import load_yaml
from arachne.spec.names import SafeName

GB = 1e9
GIB = 2.0**30
TFLOPS = 1e12

# The ranges a device's figures may take, in the catalog's units: far wider than any accelerator on either side,
# and narrow enough that the cost model's products stay finite and the search's step counts bounded (a rate of
# 1e-300 kept the batch split looping; 1e308 overflowed).
Tflops = Annotated[float, Field(ge=1e-3, le=1e5)]
"""Tensor throughput, TFLOPS: 1 GFLOP/s to 100 PFLOP/s."""
Gbps = Annotated[float, Field(ge=1e-3, le=1e5)]
"""A bandwidth, GB/s: 1 MB/s to 100 TB/s."""
MemoryGB = Annotated[float, Field(ge=0.01, le=1e5)]
"""Device memory, GiB (as vendors quote it): 10 MiB to about 100 TiB."""
PricePerHour = Annotated[float, Field(ge=0, le=1e4)]
"""USD per GPU-hour: 0 to 10,000."""


def normalize_name(name: str) -> str:
    """Case- and punctuation-insensitive key (dots kept: 1.3B is not 13B): ``A100-SXM4_40GB`` -> ``a100sxm440gb``."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


class GPUType(BaseModel):
    """One GPU type. Figures in the units of the catalog (GB, GB/s, TFLOPS); use the properties for SI."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: SafeName
    aliases: tuple[str, ...] = ()
    vendor: str = "unknown"
    generation: str = "unknown"
    memory_gb: MemoryGB
    peak_tflops: Tflops = Field(description="dense bf16/fp16 tensor throughput")
    bf16: bool = True
    fp32_tflops: Tflops | None = None
    tf32_tflops: Tflops | None = None
    # Dense FP8 tensor throughput (E4M3/E5M2 inputs, no sparsity), TFLOPS; None where the GPU has no FP8
    # tensor cores (Ampere and older, CDNA2). Plans with precision fp8 are only valid where this is set.
    fp8_tflops: Tflops | None = Field(default=None, description="dense FP8 tensor throughput; None: no FP8")
    memory_bandwidth_gbps: Gbps
    intra_node_gbps: Gbps = Field(description="per-GPU bandwidth to node peers, bidirectional")
    intra_node_link: Literal["nvlink", "pcie", "xgmi", "other"] = "other"
    gpus_per_node: int = Field(default=8, ge=1)
    inter_node_gbps: Gbps = Field(description="per-node network bandwidth")
    nics_per_node: int = Field(default=1, ge=1)
    measured_collective_gbps: Gbps | None = None
    source: str = ""
    uncertain: tuple[str, ...] = ()
    price_per_gpu_hour: PricePerHour | None = None
    """Formats v2 section 8: the catalog's default USD per GPU-hour (an on-demand list price, see
    ``price_source``), used where a cluster gives no price; None: the catalog has none for this type."""
    price_source: str = ""
    """Where ``price_per_gpu_hour`` was read (provider, instance type, region, the page or data set)."""
    price_date: str = ""
    """When that price was published or retrieved (ISO date)."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes. A GPU's "80 GB" is 80 GiB: nvidia-smi reports 81920 MiB on an A100 80GB
        and 40960 MiB on an A100 40GB (81559 MiB on an H100 80GB, of which the driver keeps a little), so
        the catalog's ``memory_gb`` is read in GiB (the fixed overhead of the cost model covers the rest)."""
        return self.memory_gb * GIB

    def peak_flops(self, precision: str) -> float:
        """Dense matmul FLOP/s at a training precision (fp32 runs TF32 where the GPU has it; fp8 needs
        ``fp8_tflops``: ValueError on a GPU without FP8)."""
        if precision == "fp8":
            if self.fp8_tflops is None:
                raise ValueError(f"GPU type {self.name} has no FP8 rate (fp8_tflops)")
            return self.fp8_tflops * TFLOPS
        if precision == "fp32":
            tflops = self.tf32_tflops or self.fp32_tflops or self.peak_tflops / 8
        else:
            tflops = self.peak_tflops
        return tflops * TFLOPS

    @property
    def hbm_bandwidth(self) -> float:
        return self.memory_bandwidth_gbps * GB

    @property
    def collective_bandwidth(self) -> float:
        """Effective per-GPU bandwidth of intra-node collectives and p2p, bytes/s."""
        if self.measured_collective_gbps:
            return self.measured_collective_gbps * GB
        eff = 0.8 if self.intra_node_link in ("nvlink", "xgmi") else 0.7
        return self.intra_node_gbps / 2 * eff * GB

    @property
    def node_bandwidth(self) -> float:
        """A node's usual network bandwidth, bytes/s."""
        return self.inter_node_gbps * GB

    @property
    def features(self) -> dict[str, float]:
        """Numeric description used by learned components (never the name)."""
        return {
            "memory_gb": self.memory_gb,
            "peak_tflops": self.peak_tflops,
            "memory_bandwidth_gbps": self.memory_bandwidth_gbps,
            "intra_node_gbps": self.intra_node_gbps,
            "inter_node_gbps": self.inter_node_gbps,
        }


class CustomGPUType(BaseModel):
    """A GPU type declared in a cluster's ``gpu_types`` (formats v1)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: SafeName
    memory_gb: MemoryGB
    peak_tflops: Tflops
    memory_bandwidth_gbps: Gbps
    intra_node_gbps: Gbps
    inter_node_gbps: Gbps
    fp32_tflops: Tflops | None = None
    tf32_tflops: Tflops | None = None
    fp8_tflops: Tflops | None = None  # dense FP8 rate; None: the type has no FP8
    bf16: bool = True
    gpus_per_node: int = Field(default=8, ge=1)
    nics_per_node: int = Field(default=1, ge=1)
    intra_node_link: Literal["nvlink", "pcie", "xgmi", "other"] = "other"

    def to_gpu_type(self) -> GPUType:
        return GPUType(**self.model_dump(), source="cluster gpu_types")


class GPUCatalog:
    """Name/alias lookup over GPU types (case and punctuation insensitive)."""

    def __init__(self, gpus: list[GPUType], allow_override: bool = False):
        self.gpus = list(gpus)
        self._index: dict[str, GPUType] = {}
        for gpu in self.gpus:
            for key in (gpu.name, *gpu.aliases):
                k = normalize_name(key)
                if not allow_override and k in self._index and self._index[k].name != gpu.name:
                    raise ValueError(f"GPU name {key!r} is ambiguous in the catalog")
                self._index[k] = gpu

    def get(self, name: str) -> GPUType | None:
        return self._index.get(normalize_name(name))

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def with_types(self, extra: list[GPUType]) -> "GPUCatalog":
        """A catalog where ``extra`` types override same-named catalog entries."""
        return GPUCatalog([*self.gpus, *extra], allow_override=True)

    def names(self) -> list[str]:
        return [g.name for g in self.gpus]


@lru_cache(maxsize=1)
def gpu_catalog() -> GPUCatalog:
    """The shipped GPU catalog (``arachne/data/gpus.yaml``)."""
    text = resources.files("arachne.data").joinpath("gpus.yaml").read_text()
    data = load_yaml(text)
    return GPUCatalog([GPUType(**entry) for entry in data["gpus"]])
