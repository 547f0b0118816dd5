"""vllm-fleet: LLM serving over a fleet of vLLM workers."""
__version__ = "0.1.0"
