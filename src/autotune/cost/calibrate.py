"""Calibration: per-GPU-kind factors on the time model's terms, fitted to measured runs.

PLACEHOLDER until the fitting lands: ships defaults (all factors 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory import MemoryCoefficients
from .time import TimeCoefficients

__all__ = ["Calibration", "load_calibration"]


@dataclass(frozen=True)
class Calibration:
    gpu: str
    time: TimeCoefficients = field(default_factory=TimeCoefficients)
    memory: MemoryCoefficients = field(default_factory=MemoryCoefficients)
    provenance: str = "defaults (uncalibrated)"


def load_calibration(gpu: str) -> Calibration:
    return Calibration(gpu)
