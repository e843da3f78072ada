"""planner: proven-optimal training layouts (DP x TP x PP x CP, ZeRO, recompute) for LLMs."""

from planner.catalog import load_cluster, load_model
from planner.calibration import calibrate_logs as calibrate
from planner.errors import CatalogError, ConfigImportError, InvalidLayout, PlannerError, SpecError
from planner.memory import activation_bytes_per_layer, memory_ledger, static_memory
from planner.plans import Plan, evaluate
from planner.search import PlanResult, plan
from planner.specs import ClusterSpec, GpuSpec, HostSpec, Layout, ModelSpec, Recompute, TrainingSpec

__all__ = [
    "plan", "evaluate", "calibrate", "Plan", "PlanResult", "load_model", "load_cluster", "static_memory", "activation_bytes_per_layer", "memory_ledger",
    "ModelSpec", "GpuSpec", "ClusterSpec", "HostSpec", "TrainingSpec", "Layout", "Recompute",
    "PlannerError", "SpecError", "CatalogError", "ConfigImportError", "InvalidLayout",
]
__version__ = "0.1.0"
