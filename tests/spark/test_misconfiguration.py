"""Misconfiguration fails at the driver, in generate() itself, before any Spark job runs."""

from __future__ import annotations

import pytest

from support import free_port
from vllm_fleet.errors import ConfigError
from vllm_fleet.spark import generate


@pytest.fixture
def no_jobs(spark):
    """Asserts that nothing the test did started a Spark job."""
    context = spark.sparkContext
    context.setJobGroup("misconfiguration", "must not run")
    yield
    assert list(context.statusTracker().getJobIdsForGroup("misconfiguration")) == []
    context.setJobGroup("", "")


def df_of(spark):
    return spark.createDataFrame([(1, "hello")], "id long, prompt string")


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt_col": "question"}, "prompt_col='question': no such column; the DataFrame has id, prompt"),
    ({"prompt_col": "id"}, "is bigint, not string"),
    ({}, "exactly one of prompt_col and messages_col"),
    ({"prompt_col": "prompt", "messages_col": "prompt"}, "exactly one of prompt_col and messages_col"),
    ({"prompt_col": "prompt", "session_col": "id"}, "both session_col and turn_col"),
    ({"prompt_col": "prompt", "output_col": "id"}, "already has column(s) id"),
    ({"prompt_col": "prompt", "params": {"max_token": 5}}, "unknown sampling parameter(s) max_token"),
    ({"prompt_col": "prompt", "params": {"n": 2}}, "n must be 1"),
    # The typed parameters must build a request body before any row is read.
    ({"prompt_col": "prompt", "params": {"constraint": 5}}, "constraint must be a Constraint or a dict"),
    ({"prompt_col": "prompt", "params": {"constraint": {"regexx": "a"}}}, "unexpected keyword argument 'regexx'"),
    ({"prompt_col": "prompt", "params": {"constraint": {"regex": "a", "choice": ["x"]}}},
     "constraint must set exactly one of"),
    ({"prompt_col": "prompt", "params": {"constraint": {"json_schema": "{not json"}}}, "json_schema is not JSON"),
    # The ledger finds a row again by its key: without id_col (or sessions) there is none that lasts.
    ({"prompt_col": "prompt", "ledger_path": "/tmp/ledger"}, "ledger_path needs a stable row key"),
    ({"prompt_col": "prompt", "id_col": "id", "ledger_path": "s3://bucket/ledger"}, "not a URL"),
    ({"prompt_col": "prompt", "id_col": "id", "ledger_path": "/proc/no-ledger-here"},
     "ledger_path='/proc/no-ledger-here' is not a directory this job can write"),
])
async def test_bad_arguments_are_config_errors(spark, mock_pair, no_jobs, kwargs, message):
    with pytest.raises(ConfigError) as caught:
        generate(df_of(spark), workers=[mock_pair[0].address], **kwargs)
    assert message in str(caught.value)


async def test_no_reachable_worker_fails_fast(spark, no_jobs):
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=f"no serving worker reachable at workers {nobody}"):
        generate(df_of(spark), prompt_col="prompt", workers=[nobody], connect_timeout_s=1)


async def test_no_workers_named_fails_fast(spark, no_jobs):
    with pytest.raises(ConfigError, match="no workers"):
        generate(df_of(spark), prompt_col="prompt")


async def test_an_unknown_model_fails_fast(spark, mock_pair, no_jobs):
    with pytest.raises(ConfigError, match="model 'gpt-9' is not served .* served: mock-model"):
        generate(df_of(spark), prompt_col="prompt", workers=[mock_pair[0].address], model="gpt-9")
