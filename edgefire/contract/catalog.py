"""The model catalog: ids, aliases and where each model's weights come from."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import yaml

from edgefire.contract.errors import ModelUnavailableError, UnknownModelError
from edgefire.planning.node import need_bytes

# Package data, so an installed (non-editable) edgefire finds it too.
DEFAULT_CATALOG = Path(str(files("edgefire") / "catalog.yaml"))


@dataclass(slots=True, frozen=True)
class ModelSpec:
    id: str
    task: str
    architecture: str
    weights: str | None
    context_window: int
    aliases: tuple[str, ...] = ()
    description: str = ""
    size_tier: str = "small"
    runnable: bool = True
    codec: str = "identity"  # weight codec plugin the weights pass through on load
    extra: dict = field(default_factory=dict)  # fields later features read (prices, config, …)

    @property
    def need_bytes(self) -> int:
        """The memory a node here must have free to load this model, as the capacity planner
        computes it from the model's config (its miniature's, when it has one): weights,
        KV pool and reserve (edgefire.planning.node). Nobody enters it by hand."""
        return need_bytes(self)

    @property
    def miniature(self) -> str | None:
        """What of this model is synthetic, when what runs here is a miniature of it (the
        catalog's `miniature:` beside the real `config:`); None for a model served as it is.
        Every answer says it (x-edgefire-miniature), and so do the listings."""
        mini = self.extra.get("miniature")
        return None if not mini else miniature_note(self.extra.get("config", {}), mini)


# Keys of a `miniature:` entry that say how it is made rather than how big it is.
_MINIATURE_ORIGIN = ("seed", "derive", "tokenizer")


def miniature_note(real: Mapping, mini: Mapping) -> str:
    """`num_layers 4 of 61, hidden_size 256 of 7168, …; weights seeded at random (seed 0), so
    its text is meaningless; tokenizer borrowed from …`: every size the miniature shrinks,
    next to the real config's, then where its weights and tokenizer come from."""
    shrunk = [f"{key} {value} of {real[key]}" for key, value in mini.items()
              if key not in _MINIATURE_ORIGIN and key in real and value != real[key]
              and not isinstance(value, Mapping)]
    parts = [", ".join(shrunk)] if shrunk else []
    if "seed" in mini:
        parts.append(f"weights seeded at random (seed {mini['seed']}), so its text is "
                     "meaningless")
    if "derive" in mini:
        parts.append(f"weights derived from {mini['derive']}")
    if "tokenizer" in mini:
        parts.append("tokenizer borrowed from " + str(mini["tokenizer"]).split("://")[-1])
    return "miniature: " + "; ".join(parts)


class Catalog:
    def __init__(self, specs: list[ModelSpec]) -> None:
        self.specs = specs
        self._by_name: dict[str, ModelSpec] = {}
        for spec in specs:
            for name in (spec.id, *spec.aliases):
                if name in self._by_name:
                    raise ValueError(f"catalog names {name!r} twice")
                self._by_name[name] = spec

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        path = Path(path or os.environ.get("EDGEFIRE_CATALOG") or DEFAULT_CATALOG)
        entries = yaml.safe_load(path.read_text())["models"]
        known = set(ModelSpec.__slots__) - {"extra"}
        specs = []
        for entry in entries:
            fields = {k: v for k, v in entry.items() if k in known}
            fields["aliases"] = tuple(fields.get("aliases", ()))
            extra = {k: v for k, v in entry.items() if k not in known}
            specs.append(ModelSpec(**fields, extra=extra))
        return cls(specs)

    def get(self, name: str) -> ModelSpec:
        """The spec for an id or alias; UnknownModelError if absent."""
        spec = self._by_name.get(name)
        if spec is None:
            raise UnknownModelError(f"No such model {name} or task", field="model")
        return spec

    def get_runnable(self, name: str) -> ModelSpec:
        spec = self.get(name)
        if not spec.runnable or not spec.weights:
            raise ModelUnavailableError(
                f"{spec.id} is listed for planning only and cannot run on this machine",
                field="model")
        return spec

    def find(self, name: str, tasks: Collection[str], *, runnable: bool = True) -> ModelSpec:
        """The spec `name` refers to, or 5007 in Workers AI's words (also if its task is not
        one of `tasks`); a model listed for planning only is 5018 when `runnable`."""
        try:
            spec = self.get_runnable(name) if runnable else self.get(name)
        except UnknownModelError:
            spec = None
        if spec is None or spec.task not in tasks:
            raise UnknownModelError(f"No such model {name} or task", field="model")
        return spec
