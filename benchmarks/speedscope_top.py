"""The heaviest functions of a py-spy speedscope profile: own and total share of the samples.

    python benchmarks/speedscope_top.py PROFILE.json [--top 30] [--match TEXT]

Shares are of all samples of the process (idle threads included only if py-spy ran with --idle).
`--match TEXT` keeps functions whose name or file contains TEXT (e.g. vllm_fleet).
A profile recorded with `py-spy record --subprocesses` holds one profile per thread of every
process ("Process PID Thread TID ..."): the samples per process are printed first, and
`--process PID` keeps one process (e.g. the EngineCore under a worker).
"""

from __future__ import annotations

import argparse
import json
import lzma
from collections import Counter


def _load(path: str) -> dict:
    """A profile, xz-compressed (as benchmarks/results keeps them) or not."""
    return json.load(lzma.open(path) if path.endswith(".xz") else open(path))


def process_of(profile: dict) -> str:
    words = profile.get("name", "").split()
    return words[1] if len(words) > 1 and words[0] == "Process" else "?"


def samples_by_process(path: str) -> Counter:
    weights: Counter = Counter()
    for profile in _load(path)["profiles"]:
        weights[process_of(profile)] += sum(profile["weights"])
    return weights


def summarize(path: str, process: str = "") -> tuple[Counter, Counter, int]:
    data = _load(path)
    frames = data["shared"]["frames"]
    own: Counter = Counter()
    total: Counter = Counter()
    samples = 0
    for profile in data["profiles"]:
        if process and process_of(profile) != process:
            continue
        for stack, weight in zip(profile["samples"], profile["weights"]):
            samples += weight
            if stack:
                own[stack[-1]] += weight
            for frame in set(stack):
                total[frame] += weight
    names = [f"{f['name']} ({f.get('file', '').rsplit('site-packages/', 1)[-1].rsplit('src/', 1)[-1]}:{f.get('line', '')})"
             for f in frames]
    return Counter({names[k]: v for k, v in own.items()}), Counter({names[k]: v for k, v in total.items()}), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--match", default="")
    parser.add_argument("--process", default="", help="only this process's samples (its PID)")
    args = parser.parse_args()
    per_process = samples_by_process(args.profile)
    if len(per_process) > 1:
        print("samples per process: " + ", ".join(f"{pid} {n:g}" for pid, n in per_process.most_common()))
    own, total, samples = summarize(args.profile, args.process)
    print(f"{samples} samples")
    for title, counter in (("own", own), ("total", total)):
        print(f"--- {title}")
        shown = [(name, n) for name, n in counter.most_common() if args.match in name][:args.top]
        for name, n in shown:
            print(f"{100 * n / samples:5.1f}%  {name}")


if __name__ == "__main__":
    main()
