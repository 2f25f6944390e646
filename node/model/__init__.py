"""The embedded default policy: a character tokenizer and a small Qwen2 built and warmed up locally.

Invariant: everything downstream loads a model with `from_pretrained(path)`, whether it is the embedded
default (built by `build_default_model` into a cache folder named by its recipe) or a real checkpoint.
"""
