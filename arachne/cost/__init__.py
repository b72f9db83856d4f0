"""The common cost model: compute, memory, network, schedule simulation."""

from arachne.cost.calibration import DEFAULT_CALIBRATION, Calibration
from arachne.cost.model import BREAKDOWN_KEYS, CostModel, Estimate, StageEstimate

__all__ = ["BREAKDOWN_KEYS", "Calibration", "CostModel", "DEFAULT_CALIBRATION", "Estimate", "StageEstimate"]
