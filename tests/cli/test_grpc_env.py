"""The gateway's gRPC core settings: set before grpc is imported, and never over the user's own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_fleet.grpc_env import COMMAND_DEFAULTS, apply_command_defaults, command_of


@pytest.mark.parametrize("argv, command", [
    (["gateway", "--workers", "h:1"], "gateway"),
    (["--log-level", "DEBUG", "gateway"], "gateway"),
    (["--log-json", "worker", "--engine", "mock"], "worker"),
    (["--version"], None),
    ([], None),
])
def test_command_of_skips_top_level_options(argv, command):
    assert command_of(argv) == command


def test_gateway_gets_the_defaults():
    environ: dict[str, str] = {}
    assert apply_command_defaults(["--log-level", "INFO", "gateway", "--workers", "h:1"], environ) == \
        COMMAND_DEFAULTS["gateway"]
    assert environ["GRPC_EXPERIMENTS"] == "-event_engine_client"


@pytest.mark.parametrize("value", ["", "-event_engine_listener"])
def test_a_value_the_user_set_wins(value):
    environ = {"GRPC_EXPERIMENTS": value}
    assert apply_command_defaults(["gateway"], environ) == {}
    assert environ == {"GRPC_EXPERIMENTS": value}


def test_other_commands_are_left_alone():
    environ: dict[str, str] = {}
    apply_command_defaults(["worker", "--engine", "mock"], environ)
    assert environ == {}


def test_the_cli_module_does_not_import_grpc():
    # gRPC reads its settings once, at import: if importing the CLI pulled grpc in, the
    # gateway's defaults would come too late and silently do nothing.
    code = "import sys, vllm_fleet.cli; assert 'grpc' not in sys.modules, 'grpc imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
