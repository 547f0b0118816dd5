from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateInput(_message.Message):
    __slots__ = ("text", "token_ids", "messages_json", "resume_token_ids", "resume_delivered_chars", "router_token_ids", "router_ids_digest")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_DELIVERED_CHARS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_IDS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    messages_json: bytes
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    resume_delivered_chars: int
    router_token_ids: _containers.RepeatedScalarFieldContainer[int]
    router_ids_digest: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., messages_json: _Optional[bytes] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., resume_delivered_chars: _Optional[int] = ..., router_token_ids: _Optional[_Iterable[int]] = ..., router_ids_digest: _Optional[str] = ...) -> None: ...

class RequestBody(_message.Message):
    __slots__ = ("endpoint", "body_json")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    body_json: bytes
    def __init__(self, endpoint: _Optional[str] = ..., body_json: _Optional[bytes] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "inputs", "session_id", "priority", "stream_interval_ms", "body", "constrained", "adapter", "n", "batch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    inputs: _containers.RepeatedCompositeFieldContainer[GenerateInput]
    session_id: str
    priority: int
    stream_interval_ms: int
    body: RequestBody
    constrained: bool
    adapter: str
    n: int
    batch: bool
    def __init__(self, request_id: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[GenerateInput, _Mapping]]] = ..., session_id: _Optional[str] = ..., priority: _Optional[int] = ..., stream_interval_ms: _Optional[int] = ..., body: _Optional[_Union[RequestBody, _Mapping]] = ..., constrained: _Optional[bool] = ..., adapter: _Optional[str] = ..., n: _Optional[int] = ..., batch: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "rank")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    rank: int
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class PromptLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "candidates")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    candidates: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., candidates: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("index", "sample", "text", "token_ids", "finish_reason", "usage", "logprobs", "stop_reason", "reasoning", "tool_calls", "prompt_text", "prompt_logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    sample: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    stop_reason: str
    reasoning: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    prompt_text: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[PromptLogprob]
    def __init__(self, index: _Optional[int] = ..., sample: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., stop_reason: _Optional[str] = ..., reasoning: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., prompt_text: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[PromptLogprob, _Mapping]]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class MuxRequest(_message.Message):
    __slots__ = ("stream", "start", "cancel", "batched", "load_every_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    LOAD_EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    stream: int
    start: GenerateRequest
    cancel: bool
    batched: _containers.RepeatedCompositeFieldContainer[MuxRequest]
    load_every_ms: int
    def __init__(self, stream: _Optional[int] = ..., start: _Optional[_Union[GenerateRequest, _Mapping]] = ..., cancel: _Optional[bool] = ..., batched: _Optional[_Iterable[_Union[MuxRequest, _Mapping]]] = ..., load_every_ms: _Optional[int] = ...) -> None: ...

class MuxEvent(_message.Message):
    __slots__ = ("stream", "chunks", "done", "status_code", "status_message", "status_param")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_PARAM_FIELD_NUMBER: _ClassVar[int]
    stream: int
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateChunk]
    done: bool
    status_code: int
    status_message: str
    status_param: str
    def __init__(self, stream: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[GenerateChunk, _Mapping]]] = ..., done: _Optional[bool] = ..., status_code: _Optional[int] = ..., status_message: _Optional[str] = ..., status_param: _Optional[str] = ...) -> None: ...

