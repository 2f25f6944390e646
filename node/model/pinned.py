"""The embedded model's pinned identity, importable without torch: its name, the task it is built for by
default, and the bf16 content root that build has on every x86-64 CPU with the pinned packages.

Invariant: `EMBEDDED_ROOT` and `EMBEDDED_FILES_HASH` are the weights' root and the config-and-tokenizer
identity (`model.identity`) that `build_default_model` produces for the default build recipe (the test
`test_the_default_build_has_the_pinned_root` holds it to both); a job spec naming the embedded model for its
default task without a model_root (and model_files_hash) pins these on chain.
"""

EMBEDDED_MODEL = "embedded"
EMBEDDED_TASK = "addition-2digit"
EMBEDDED_ROOT = "b6177bab7d5e59419a12ba62dad54a14438e6c2f2d5f53d2c49e9f288b5bcf87"
# node.model.identity.model_files_hash of that build: its config, tokenizer and EOS set.
EMBEDDED_FILES_HASH = "f736b47c7ca5d074916781a895a24bde8e40bee59650507a76337d966e09c7e7"
