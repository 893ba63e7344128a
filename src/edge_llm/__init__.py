"""edge-llm: on-device LLM streaming with an enforced token backpressure contract."""

__version__ = "0.1.0"
