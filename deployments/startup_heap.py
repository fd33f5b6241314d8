"""`freeze_startup_heap`: takes what the engine actor's process loaded at start-up out of the garbage
collector's full passes.

An engine process holds hundreds of thousands of objects from its start (Ray, Serve,
torch, the tokenizer, the model's modules) that live as long as it does. Python's full
collection walks every one of them whenever enough new objects have survived the younger
generations, and a streaming server's requests (tasks, buffers, parser state) survive long
enough to trigger one every few thousand tokens: 0.1 s each with torch imported, about 6 µs
per streamed frame in `bench.egress_floor`'s bare server. Frozen objects are skipped, so a full
collection walks only what was made since (vLLM's API server freezes its heap the same way).

Serve does this for its replicas (the ingress, the detokenizer pool) when their start ends
(``RAY_SERVE_FREEZE_GC_ON_STARTUP``, on by default in Ray 2.60); the engine actor is a plain Ray
actor, so it calls this once its model is loaded.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what start-up left as garbage, then freeze the rest (call once loading is done)."""
    gc.collect()
    gc.freeze()
