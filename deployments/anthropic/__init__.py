"""Anthropic's Messages API on the wire: request bodies (translated into chats), the message and
its stream written from the one event model (`deployments.openai.output_events`), and Anthropic's
error shape. No Ray, no torch, no engine, as `deployments.openai`."""
