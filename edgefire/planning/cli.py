"""`edgefire plan`: the capacity planner from the command line. Imports the planner and the
catalog only (no engine, no torch), so it answers at once."""

from __future__ import annotations

import argparse
import json

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.errors import PlanningError
from edgefire.planning.accelerators import GpuSet
from edgefire.planning.model import PlannedModel
from edgefire.planning.node import node_need
from edgefire.planning.plan import Layout, plan
from edgefire.planning.precisions import KV_DTYPES
from edgefire.planning.report import TABLE_SETS, describe, gib, hosting, lines, table, tokens

EXAMPLES = """examples:
  edgefire plan @cf/moonshotai/kimi-k2.5 --gpus 8xH100
  edgefire plan @cf/meta/llama-4-scout-17b-16e-instruct --gpus 2xH200 --kv-dtype fp8
  edgefire plan @cf/meta/llama-3.1-8b-instruct --gpus 1xL4 --codec int4 --json
  edgefire plan @cf/moonshotai/kimi-k2.5          (which GPU sets can host it)
  edgefire plan --table                           (every catalog model, the README's table)"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan a model's weights, KV cache and capacity on GPUs",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="catalog id or alias")
    p.add_argument("--gpus", action="append", metavar="NxNAME",
                   help="a GPU set such as 8xH100 (repeatable); without it: which sets host")
    p.add_argument("--codec", help="weight codec (default: the catalog entry's)")
    p.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES)
    p.add_argument("--layout", help="tp8, pp8, ep8, tp4pp2, … (default: the best that fits)")
    p.add_argument("--seqs", type=int, default=1,
                   help="sequences whose chunked-local KV is set aside (Llama 4)")
    p.add_argument("--table", action="store_true", help="the table of every catalog model")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    catalog = Catalog.load()
    if args.table:
        sets = args.gpus or list(TABLE_SETS)
        print(table((PlannedModel.real(spec) for spec in catalog.specs), sets))
        return 0
    if not args.model:
        raise PlanningError("name a model, or pass --table", field="model")
    spec = catalog.get(args.model)
    model = PlannedModel.real(spec, args.codec)
    if not args.gpus:
        return _hosting(spec, model, args)
    layout = Layout.parse(args.layout) if args.layout else None
    plans = [plan(model, GpuSet.parse(g), layout, kv_dtype=args.kv_dtype, seqs=args.seqs)
             for g in args.gpus]
    if args.json:
        print(json.dumps([describe(p) for p in plans] if len(plans) > 1
                         else describe(plans[0]), indent=2))
    else:
        print("\n\n".join("\n".join(lines(p)) for p in plans))
    return 0


def _hosting(spec: ModelSpec, model: PlannedModel, args: argparse.Namespace) -> int:
    found = hosting(model, args.kv_dtype)
    here = PlannedModel.on_this_machine(spec)
    need = node_need(here) if here else None
    if args.json:
        print(json.dumps({"model": model.id, "hosts": [describe(p) for p in found],
                          "node_need_bytes": need.total if need else None}, indent=2))
        return 0
    print(f"{model.id}: {model.shape.params / 1e9:.2f}B parameters; GPU sets that host it "
          "(the smallest of 1, 2, 4, 8 per accelerator, best layout):")
    for p in found:
        kv = "" if p.tokens is None else f"  KV {gib(p.kv_bytes)}, {tokens(p.tokens)} tokens"
        print(f"  {str(p.gpus):8} {str(p.layout):8}{kv}")
    if not found:
        print("  none of up to 8 of any known accelerator")
    if need is not None:
        print(f"a node on this machine needs {need.total / (1 << 20):.0f} MiB to load it "
              f"(weights {need.weight_bytes >> 20} MiB, KV pool {need.kv_pool_bytes >> 20} "
              f"MiB, reserve {need.reserve_bytes >> 20} MiB)")
    return 0
