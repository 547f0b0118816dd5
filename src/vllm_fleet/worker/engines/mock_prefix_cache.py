"""The mock engine's prefix cache: a named stand-in for vLLM's, for control-plane tests and routing
benchmarks (--mock-kv-blocks N). Never a model of vLLM's memory, only of what a router sees.

As vLLM does, it caches a prompt in full blocks of `block_size` tokens, each block's hash chained
to its parent's (and salted by the LoRA adapter and the request's cache salt), counts the leading blocks already held as cached
tokens (at most all but the last prompt token, which vLLM always computes), and holds at most
`capacity` blocks, evicting the least recently used. Unlike vLLM it stores a prompt's blocks when
the request starts, not as prefill computes them, and frees nothing when a request ends.

Every change is published to the engine's KvRelay as vLLM's events would be: BlocksRemoved for
evicted blocks, then BlocksStored for the new chain, in one batch.
"""

from __future__ import annotations

import collections
import hashlib
from array import array

from vllm_fleet.protocol.kv_events import BlocksRemoved, BlocksStored, KvEvent
from vllm_fleet.worker.kv_relay import KvRelay


class MockPrefixCache:
    def __init__(self, capacity: int, block_size: int, relay: KvRelay | None = None) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.relay = relay
        self.queries = 0  # prompt tokens looked up, lifetime (vLLM's prefix-cache counters)
        self.hits = 0     # of which were cached
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # LRU first

    def block_hashes(self, token_ids: list[int], lora_name: str = "", cache_salt: str = "") -> list[bytes]:
        """The chained hashes of the prompt's full blocks."""
        hashes: list[bytes] = []
        parent = lora_name.encode() + (b"\0" + cache_salt.encode() if cache_salt else b"")
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            block = array("i", token_ids[start:start + self.block_size]).tobytes()
            parent = hashlib.blake2b(parent + block, digest_size=8).digest()
            hashes.append(parent)
        return hashes

    def admit(self, token_ids: list[int], lora_name: str = "", cache_salt: str = "") -> int:
        """Look the prompt up and store its blocks; the number of its tokens already cached."""
        hashes = self.block_hashes(token_ids, lora_name, cache_salt)[:self.capacity]
        cacheable = (len(token_ids) - 1) // self.block_size
        cached = 0
        while cached < min(cacheable, len(hashes)) and hashes[cached] in self._blocks:
            self._blocks.move_to_end(hashes[cached])
            cached += 1
        removed: list[bytes] = []
        new_from = None
        for index, block_hash in enumerate(hashes):
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
                continue
            if new_from is None:
                new_from = index
            if len(self._blocks) >= self.capacity:
                removed.append(self._blocks.popitem(last=False)[0])
            self._blocks[block_hash] = None
        self.queries += len(token_ids)
        self.hits += cached * self.block_size
        if self.relay is not None and new_from is not None:
            events: list[KvEvent] = [BlocksRemoved(tuple(removed))] if removed else []
            new = hashes[new_from:]
            events.append(BlocksStored(
                tuple(new), hashes[new_from - 1] if new_from else None,
                tuple(token_ids[new_from * self.block_size:len(hashes) * self.block_size]), self.block_size,
                lora_name, cache_salt="" if new_from else cache_salt))
            self.relay.publish(events)
        return cached * self.block_size
