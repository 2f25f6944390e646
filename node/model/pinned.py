"""The embedded model's pinned identity, importable without torch: its name, the task it is built for by
default, and the bf16 content root that build has on every x86-64 CPU with the pinned packages.

Invariant: `EMBEDDED_ROOT` is the root `build_default_model` produces for the default build recipe (the
test `test_the_default_build_has_the_pinned_root` holds it to that); a job spec naming the embedded model
for its default task without a model_root pins this root on chain.
"""

EMBEDDED_MODEL = "embedded"
EMBEDDED_TASK = "addition-2digit"
EMBEDDED_ROOT = "b6177bab7d5e59419a12ba62dad54a14438e6c2f2d5f53d2c49e9f288b5bcf87"
