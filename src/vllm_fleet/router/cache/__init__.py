"""The cache wing: what cache-aware routing knows of each worker's KV cache, and of each prompt.

Modules:
    routing        CacheRouting: one per cache_aware router; keys each prompt, asks the index who
                   holds it, notes where it went; follows the pool as a PoolListener
    hook           CacheHook: cache routing as an attempt hook (router/attempt_hooks.py): keys the
                   prompt before the pick, holds its blocks per attempt, sends router ids; its
                   handle keeps the prompt's keys and ids while the request is in flight
    match          CacheMatch: what the index answered for one prompt (each worker's cached tokens,
                   the frontier, prefix reuse), the cache_aware policy's input beside the features
    index          CacheIndex: which worker holds which KV blocks, from the engines' events; bounded
    routed_holds   RoutedHolds and RoutedHold: the index's speculative entries, written at routing
    entries        WorkerEntries: one worker's entries in the index (held, speculative, pending)
    follower       KvFollower: follows one worker's KV-event stream into the index
    block_keys     our chained hash of a prompt's token ids per block (LoRA and cache salt in it)
    key_memo       KeyMemo: remembers the keys of prompts seen lately (a hit costs a hash)
    prefix_reuse   PrefixReuse: how often a model's new prompts come back (what a home is worth)
    tuning         CacheTuning: the internal constants (RouterConfig.cache_tuning, not on the CLI)

Imports run one way: hook -> routing -> (follower -> index -> (routed_holds, entries, block_keys)),
prefix_reuse, match; block_keys -> key_memo. The wing imports the pool's WorkerState and nothing of
the other wings but prompt/ (the prompt's ids). match imports nothing: the room's policies, pick,
stream and attempt_hooks read it.
"""
