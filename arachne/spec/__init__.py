"""What the user describes: GPUs, clusters, models and training jobs."""

from arachne.spec.cluster import Cluster, ClusterSpec, Device, Node, load_cluster
from arachne.spec.gpus import GPUCatalog, GPUType, gpu_catalog
from arachne.spec.job import Job, Precision
from arachne.spec.model import ModelSpec, load_model, model_catalog

__all__ = [
    "Cluster", "ClusterSpec", "Device", "Node", "load_cluster",
    "GPUCatalog", "GPUType", "gpu_catalog",
    "Job", "Precision",
    "ModelSpec", "load_model", "model_catalog",
]
