"""What the benchmarks share, none of them a benchmark itself.

- `common`: the machine a run measured on, printed tables, JSON under ``bench/results/``;
- `load_client`: streaming load generators (aiohttp and an ordinary httpx client) on loopback;
- `serve_cluster`: a local Ray cluster with Serve (and free ports outside Ray's ranges), also used by tests;
- `process_cpu`: CPU seconds per kind of process of that cluster, read from ``/proc``;
- `synthetic_engine`: a model-free engine actor at a GPU's step rate;
- `stream_baseline`: the per-request-streaming reference app (Ray Serve LLM's way) of `bench.serve_load`;
- `serve_report`, `serve_plot`, `png_canvas`: `bench.serve_load`'s tables and plot (a PNG written with zlib);
- `kernel_reads`, `sampler_passes`: passes of the sampler's Triton kernel, counted under the interpreter;
- `sentencepiece_like`: SentencePiece-style tokenizers for `bench.detok`;
- `hf_export`, `llama_cpp_build`, `vllm_cpu_build`: the peers' model folder and builds (`bench.peers`, `bench.egress_peers`).
"""
