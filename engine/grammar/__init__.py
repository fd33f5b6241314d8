"""Structured outputs in the engine, on llguidance: constraints turned into grammars (`spec`),
compiled off the step loop and cached (`compiler`), and the per-step matcher handshake (`masks`)."""
