"""Model code: the pretrained-model registry and its fetch (a GGUF shipped in a package on the index → an HF
folder), GGUF import, chat-template rendering and the framing measured from it, the tiny model and its tokenizer
builders. Importing the package imports none of them (transformers, torch and jinja2 load only when used)."""
