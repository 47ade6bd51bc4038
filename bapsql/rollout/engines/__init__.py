"""Model engines behind one protocol (`base.Engine`): vLLM, HF transformers and OpenAI-compatible HTTP.

Import the implementations from their modules (they pull torch / vllm / httpx lazily); `factory.make_engine`
builds one from an `EngineConfig`.
"""
