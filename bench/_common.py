"""Helpers shared by the benchmarks: workloads, percentiles, peak RSS, machine info, output."""

from __future__ import annotations

import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from edgefire.contract.cpu import cpu_class, has_amx

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Real-ish English text; prompts are seeded shuffles of these sentences.
SENTENCES = (
    "The river had been rising for three days before anyone in the village took it seriously.",
    "Engineers often say that the hardest part of any system is the boundary between two teams.",
    "A good loaf of bread needs flour, water, salt, yeast and, above all, patience.",
    "The committee met on Tuesday to review the budget and postpone the decision once again.",
    "Light from the nearest star takes a little over four years to reach the Earth.",
    "She packed a notebook, two pencils and a thermos of tea for the long train journey north.",
    "Most caching bugs come from forgetting that the data can change while you are not looking.",
    "In the spring the orchard fills with bees, and the air smells faintly of honey and rain.",
    "The old lighthouse keeper wrote down the weather every morning for forty-one years.",
    "Compilers translate source code into machine instructions through a series of passes.",
    "The market opened lower after the report showed that inflation had cooled less than expected.",
    "Children learn languages by listening long before they are able to speak a single word.",
    "A map is useful precisely because it leaves out almost everything about the territory.",
    "The museum's new wing displays tools, pottery and jewellery from the Bronze Age.",
    "When the power failed, the hospital switched to its generators within eleven seconds.",
    "Good documentation explains not only what the code does but also why it was written so.",
    "The hikers reached the ridge at noon and ate their lunch while watching the clouds roll in.",
    "Every winter the lake freezes thick enough for the town to hold a skating festival on it.",
    "A small change in the initial conditions can lead to a very different long-term outcome.",
    "The library extended its opening hours so that students could study late before exams.",
    "Tea was first traded along caravan routes that crossed mountains, deserts and steppes.",
    "The chef tasted the soup, added a pinch of pepper and sent it out to the dining room.",
    "Satellites in low orbit circle the planet roughly every ninety minutes.",
    "Volunteers planted two thousand trees along the riverbank to slow down the erosion.",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prompt_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


def make_prompts(tokenize: Callable[[str], list[int]], lengths: Sequence[int], seed: int,
                 tag: str) -> list[list[int]]:
    """One prompt per length, cut to exactly that many tokens.

    Each prompt opens with a unique header so no two share a prefix-cache block.
    """
    rng = random.Random(seed)
    prompts = []
    for i, length in enumerate(lengths):
        text = f"Document {tag}-{i}-{rng.randrange(10**9)}."
        ids = tokenize(text)
        while len(ids) < length:
            text += " " + " ".join(rng.sample(SENTENCES, len(SENTENCES)))
            ids = tokenize(text)
        prompts.append(ids[:length])
    return prompts


def percentiles(values: Sequence[float], scale: float = 1.0,
                points: Sequence[float] = (50, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in points}
    found = np.percentile(np.asarray(values, dtype=np.float64) * scale, list(points))
    return {f"p{p}": round(float(v), 3) for p, v in zip(points, found, strict=True)}


def peak_rss_mib() -> float:
    """This process's peak resident set size (ru_maxrss, KiB on Linux), process-wide."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _vm_hwm_kib(pid: int, name: str) -> int:
    """The peak RSS of pid once it runs `name` (0 before its exec, or once it is gone)."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    except OSError:
        return 0
    if fields.get("Name", "").strip() != name[:15]:
        return 0
    return int(fields.get("VmHWM", "0 kB").split()[0])


def run_with_peak_rss(cmd: Sequence[str]) -> tuple[str, float]:
    """Run cmd; return its stdout and its peak RSS in MiB (VmHWM, polled every 50 ms).

    Polling, because a forked child's ru_maxrss counts the parent's image from before exec.
    """
    name = Path(cmd[0]).name
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True,
                                cwd=RESULTS_DIR.parent.parent)  # `-m bench.…` resolves there
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _vm_hwm_kib(proc.pid, name))
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd, out.read(), err.read())
        return out.read(), round(peak / 1024, 1)


def rate(count: float, seconds: float) -> float:
    return round(count / seconds, 2) if seconds > 0 else 0.0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """`with stopwatch() as t:` leaves the elapsed seconds in t[0]."""
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def best_seconds(fn: Callable[[], object], repeats: int = 5, warmup: bool = False,
                 before: Callable[[], object] | None = None) -> float:
    """The fastest of `repeats` timed calls of fn (after one untimed call with warmup);
    `before`, if given, runs untimed before each timed call."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def machine_info() -> dict[str, object]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu,
        # the class of vector units the kernels and dtypes were chosen for (results from one
        # cpu_model string can come from AVX2-only and AVX512-BF16 machines alike)
        "cpu_class": cpu_class(),
        "amx": has_amx(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_results(name: str, result: dict, markdown: str | None = None) -> Path:
    """Write results/<name>.json (and .md); print the JSON as the last line of stdout.

    $EDGEFIRE_BENCH_RESULTS names another folder, so smoke runs leave the committed ones be;
    $EDGEFIRE_BENCH_TAG is added to the name (results/<name>-<tag>.json), so a run on another
    kind of machine (e.g. "avx2") sits beside the one the README's main tables read. Every
    result records the machine's roofline beside it (bench/roofline.py), measured now unless
    the bench measured it itself.
    """
    if "roofline" not in result:
        from bench.roofline import measure_roofline

        result = {**result, "roofline": measure_roofline()}
    folder = Path(os.environ.get("EDGEFIRE_BENCH_RESULTS") or RESULTS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    if tag := os.environ.get("EDGEFIRE_BENCH_TAG"):
        name = f"{name}-{tag}"
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if markdown is not None:
        (folder / f"{name}.md").write_text(markdown)
    print(json.dumps(result), flush=True)
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return "–" if value is None else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
