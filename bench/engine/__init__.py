"""Running the model: loading a policy (and its frozen reference) and sampling rollouts with a KV cache."""
