"""Constants shared by the gateway tests (a module, not conftest, so tests can import it)."""

MODEL_A = "mock-a"
MODEL_B = "mock-b"
CONTEXT = 2048
