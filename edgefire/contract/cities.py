"""A city's node description, read from edge_nodes/<code>.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import yaml

from edgefire.planning.accelerators import GpuSet

# Package data of edgefire.edge_nodes, so an installed edgefire finds the cities too.
CITIES_DIR = Path(str(files("edgefire.edge_nodes")))


@dataclass(slots=True, frozen=True)
class Accelerators:
    """What the site declares to the capacity planner; this machine runs every city on its CPU.
    Each device's memory is the planner's (the vendor's figure), not the YAML's."""

    kind: str  # an edgefire.planning.accelerators kind, e.g. nvidia-h100
    count: int

    @property
    def gpus(self) -> GpuSet:
        return GpuSet.of(self.kind, self.count)

    @property
    def memory_gib(self) -> float:
        """One device's memory in GiB (the vendor's decimal GB, converted)."""
        return self.gpus.accelerator.memory_bytes / (1 << 30)


@dataclass(slots=True, frozen=True)
class City:
    code: str
    name: str
    country: str
    lat: float
    lon: float
    role: str  # "prefill", "decode" or "both"
    port: int
    accelerators: Accelerators
    memory_budget_gib: float  # what this node may hold resident in models
    # Model id → parallel layout ({tp: 2}, …), over the catalog entry's `parallel:` on this
    # city's node (README, "Parallel layouts").
    parallel: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def memory_budget_bytes(self) -> int:
        return int(self.memory_budget_gib * (1 << 30))

    @property
    def declared_accelerator_bytes(self) -> int:
        return self.accelerators.gpus.memory_bytes


def load_city(code: str, directory: Path = CITIES_DIR) -> City:
    path = directory / f"{code}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
        raise ValueError(f"no city {code!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    accelerators = Accelerators(**data["accelerators"])
    GpuSet.of(accelerators.kind, accelerators.count)  # an unknown kind fails here, not later
    return City(**{**data, "accelerators": accelerators})


def all_cities(directory: Path = CITIES_DIR) -> list[City]:
    return [load_city(p.stem, directory) for p in sorted(directory.glob("*.yaml"))]
