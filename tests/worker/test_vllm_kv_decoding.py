"""Reading vLLM's KV-cache event messages: this release's classes, older array-form events, and junk."""

from __future__ import annotations

import msgspec

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored
from vllm_fleet.worker.engines.vllm_kv_events import EventDecoder


def test_this_releases_batches_decode_with_vllms_classes():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    batch = KVEventBatch(ts=12.5, events=[
        BlockStored(block_hashes=[b"h1", 7], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
                    lora_id=None, medium="GPU", lora_name="ad"),
        BlockStored(block_hashes=[b"off"], parent_block_hash=b"h1", token_ids=[5, 6], block_size=2,
                    lora_id=None, medium="CPU", lora_name=None),
        BlockRemoved(block_hashes=[b"h1"], medium="GPU"),
        AllBlocksCleared(),
    ])
    decoder = EventDecoder()
    ts, events = decoder.decode(msgspec.msgpack.encode(batch))
    assert ts == 12.5
    assert events == [BlocksStored((b"h1", (7).to_bytes(8, "big")), None, (1, 2, 3, 4), 2, "ad", "GPU"),
                      BlocksRemoved((b"h1",), "GPU"), AllCleared()]
    assert decoder.other_media == 1 and decoder.malformed == 0


def test_cache_salt_is_read_from_a_prompts_first_block():
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    # vLLM's untagged extra keys: the LoRA name, (mm id, offset) pairs, the salt, embeds digests.
    batch = KVEventBatch(ts=1.0, events=[
        BlockStored(block_hashes=[b"a", b"b"], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
                    lora_id=None, medium="GPU", lora_name=None, extra_keys=[("tenant-a",), None]),
        BlockStored(block_hashes=[b"c"], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=1,
                    medium="GPU", lora_name="sql", extra_keys=[("sql", ("img", 0), "tenant-b", b"\x00")]),
        BlockStored(block_hashes=[b"d"], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=1,
                    medium="GPU", lora_name="sql", extra_keys=[("sql",)]),
        BlockStored(block_hashes=[b"e"], parent_block_hash=b"a", token_ids=[5, 6], block_size=2, lora_id=None,
                    medium="GPU", lora_name=None, extra_keys=None),
    ])
    _, events = EventDecoder().decode(msgspec.msgpack.encode(batch))
    assert [e.cache_salt for e in events] == ["tenant-a", "tenant-b", "", ""]


def test_array_form_events_of_older_releases_and_malformed_ones():
    payload = msgspec.msgpack.encode([3.0, [
        ["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, None, None],  # no lora_name field yet
        ["BlockStored", [13], None, [1, 2, 3], 2, None, None],       # tokens do not fill the block
        ["BlockRemoved", [11], None],
        ["SomethingNew", 1],
        ["AllBlocksCleared"],
    ], 0])
    decoder = EventDecoder()
    ts, events = decoder.decode(payload)
    as_bytes = lambda v: v.to_bytes(8, "big")  # noqa: E731
    assert ts == 3.0
    assert events == [BlocksStored((as_bytes(11), as_bytes(12)), as_bytes(10), (1, 2, 3, 4), 2),
                      BlocksRemoved((as_bytes(11),)), AllCleared()]
    assert decoder.malformed == 2
    assert decoder.decode(b"\xc1junk") == (None, []) and decoder.malformed == 3
