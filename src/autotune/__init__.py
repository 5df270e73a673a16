"""autotune: find the fastest correct parallel layout for training an LLM with Megatron-core."""

__version__ = "0.1.0"