class MuxResponse(_message.Message):
    __slots__ = ("events", "load", "load_every_ms")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LOAD_EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[MuxEvent]
    load: WorkerLoad
    load_every_ms: int
    def __init__(self, events: _Optional[_Iterable[_Union[MuxEvent, _Mapping]]] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., load_every_ms: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("model", "max_model_len", "engine", "version", "engine_version", "settings", "device", "worker_id", "pool", "request_form", "kv_block_size", "kv_events", "tasks", "pooling_endpoints", "tokenizer_digest", "takes_router_ids")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FORM_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    POOLING_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TAKES_ROUTER_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    engine: str
    version: str
    engine_version: str
    settings: _containers.ScalarMap[str, str]
    device: str
    worker_id: str
    pool: str
    request_form: int
    kv_block_size: int
    kv_events: bool
    tasks: _containers.RepeatedScalarFieldContainer[str]
    pooling_endpoints: _containers.RepeatedScalarFieldContainer[str]
    tokenizer_digest: str
    takes_router_ids: bool
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., engine: _Optional[str] = ..., version: _Optional[str] = ..., engine_version: _Optional[str] = ..., settings: _Optional[_Mapping[str, str]] = ..., device: _Optional[str] = ..., worker_id: _Optional[str] = ..., pool: _Optional[str] = ..., request_form: _Optional[int] = ..., kv_block_size: _Optional[int] = ..., kv_events: _Optional[bool] = ..., tasks: _Optional[_Iterable[str]] = ..., pooling_endpoints: _Optional[_Iterable[str]] = ..., tokenizer_digest: _Optional[str] = ..., takes_router_ids: _Optional[bool] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate", "output_tokens_per_s", "in_flight", "draining", "adapters", "max_adapters", "health", "prefix_cache_queries", "prefix_cache_hits", "interactive_ttft_p90_ms", "interactive_itl_p90_ms", "interactive_ttft_p90_floor_ms", "interactive_itl_p90_floor_ms", "interactive_ttft_baseline_ms", "interactive_itl_baseline_ms", "engine_silent_s")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_TTFT_P90_MS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_ITL_P90_MS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_TTFT_P90_FLOOR_MS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_ITL_P90_FLOOR_MS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_TTFT_BASELINE_MS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_ITL_BASELINE_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SILENT_S_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    output_tokens_per_s: float
    in_flight: int
    draining: bool
    adapters: _containers.RepeatedScalarFieldContainer[str]
    max_adapters: int
    health: str
    prefix_cache_queries: int
    prefix_cache_hits: int
    interactive_ttft_p90_ms: float
    interactive_itl_p90_ms: float
    interactive_ttft_p90_floor_ms: float
    interactive_itl_p90_floor_ms: float
    interactive_ttft_baseline_ms: float
    interactive_itl_baseline_ms: float
    engine_silent_s: float
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., prefix_cache_hit_rate: _Optional[float] = ..., output_tokens_per_s: _Optional[float] = ..., in_flight: _Optional[int] = ..., draining: _Optional[bool] = ..., adapters: _Optional[_Iterable[str]] = ..., max_adapters: _Optional[int] = ..., health: _Optional[str] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., interactive_ttft_p90_ms: _Optional[float] = ..., interactive_itl_p90_ms: _Optional[float] = ..., interactive_ttft_p90_floor_ms: _Optional[float] = ..., interactive_itl_p90_floor_ms: _Optional[float] = ..., interactive_ttft_baseline_ms: _Optional[float] = ..., interactive_itl_baseline_ms: _Optional[float] = ..., engine_silent_s: _Optional[float] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "path", "rank", "base_model")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    rank: int
    base_model: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., rank: _Optional[int] = ..., base_model: _Optional[str] = ...) -> None: ...

class AdapterList(_message.Message):
    __slots__ = ("adapters", "max_adapters")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    max_adapters: int
    def __init__(self, adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ..., max_adapters: _Optional[int] = ...) -> None: ...

class KvEventsRequest(_message.Message):
    __slots__ = ("after_sequence", "epoch")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    epoch: str
    def __init__(self, after_sequence: _Optional[int] = ..., epoch: _Optional[str] = ...) -> None: ...

class KvBlocksStored(_message.Message):
    __slots__ = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_name", "medium", "cache_salt")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent_block_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    lora_name: str
    medium: str
    cache_salt: str
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., parent_block_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., lora_name: _Optional[str] = ..., medium: _Optional[str] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class KvBlocksRemoved(_message.Message):
    __slots__ = ("block_hashes", "medium")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    medium: str
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., medium: _Optional[str] = ...) -> None: ...

class KvAllCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: KvBlocksStored
    removed: KvBlocksRemoved
    cleared: KvAllCleared
    def __init__(self, stored: _Optional[_Union[KvBlocksStored, _Mapping]] = ..., removed: _Optional[_Union[KvBlocksRemoved, _Mapping]] = ..., cleared: _Optional[_Union[KvAllCleared, _Mapping]] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("epoch", "sequence", "ts", "snapshot", "block_size", "events")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    sequence: int
    ts: float
    snapshot: bool
    block_size: int
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, epoch: _Optional[str] = ..., sequence: _Optional[int] = ..., ts: _Optional[float] = ..., snapshot: _Optional[bool] = ..., block_size: _Optional[int] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class TokenizerFilesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("name", "data", "last")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    name: str
    data: bytes
    last: bool
    def __init__(self, name: _Optional[str] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class PoolRequest(_message.Message):
    __slots__ = ("request_id", "endpoint", "body_json", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    endpoint: str
    body_json: bytes
    priority: int
    def __init__(self, request_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., body_json: _Optional[bytes] = ..., priority: _Optional[int] = ...) -> None: ...

class PoolResponse(_message.Message):
    __slots__ = ("body_json", "prompt_tokens")
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    body_json: bytes
    prompt_tokens: int
    def __init__(self, body_json: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class IntrospectRequest(_message.Message):
    __slots__ = ("endpoint", "body")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    body: bytes
    def __init__(self, endpoint: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class IntrospectResponse(_message.Message):
    __slots__ = ("body",)
    BODY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    def __init__(self, body: _Optional[bytes] = ...) -> None: ...
