"""Token generation: prompts, samplers, the KV-cache adapter, the decode loop, engines."""
