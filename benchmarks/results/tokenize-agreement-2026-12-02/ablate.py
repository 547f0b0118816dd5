"""Ablation probe: each mirrored vLLM decision in router/prompt/chat_render.py switched off in turn; the
corpus of benchmarks/tokenize_agreement.py must then show mismatches. Run from the repository root:
    PYTHONPATH=src python benchmarks/results/tokenize-agreement-2026-12-02/ablate.py {format|order|tools|dev|args}
"""
import sys, io, contextlib, runpy
from vllm_fleet.router.prompt import chat_render as cr
which = sys.argv[1]
if which == "format": cr.content_format = lambda t: "string"
if which == "order": cr._validated_call = lambda c: dict(c)
if which == "tools": cr.tool_dicts = lambda t: None if t is None else [dict(x) for x in t]
if which == "dev": cr.developer_as_system = lambda m, t: m
if which == "args": cr._parse_tool_arguments = lambda m: None
sys.argv = ["x"]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    runpy.run_path("benchmarks/tokenize_agreement.py", run_name="__main__")
print(which, [l for l in buf.getvalue().splitlines() if "identical (" in l])
