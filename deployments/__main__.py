"""Until the Ray Serve application lands, say what `make run` will start."""

from engine.config import DEFAULT_MODEL, EngineConfig

config = EngineConfig()
print(
    "Spout's Ray Serve application (deployments:app) is not built yet.\n"
    f"`make run` will start `serve run deployments:app`: model {DEFAULT_MODEL}, "
    f"max_num_seqs {config.max_num_seqs}, max_model_len {config.max_model_len}, one engine actor per GPU "
    "(one CPU engine when there is none), an OpenAI ingress on http://127.0.0.1:8000/v1 and an autoscaling "
    "detokenizer pool.\nMeanwhile: .venv/bin/python -m engine.generate \"The capital of France is\""
)
