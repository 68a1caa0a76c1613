"""`edgefire` command line: run the engine offline on a catalog model; plan capacity
(`edgefire plan`, edgefire.planning.cli)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edgefire.contract.catalog import Catalog
from edgefire.contract.commands import run_command
from edgefire.planning import cli as plan_cli
from edgefire.runtime.engine.sampling_params import SamplingParams

DEFAULT_MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"


def _generate(args: argparse.Namespace) -> int:
    from edgefire.runtime.llm import LLM  # torch import is slow; keep `edgefire --help` instant

    started = time.perf_counter()
    llm = LLM(args.model)
    print(f"[loaded {args.model} in {time.perf_counter() - started:.1f}s]", file=sys.stderr)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    messages = [{"role": "user", "content": args.prompt}]
    started = time.perf_counter()
    run = llm.generate(args.prompt, params) if args.raw else llm.chat([messages], params)
    result = run[0]
    elapsed = time.perf_counter() - started
    print(result.text)
    n = len(result.token_ids)
    print(f"[{n} tokens in {elapsed:.2f}s, {n / elapsed:.1f} tok/s, "
          f"finish_reason={result.finish_reason}]", file=sys.stderr)
    return 0


def _models(args: argparse.Namespace) -> int:
    for spec in Catalog.load().specs:
        state = "runnable" if spec.runnable else "planning only"
        print(f"{spec.id:48} {spec.task:22} {state}")
    return 0


def _compress(args: argparse.Namespace) -> int:
    from edgefire.runtime.loading.bundles import compress

    spec = Catalog.load().get_runnable(args.model)
    started = time.perf_counter()
    out, stats = compress(spec, Path(args.out) if args.out else None, progress=True)
    print(f"wrote {out}: {stats.tensors} tensors, {stats.raw_bytes} BF16 bytes -> "
          f"{stats.bundle_bytes} bundle bytes ({stats.reduction:.1%} smaller) in "
          f"{time.perf_counter() - started:.1f}s")
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from edgefire.runtime.plugins import load_plugins

    for line in load_plugins().listing():
        print(line)
    return 0


def _build_kernels(args: argparse.Namespace) -> int:
    import edgefire.models.attention.cpu_kernels  # noqa: F401  (declares its kernel)
    import edgefire.models.fused  # noqa: F401  (declares its kernel)
    import edgefire.runtime.engine.sampler  # noqa: F401  (declares its kernel)
    from edgefire.models.native import declared_kernels, load_native
    from edgefire.runtime.plugins import load_plugins

    load_plugins()  # the built-in plugins declare theirs
    failed = 0
    for name, source in declared_kernels().items():
        print(f"edgefire: native kernel {name} ...", end=" ", flush=True)
        started = time.perf_counter()
        built = load_native(name, source) is not None
        failed += not built
        print(f"{'ready' if built else 'UNAVAILABLE'} ({time.perf_counter() - started:.1f}s)",
              flush=True)
    if failed:
        print("edgefire: the torch fallback paths will be used instead (slower)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgefire")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="answer one prompt with a catalog model")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=DEFAULT_MODEL)
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.6)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--raw", action="store_true", help="skip the chat template")
    gen.set_defaults(func=_generate)
    compress = sub.add_parser("compress", help="write a model's compressed (Unweight) bundle")
    compress.add_argument("model", help="catalog id or alias")
    compress.add_argument("--out", help="bundle path (default: under the cache folder)")
    compress.set_defaults(func=_compress)
    sub.add_parser("models", help="list the catalog").set_defaults(func=_models)
    sub.add_parser("plugins", help="list loaded plugins and what each registers").set_defaults(
        func=_plugins)
    sub.add_parser("build-kernels", help="compile the native CPU kernels now (setup does)"
                   ).set_defaults(func=_build_kernels)
    plan_cli.add_parser(sub)
    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
