"""Fresh text decided by routers differing only in HEAD_CHARS (1000, 500, 250), side by side.

    PYTHONPATH=src python benchmarks/results/router-decision-2026-12-04b/head_chars.py 300 500000

benchmarks/router_decision.py's fresh case and machinery, each request decided by the three in
turn (order rotating); each prompt's exact token count from a router that tokenizes whole texts,
to judge the estimate a head gives."""
import random, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # benchmarks/
import router_decision as rd
from pathlib import Path
from vllm_fleet.models import resolve_model
from vllm_fleet.router.cache import routing as cache_routing
from vllm_fleet.router.prompt.segments import MAX_CHARS
folder = Path(resolve_model(None, None).path)
requests, fill = int(sys.argv[1]), int(sys.argv[2])
keys_fn = cache_routing.block_keys = rd.Timed(rd.block_keys)
settings = {}
plain = rd.make_routing(folder, 0, tempfile.mkdtemp())
for head in (1000, 500, 250):
    routing = rd.make_routing(folder, MAX_CHARS, tempfile.mkdtemp())
    routing.head_chars = head
    eng = rd.Engines(routing); eng.fill(fill, random.Random(0))
    settings[f"head {head}"] = rd.Setting(routing, eng, keys_fn)
    settings[f"head {head}"].routing.prompt_ids(rd.chat("w", [{"role": "user", "content": "Hi"}]), rd.MODEL)
for case, build in (("fresh", rd.fresh_requests),):
    rng = random.Random(f"0-{case}")
    reqs = build(rng, requests)
    # the exact token counts, to judge the estimates
    exact = [len(plain.prompt_ids(rd.chat("x", m), rd.MODEL)) for _, m in reqs]
    results = rd.run_case(settings, reqs, rng)
    for name, t in results.items():
        errs = sorted((est - ex) / ex * 100 for est, ex in zip(t["tokens"], exact))
        print(f"\n{case}, {name}: {sum(t['head only'])}/{len(errs)} keyed from a head; estimate error vs exact count: "
              f"min {errs[0]:+.1f}% median {errs[len(errs)//2]:+.1f}% max {errs[-1]:+.1f}%")
        print(rd.line("whole decision", t["whole"])); print(rd.line("render+tokenize", t["tokenize"]))
        print(rd.line("block keys", t["keys"])); print(rd.line("index lookup", t["lookup"]))
