"""A user's GPU description (YAML or JSON) validated into GpuSpec keyword arguments.

The schema mirrors GpuSpec: peaks in TFLOP/s (dense), bandwidths in GB/s, memory in GB as vendors print it.
Every error is one line naming the field and the way out. Pure: pydantic and yaml only.
"""

from __future__ import annotations

import difflib
import json

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError

__all__ = ["GpuFile", "parse_gpu_file"]

GiB = 1024**3


class GpuFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    memory_gb_nominal: int = Field(gt=0)
    memory_gib: float | None = Field(default=None, gt=0)  # allocatable; default 0.97 x nominal
    bf16_tflops: float = Field(gt=0)
    fp8_tflops: float = Field(default=0.0, ge=0)
    mxfp8: bool = False
    fp8_any_layout: bool | None = None  # FP8 GEMMs in any operand layout (sm100-class); default: as mxfp8
    fp4_tflops: float = Field(default=0.0, ge=0)  # dense NVFP4 peak (Blackwell); 0: none
    hbm_gbps: float = Field(gt=0)
    nvlink_gbps: float = Field(gt=0)  # unidirectional per GPU
    nvlink_domain: int | None = None  # GPUs on one NVLink fabric; default: the node
    usd_per_hour: float = Field(default=0.0, ge=0)
    gpus_per_node: int = Field(default=8, gt=0)
    network_gbps: float = Field(default=400.0, gt=0)  # per node
    instance: str = ""
    host_mem_gbps: float = Field(default=400.0, gt=0)
    host_link_gbps: float = Field(default=32.0, gt=0)
    host_mem_gib: float = Field(default=2048.0, gt=0)


def parse_gpu_file(text: str, where: str, spec_fields: set[str]) -> dict:
    """GpuSpec keyword arguments from the file's text; ConfigError (one line) when it is not a valid GPU."""
    try:
        data = json.loads(text) if where.lower().endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--gpu {where}: not valid {'JSON' if where.endswith('.json') else 'YAML'} ({first}); "
                          "fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--gpu {where}: expected a mapping of GPU fields (name, bf16_tflops, ...)")
    fields = list(GpuFile.model_fields)
    for key in data:  # before pydantic: a misspelt field would be reported as the real one missing
        if key not in GpuFile.model_fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"--gpu {where}: unknown field {key!r}{hint}; fields: {', '.join(fields)}")
    try:
        g = GpuFile(**data)
    except ValidationError as exc:
        errors = exc.errors()
        missing = [".".join(str(x) for x in e["loc"]) for e in errors if e["type"] == "missing"]
        if missing:  # every missing field at once, so one edit fixes the file
            required = [f for f, info in GpuFile.model_fields.items() if info.is_required()]
            raise ConfigError(f"--gpu {where}: field{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                              f"{'are' if len(missing) > 1 else 'is'} required; required: {', '.join(required)} "
                              f"(optional: {', '.join(f for f in fields if f not in required)})") from None
        e = errors[0]
        loc = ".".join(str(x) for x in e["loc"]) or "file"
        raise ConfigError(f"--gpu {where}: field {loc}: {e['msg']} (got {e.get('input')!r}); "
                          f"fields: {', '.join(fields)}") from None
    _check_consistent(g, where)
    kw = g.model_dump()
    gib = kw.pop("memory_gib")
    kw["memory_bytes"] = int((gib if gib is not None else 0.97 * g.memory_gb_nominal) * GiB)
    kw["nvlink_domain"] = g.nvlink_domain or 0  # GpuSpec: 0 is the node
    assert set(kw) <= spec_fields
    return kw


def _check_consistent(g: GpuFile, where: str) -> None:
    """Fields that are each valid but contradict one another."""
    if g.memory_gib is not None and g.memory_gib > g.memory_gb_nominal:
        raise ConfigError(f"--gpu {where}: memory_gib {g.memory_gib:g} is more than memory_gb_nominal "
                          f"{g.memory_gb_nominal}: memory_gib is the allocatable part of it (default 0.97 x "
                          f"{g.memory_gb_nominal} = {0.97 * g.memory_gb_nominal:.1f}); lower it or leave it out")
    d, per = g.nvlink_domain, g.gpus_per_node
    if d is None:
        return
    if d < 1:
        raise ConfigError(f"--gpu {where}: nvlink_domain {d}: must be 1 or more GPUs; leave it out for one "
                          f"node's GPUs ({per})")
    if d % per and per % d:
        raise ConfigError(f"--gpu {where}: nvlink_domain {d} with gpus_per_node {per}: an NVLink domain is whole "
                          f"nodes or a part of one, so it must divide {per} or be a multiple of it "
                          f"(e.g. {per} or {2 * per}); fix one of the two")
