"""A city's node description, read from edge_nodes/<code>.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import yaml

# Package data of edgefire.edge_nodes, so an installed edgefire finds the cities too.
CITIES_DIR = Path(str(files("edgefire.edge_nodes")))


@dataclass(slots=True, frozen=True)
class Accelerators:
    kind: str
    count: int
    memory_gib: float


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

    @property
    def memory_budget_bytes(self) -> int:
        return int(self.memory_budget_gib * (1 << 30))

    @property
    def declared_accelerator_bytes(self) -> int:
        a = self.accelerators
        return int(a.count * a.memory_gib * (1 << 30))


def load_city(code: str, directory: Path = CITIES_DIR) -> City:
    path = directory / f"{code}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
        raise ValueError(f"no city {code!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    data["accelerators"] = Accelerators(**data["accelerators"])
    return City(**data)


def all_cities(directory: Path = CITIES_DIR) -> list[City]:
    return [load_city(p.stem, directory) for p in sorted(directory.glob("*.yaml"))]
