"""gRPC core settings a command puts in its environment before anything imports grpc.

gRPC's core reads its configuration (GRPC_EXPERIMENTS among it) once, when grpc is first
imported, so these must be set before that: the CLI applies them before it loads the commands.
This module imports nothing for that reason.

The gateway turns gRPC's EventEngine client off (`-event_engine_client`). With it on (grpcio's
default), each message a client receives wakes an EventEngine thread to read the socket, which
hands the message to grpcio's completion-queue poller thread, which wakes the asyncio loop:
~6–7 context switches per streamed message. Off, the poller thread reads the socket itself:
~2–3 per message. The gateway receives one message per engine step per worker, each a wake-up
of its own at a CPU engine's pace, and on a virtual machine a wake-up costs tens of
microseconds: benchmarks/RESULTS.md, "Fewer thread hops per gRPC message", has the figures.
The worker's server side showed no such difference and is left as grpcio ships it.

A value the user already set (even empty, which keeps grpcio's defaults) wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

# Per command: variables to set unless already set.
COMMAND_DEFAULTS: dict[str, dict[str, str]] = {
    "gateway": {"GRPC_EXPERIMENTS": "-event_engine_client"},
}

# Top-level CLI options that take a value: the command is the first word that is neither one
# of these options, nor its value, nor another option.
_OPTIONS_WITH_VALUE = frozenset({"--log-level"})


def command_of(argv: Sequence[str]) -> str | None:
    """The CLI command `argv` runs (`vllm-fleet [options] COMMAND ...`), or None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in _OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def apply_command_defaults(argv: Sequence[str], environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the defaults of the command `argv` runs; return the ones that were set."""
    applied = {}
    for name, value in COMMAND_DEFAULTS.get(command_of(argv) or "", {}).items():
        if name not in environ:
            environ[name] = applied[name] = value
    return applied
