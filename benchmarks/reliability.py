"""Reliability and security figures: runs the chaos scenarios (tests/chaos), collects the
`[figure]` lines they print, then measures what tests must not: API-key comparison timing (a
statistical test) and a larger schemathesis run against a gateway.

    python benchmarks/reliability.py                      # everything
    python benchmarks/reliability.py --only timing        # just the key-timing test
    python benchmarks/reliability.py --timing-samples 200000 --fuzz-examples 50
    python benchmarks/reliability.py --only spark20k      # scenario 10 at 20,000 rows (~5 min)
    python benchmarks/reliability.py --only chaos --engine  # with scenario 8 (real vLLM worker)

The 30-minute soak (scenario 14) is its own script: `nice -n 19 python benchmarks/soak.py`.

The chaos tests assert the invariants (0 lost tokens, 0 5xx, ...); this script only reports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_chaos(extra: list[str]) -> list[str]:
    """Run tests/chaos with output shown; return the figure lines."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/chaos", "-q", "-s", *extra]
    print("$", " ".join(command), flush=True)
    started = time.monotonic()
    # This checkout's package, even where the venv's editable install points at another clone.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    figures = [line.strip() for line in run.stdout.splitlines() if line.strip().startswith("[figure]")]
    tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-500:]
    print(f"chaos suite: {tail} ({time.monotonic() - started:.0f} s)")
    return figures


def key_timing(samples: int) -> str:
    """Time KeyStore.authenticate for guesses sharing 0 vs all-but-one leading characters with
    the real key (interleaved, randomised order) and test whether the distributions differ
    (Mann-Whitney U) and whether time grows with the shared prefix (regression slope)."""
    from vllm_fleet.gateway.keys import KeyRecord, KeyStore, hash_key, new_key, write_keys

    secret = new_key()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "keys.jsonl"
        write_keys(path, [KeyRecord("k", hash_key(secret))])
        store = KeyStore(path)
        lengths = [0, len(secret) // 4, len(secret) // 2, 3 * len(secret) // 4, len(secret) - 1]
        guesses = {n: secret[:n] + ("A" if secret[n] != "A" else "B") + "x" * (len(secret) - n - 1) for n in lengths}
        # Control: another wrong key sharing nothing, to show how far two arbitrary strings differ.
        guesses[-1] = "B" + "y" * (len(secret) - 1)
        times: dict[int, list[float]] = {n: [] for n in guesses}
        order = [n for n in guesses for _ in range(samples // len(guesses))]
        random.shuffle(order)
        clock = time.perf_counter_ns
        for n in order:
            guess = guesses[n]
            t0 = clock()
            store.authenticate(guess)
            times[n].append(clock() - t0)
    medians = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
    try:
        from scipy import stats

        u = stats.mannwhitneyu(times[lengths[0]], times[lengths[-1]])
        control = stats.mannwhitneyu(times[lengths[0]], times[-1])
        xs = [n for n in lengths for _ in times[n]]
        ys = [t for n in lengths for t in times[n]]
        slope = stats.linregress(xs, ys)
        test = (f"Mann-Whitney U (prefix 0 vs {lengths[-1]}) p = {u.pvalue:.3f}, control (two unrelated "
                f"wrong keys) p = {control.pvalue:.3f}; "
                f"regression slope {slope.slope:.3f} ns/char, p = {slope.pvalue:.3f}")
    except ImportError:
        test = f"permutation test p = {_permutation_p(times[lengths[0]], times[lengths[-1]]):.3f}"
    shown = ", ".join(f"{'control' if n < 0 else n}: {m} ns" for n, m in medians.items())
    return f"[figure] key comparison timing, {samples} samples: median by shared prefix {{{shown}}}; {test}"


def _permutation_p(a: list[float], b: list[float], rounds: int = 2000) -> float:
    """Two-sided permutation test on the difference of medians."""
    def median(values):
        return sorted(values)[len(values) // 2]

    observed = abs(median(a) - median(b))
    pooled = a + b
    hits = 0
    for _ in range(rounds):
        random.shuffle(pooled)
        hits += abs(median(pooled[:len(a)]) - median(pooled[len(a):])) >= observed
    return (hits + 1) / (rounds + 1)


async def _fuzz(examples: int) -> str:
    from vllm_fleet.fleet.worker_process import WorkerProcess
    from vllm_fleet.gateway.config import GatewayConfig
    from vllm_fleet.gateway.server import GatewayServer
    from vllm_fleet.registry import StaticRegistry
    from vllm_fleet.router import RouterConfig

    async with WorkerProcess(["--engine", "mock", "--served-model-name", "fuzz", "--mock-tokens-per-s", "2000",
                              "--mock-ttft-ms", "1"]) as worker:
        await worker.wait_serving(30)
        server = GatewayServer(GatewayConfig(port=0, access_log=False), RouterConfig(),
                               StaticRegistry.from_spec(worker.address))
        await server.start()
        try:
            run = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "schemathesis.cli", "run", server.url + "/openapi.json",
                "--checks", "not_a_server_error", "--max-examples", str(examples), "--workers", "1", "--no-color",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            output = (await run.communicate())[0].decode(errors="replace")
        finally:
            await server.stop()
    import schemathesis

    summary = [line.strip() for line in output.splitlines() if "generated" in line or "failed" in line.lower()]
    return (f"[figure] schemathesis {schemathesis.__version__}, --max-examples {examples}, all phases: exit "
            f"{run.returncode}; {summary[-1] if summary else output[-300:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["chaos", "timing", "fuzz", "spark20k"], action="append",
                        help="Run only these parts (repeatable)")
    parser.add_argument("--timing-samples", type=int, default=100_000, help="Key-timing samples in all")
    parser.add_argument("--fuzz-examples", type=int, default=30, help="schemathesis --max-examples per operation")
    parser.add_argument("--engine", action="store_true", help="Also run the real-vLLM scenario (8)")
    args = parser.parse_args()
    parts = args.only or ["chaos", "timing", "fuzz", "spark20k"]
    os.environ.setdefault("VLLM_FLEET_LOG_LEVEL", "WARNING")
    figures = []
    if "chaos" in parts:
        figures += run_chaos([] if args.engine else ["-m", "not engine and not slow"])
    if "spark20k" in parts:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        figures += run_chaos(["-m", "slow", "-k", "spark and 20k"])
    if "timing" in parts:
        figures.append(key_timing(args.timing_samples))
    if "fuzz" in parts:
        figures.append(asyncio.run(_fuzz(args.fuzz_examples)))
    print("\n".join(["", *figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
