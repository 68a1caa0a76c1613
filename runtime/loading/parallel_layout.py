"""A model's parallel layout, from its catalog entry's `parallel:` field ({tp: 2}, {pp: 2}…)."""

from __future__ import annotations

from dataclasses import dataclass

from edgefire.contract.errors import ModelUnavailableError

AXES = ("tp", "pp", "ep")  # tensor, pipeline, expert parallel degrees


@dataclass(slots=True, frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @classmethod
    def parse(cls, raw: object, model_id: str = "") -> ParallelLayout:
        """The layout a catalog entry asks for; None or {} is one process."""
        if raw is None:
            return cls()
        where = f"{model_id}: parallel" if model_id else "parallel"
        if not isinstance(raw, dict) or not set(raw) <= set(AXES):
            raise ModelUnavailableError(
                f"{where} must map some of {', '.join(AXES)} to degrees, got {raw!r}",
                field="model")
        for axis, degree in raw.items():
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise ModelUnavailableError(f"{where}.{axis} must be a positive integer, "
                                            f"got {degree!r}", field="model")
        return cls(**raw)

    @property
    def world_size(self) -> int:
        """Processes the layout runs on: one per rank."""
        return self.tp * self.pp * self.ep

    @property
    def strategy(self) -> str:
        """The parallel-strategy registry's name for it: its axes above 1, joined by '+'
        ("tp", "pp+tp"); "" for one process."""
        return "+".join(sorted(axis for axis in AXES if getattr(self, axis) > 1))
