"""trainfit: make LLM training fit any machine."""

__version__ = "0.1.0"
