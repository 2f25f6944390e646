"""The embedded model's pinned identity, importable without torch: its name, the task it is built for by
default, and the bf16 content root of its reference build (shipped in `model/reference/`, and rebuilt
bit for bit from the recipe under the builder's pinned arithmetic).

Invariant: `EMBEDDED_ROOT` and `EMBEDDED_FILES_HASH` are the weights' root and the config-and-tokenizer
identity (`model.identity`) that `build_default_model` produces for the default build recipe (the test
`test_the_default_build_has_the_pinned_root` holds the reference build to both; its warm-up calls no MKL
vector math, whose last bits differ by CPU: see `model.warmup_arithmetic` and BENCHMARKS.md); a job spec
naming the embedded model for its default task without a model_root (and model_files_hash) pins these on
chain. `PRESETS` does the same for
the real checkpoints rollnet converts itself (`model.loading.PRESET_BUILDERS`), whatever the task: a spec
naming one without a model_root pins its root and files hash (the test `test_the_smollm2_preset_has_the_pinned_identity`
converts it and holds it to both).
"""

from dataclasses import dataclass

EMBEDDED_MODEL = "embedded"
EMBEDDED_TASK = "addition-2digit"
EMBEDDED_ROOT = "11588c1ad16c05bbdfdf1b1eb7814745b8af26d21a91b131996d135518984973"
# node.model.identity.model_files_hash of that build: its config, tokenizer and EOS set.
EMBEDDED_FILES_HASH = "f736b47c7ca5d074916781a895a24bde8e40bee59650507a76337d966e09c7e7"


@dataclass(frozen=True)
class PinnedModel:
    """A model rollnet builds or converts itself, and the identity that build has on every machine."""

    name: str
    root: str  # bf16 content root of its weights (hex, no 0x)
    files_hash: str  # model_files_hash of its config and tokenizer (hex, no 0x)
    description: str
    completion_tokens: int  # the completion limit a local run uses when no recipe fixes one (room to reason)


SMOLLM2 = "smollm2"
PRESETS = {
    SMOLLM2: PinnedModel(
        SMOLLM2, root="35ccc093ab1cf7e7e5c4ff4f27c49b8b119799ac593b4b975bc65a1d1d597be3",
        files_hash="ddbcfd55d9ff6a7b559636519657dbf0307c47cc5edc2bf80ebaeeae9ccd9c14",
        description="SmolLM2-135M-Instruct, the Q4_1 GGUF of the `real` extra dequantised to fp32",
        completion_tokens=128),
}
