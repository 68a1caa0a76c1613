"""`edgefire plan`: its output is the planner's, it needs no torch, its mistakes are one typed
line, and the README's table is exactly what it prints (so the table cannot drift)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgefire.contract.catalog import Catalog
from edgefire.planning import GpuSet, PlannedModel, describe, plan
from edgefire.runtime.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
KIMI = "@cf/moonshotai/kimi-k2.5"
_TABLE = re.compile(r"<!-- edgefire plan --table -->\n(.*?)\n<!-- /edgefire plan --table -->",
                    re.S)


def test_the_readme_table_is_what_the_planner_prints(capsys):
    assert main(["plan", "--table"]) == 0
    printed = capsys.readouterr().out.strip()
    [in_readme] = _TABLE.findall(README.read_text())
    assert in_readme == printed
    assert len(printed.splitlines()) == 2 + len(Catalog.load().specs)


def test_plan_prints_the_planners_figures_without_importing_torch():
    script = ("import json, sys\n"
              "from edgefire.runtime.cli import main\n"
              "main(['plan', '@cf/kimi-k2.5', '--gpus', '8xH100', '--json'])\n"
              "assert 'torch' not in sys.modules, 'edgefire plan imported torch'\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    expected = describe(plan(PlannedModel.real(Catalog.load().get(KIMI)),
                             GpuSet.parse("8xH100")))
    assert json.loads(done.stdout) == json.loads(json.dumps(expected))


def test_plan_lists_the_sets_that_host_and_the_nodes_need(capsys):
    assert main(["plan", KIMI]) == 0
    out = capsys.readouterr().out
    assert "8×H100" in out and "2×H200" not in out
    assert f"{Catalog.load().get(KIMI).need_bytes / (1 << 20):.0f} MiB" in out


def test_a_layout_and_codec_can_be_chosen(capsys):
    assert main(["plan", "@cf/meta/llama-3.1-8b-instruct", "--gpus", "2xH100", "--layout",
                 "pp2", "--codec", "int4", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["layout"], shown["codec"]) == ("pp2", "int4")
    dense = plan(PlannedModel.real(Catalog.load().get("@cf/meta/llama-3.1-8b-instruct")),
                 GpuSet.parse("2xH100"))
    assert shown["weight_bytes"] < dense.weight_bytes / 2


@pytest.mark.parametrize(("argv", "said"), [
    (["plan", KIMI, "--gpus", "8xB999"], "error 5006: unknown accelerator 'B999'"),
    (["plan", KIMI, "--gpus", "8xH100", "--layout", "tp3"], "error 5006: layout tp3 needs 3"),
    (["plan", KIMI, "--codec", "zip"], "error 5006: unknown codec 'zip'"),
    (["plan", "@cf/no/such"], "error 5007"),
    (["plan"], "error 5006: name a model, or pass --table"),
])
def test_mistakes_are_one_line_and_exit_2(capsys, argv, said):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
