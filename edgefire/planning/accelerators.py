"""Accelerators by their vendors' numbers, and GPU sets such as `8xH100`.

GB vs GiB: a datasheet's "80 GB" is a marketing label, not 80·10^9 bytes. HBM parts are built
from binary-sized stacks (an H100 80GB carries 80 GiB = 85.9·10^9 bytes of HBM3), and GDDR
parts lose 1/16 of their memory to ECC, which is on by default (an L4's 24 GiB show as
22.5 GiB). The planner plans with what the driver reports as the device's total memory
(nvidia-smi's `memory.total`, ECC on), in MiB; the CUDA context and everything else a process
keeps come out of it as the reserve (edgefire.planning.reserve). Tables print GiB (2^30 bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgefire.contract.errors import PlanningError

GB = 10**9
GIB = 1 << 30
MIB = 1 << 20


@dataclass(slots=True, frozen=True)
class Accelerator:
    kind: str  # as city YAMLs and heartbeats name it, e.g. "nvidia-h100"
    name: str  # short, as `--gpus 8xH100` names it
    memory_gb: int  # the datasheet's label ("80 GB")
    memory_type: str
    reported_mib: int  # the device's total memory as the driver reports it (ECC on)

    @property
    def memory_bytes(self) -> int:
        return self.reported_mib * MIB


# Datasheet labels (NVIDIA T4, L4, L40S, A100 80GB, H100 SXM5 80GB, H200 141GB) and the
# totals nvidia-smi reports for them with ECC on: GDDR6 parts keep 15/16 of 16, 24 and 48 GiB;
# A100 shows its 80 GiB whole; H100 and H200 show a little under 80 and 144 GiB (the driver
# keeps some). The planner reads only reported_mib; the label is for people.
ACCELERATORS: dict[str, Accelerator] = {a.kind: a for a in (
    Accelerator("nvidia-t4", "T4", 16, "GDDR6", 15360),
    Accelerator("nvidia-l4", "L4", 24, "GDDR6", 23034),
    Accelerator("nvidia-l40s", "L40S", 48, "GDDR6", 46068),
    Accelerator("nvidia-a100", "A100", 80, "HBM2e", 81920),
    Accelerator("nvidia-h100", "H100", 80, "HBM3", 81559),
    Accelerator("nvidia-h200", "H200", 141, "HBM3e", 143771),
)}
_BY_NAME = {a.name.lower(): a for a in ACCELERATORS.values()}
MAX_COUNT = 64  # one site's set; more is a typo, not a site
_SET = re.compile(r"\s*(\d+)\s*[x×*]\s*([A-Za-z0-9-]+)\s*")


def accelerator(kind_or_name: str) -> Accelerator:
    """The accelerator for a kind (`nvidia-h100`) or short name (`H100`, any case)."""
    found = ACCELERATORS.get(kind_or_name.lower()) or _BY_NAME.get(kind_or_name.lower())
    if found is None:
        known = ", ".join(a.name for a in ACCELERATORS.values())
        raise PlanningError(f"unknown accelerator {kind_or_name!r} (known: {known})",
                            field="gpus")
    return found


@dataclass(slots=True, frozen=True)
class GpuSet:
    """`count` identical accelerators in one site, joined by a fast interconnect."""

    accelerator: Accelerator
    count: int

    @classmethod
    def of(cls, kind_or_name: str, count: int) -> GpuSet:
        if not 1 <= count <= MAX_COUNT:
            raise PlanningError(f"a GPU set has 1 to {MAX_COUNT} devices, not {count}",
                                field="gpus")
        return cls(accelerator(kind_or_name), count)

    @classmethod
    def parse(cls, text: str) -> GpuSet:
        """`8xH100`, `2×H200`, `1xnvidia-l4`."""
        match = _SET.fullmatch(text)
        if match is None:
            raise PlanningError(f"GPU set {text!r} is not COUNTxNAME, e.g. 8xH100",
                                field="gpus")
        return cls.of(match.group(2), int(match.group(1)))

    @property
    def memory_bytes(self) -> int:
        return self.count * self.accelerator.memory_bytes

    def __str__(self) -> str:
        return f"{self.count}×{self.accelerator.name}"
