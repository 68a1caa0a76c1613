"""The package's shape: one import name, the import rules, a gateway free of torch, and a wheel
that serves on its own.

The import rules live in pyproject.toml ([tool.importlinter]) and are checked on the wheel's
layout, where the design card's folders sit under edgefire/ as they do once installed; a
planted violation shows the check can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LINT_IMPORTS = Path(PY).with_name("lint-imports")
SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
# What a build must not pick up from a working copy: caches, venvs, local state, old builds.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                     ".edgefire", ".pytest_cache", ".ruff_cache", "bench",
                                     ".torch_ext", "node_modules", ".wrangler")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EDGEFIRE_") and k != "PYTHONPATH"}
    return env | extra


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The distribution as `pip install .` builds it, from a copy of the sources (an in-tree
    build would pick up whatever an earlier build left in build/)."""
    src = tmp_path_factory.mktemp("src") / "edgefire"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE, symlinks=True)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("edgefire-*.whl")
    return built


@pytest.fixture(scope="module")
def installed_layout(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root)
    return root


def _lint_imports(layout: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
                          cwd=layout, env=_clean_env(PYTHONPATH=str(layout)),
                          capture_output=True, text=True, timeout=300)


def test_the_wheel_claims_one_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"edgefire"}
    # Data files travel with the code: the catalog, the cities, the kernels' sources.
    for data in ("edgefire/catalog.yaml", "edgefire/edge_nodes/fra.yaml",
                 "edgefire/models/attention/cpu_paged_decode.cpp"):
        assert data in names


def test_the_wheel_ships_the_pytest_plugin(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    assert "[pytest11]\nedgefire = edgefire.testing.pytest_plugin" in text
    assert "edgefire/testing/pytest_plugin.py" in names


def test_the_import_rules_hold(installed_layout):
    done = _lint_imports(installed_layout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " BROKEN" not in done.stdout


_ENGINE = "import edgefire.runtime.engine.llm_engine  # noqa\n"


@pytest.mark.parametrize(("planted", "source", "contract"), [
    ("edgefire/gateway/planted.py", _ENGINE, "The gateway reaches no node code and no torch"),
    ("edgefire/contract/planted.py", _ENGINE,
     "The wire contract imports neither side, nor torch"),
    ("edgefire/plugin_host/planted.py", _ENGINE,
     "The plugin machinery both worlds share imports neither world, nor torch"),
    ("edgefire/planning/planted.py", "import edgefire.gateway.app  # noqa\n",
     "The capacity planner imports neither world, nor torch"),
    ("edgefire/runtime/engine/planted.py", "import edgefire.runtime.loading.builder  # noqa\n",
     "The engine never reaches loading, weights, plugins or the node"),
    ("edgefire/runtime/node/planted.py", "import edgefire.runtime.server.app  # noqa\n",
     "The node's request path runs one way: server, node, loading, engine"),
])
def test_a_violation_breaks_the_import_rules(installed_layout, tmp_path, planted, source,
                                             contract):
    layout = tmp_path / "layout"
    shutil.copytree(installed_layout, layout)
    (layout / planted).write_text(source)
    done = _lint_imports(layout)
    assert done.returncode != 0
    assert f"{contract} BROKEN" in done.stdout


def test_the_gateway_starts_without_torch(tmp_path):
    # The app and its state, as `edge-gateway start` builds them, and the CLI's help.
    script = """
import sys
from edgefire.gateway.app import create_app
from edgefire.gateway.cli import main
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
create_app(GatewayState.build(GatewaySettings()))
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "numpy", "edgefire.runtime", "edgefire.plugins",
                           "edgefire.models") if m in sys.modules)
print("HEAVY", heavy)
"""
    done = subprocess.run([PY, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=_clean_env(
                              EDGEFIRE_GATEWAY_DB=str(tmp_path / "gw.db")))
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_an_installed_wheel_serves_a_city(wheel, tmp_path):
    """pip install of the wheel into a fresh venv, then `edge-node start --city fra` from an
    empty directory: the catalog and the city come from the package, not from a checkout."""
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    # The dependencies (torch & co.) come from this venv's site-packages rather than an index;
    # a plain path line in a .pth adds the directory without running its own .pth files, so
    # the checkout's editable install does not come along.
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and
                (p / "torch").is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import edgefire.runtime; print(edgefire.runtime.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True,
                           env=_clean_env())
    assert where.stdout.startswith(str(site)), where.stdout

    port = free_port()
    work = tmp_path / "empty"
    work.mkdir()
    # No compile in the test: the kernels' torch fallback answers the same.
    env = _clean_env(EDGEFIRE_NATIVE_KERNELS="0", EDGEFIRE_PLUGINS="")
    node = subprocess.Popen([str(venv / "bin" / "edge-node"), "start", "--city", "fra",
                             "--port", str(port)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and node.poll() is None:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        answer = httpx.post(f"{base}/client/v4/accounts/acct/ai/run/{SMOL}",
                            json={"prompt": "The capital of France is", "raw": True,
                                  "max_tokens": 12, "temperature": 0}, timeout=120)
    finally:
        node.terminate()
        output = node.communicate(timeout=30)[0]
    assert answer.status_code == 200, output
    assert "Paris" in answer.json()["result"]["response"]
