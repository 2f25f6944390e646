"""Sparse policy deltas: bitwise exactness over dtypes, shapes and special values, and every refusal."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollnet.node.delta import PolicyStore, apply, content_root, encode, encode_stream
from rollnet.node.delta.bitcast import bits_of
from rollnet.node.delta.container import Delta, read_records
from rollnet.node.delta.section import encode_section, split_section
from rollnet.node.errors import BadSignature, CorruptDelta, DeltaError, WrongBase
from rollnet.node.keys import dev_account
from rollnet.node.varint import write_varint

TRAINER = dev_account(0)
STRANGER = dev_account(9)
SHIPPED = [torch.bfloat16, torch.float16, torch.float32]
# Bit patterns every float codec must survive: +-0, +-inf, quiet and signalling NaNs with payloads, subnormals.
SPECIAL = {
    torch.bfloat16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFF81, 0x7F81, 0x0001, 0x807F, 0x7F7F],
    torch.float16: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFC01, 0x7C01, 0x0001, 0x83FF, 0x7BFF],
    torch.float32: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFBFFFFF, 0x00000001, 0x807FFFFF],
}


def identical(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(bits_of(a[k]), bits_of(b[k]))
        for k in a
    )


def snapshot(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tensors.items()}


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = draw(st.sampled_from(SHIPPED))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
    n = int(np.prod(shape)) if shape else 1
    width = torch.finfo(dtype).bits
    patterns = st.integers(0, 2**width - 1) | st.sampled_from(SPECIAL[dtype])
    base_bits = draw(st.lists(patterns, min_size=n, max_size=n))
    target_bits = list(base_bits)
    for index in draw(st.lists(st.integers(0, n - 1), max_size=n)):
        kind = draw(st.sampled_from(["ulp", "special", "any"]))
        if kind == "ulp":
            target_bits[index] = (target_bits[index] + draw(st.sampled_from([1, -1, 2, -3]))) % 2**width
        elif kind == "special":
            target_bits[index] = draw(st.sampled_from(SPECIAL[dtype]))
        else:
            target_bits[index] = draw(st.integers(0, 2**width - 1))

    def build(values: list[int]) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype)
        bits_of(tensor)[:] = np.array(values, dtype=np.uint64).astype(bits_of(tensor).dtype)
        return tensor

    return build(base_bits), build(target_bits)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(tensor_pairs(), min_size=1, max_size=4), block=st.sampled_from([1, 3, 8, 1 << 20]))
def test_apply_reproduces_the_target_bit_for_bit(pairs: list, block: int) -> None:
    base = {f"layer.{i}": b for i, (b, _) in enumerate(pairs)}
    target = {f"layer.{i}": t for i, (_, t) in enumerate(pairs)}
    delta = encode(base, target, base_version=0, version=1, signer=TRAINER, block_elements=block)
    held = snapshot(base)
    applied = apply(held, delta.to_bytes(), trainer=TRAINER.address, base_version=0, base_root=content_root(base))
    assert identical(held, target)
    assert applied.root == content_root(target)


def test_new_removed_retyped_and_reshaped_tensors() -> None:
    base = {"keep": torch.randn(10), "gone": torch.ones(3), "retype": torch.zeros(4), "reshape": torch.ones(2, 3)}
    target = {"keep": base["keep"].clone(), "new": torch.arange(5), "retype": torch.zeros(4, dtype=torch.bfloat16),
              "reshape": torch.ones(3, 2)}
    target["keep"][3] = 7.0
    held = snapshot(base)
    apply(held, encode(base, target, base_version=4, version=5, signer=TRAINER), trainer=TRAINER.address,
          base_version=4, base_root=content_root(base))
    assert identical(held, target)


def test_tied_tensors_change_once_and_stay_tied() -> None:
    embedding = torch.randn(16, 4).to(torch.bfloat16)
    base = {"embed.weight": embedding, "lm_head.weight": embedding}
    new_embedding = embedding.clone()
    bits_of(new_embedding)[[1, 5, 9]] += 1
    target = {"embed.weight": new_embedding, "lm_head.weight": new_embedding}
    held = {"embed.weight": embedding.clone()}
    held["lm_head.weight"] = held["embed.weight"]
    applied = apply(held, encode(base, target, base_version=0, version=1, signer=TRAINER), trainer=TRAINER.address,
                    base_version=0, base_root=content_root(base))
    assert applied.changed_elements == 3
    assert identical(held, target) and held["embed.weight"].data_ptr() == held["lm_head.weight"].data_ptr()


@pytest.fixture
def versions() -> tuple[dict, dict, Delta]:
    generator = torch.Generator().manual_seed(0)
    base = {"a": torch.randn(64, 32, generator=generator).to(torch.bfloat16), "b": torch.randn(32, generator=generator)}
    target = snapshot(base)
    bits_of(target["a"])[::37] += 1
    bits_of(target["b"])[::5] -= 2
    return base, target, encode(base, target, base_version=7, version=8, signer=TRAINER)


def refuses(base: dict, data: bytes | Delta, error: type[DeltaError], match: str, **overrides: object) -> None:
    held = snapshot(base)
    kwargs = {"trainer": TRAINER.address, "base_version": 7, "base_root": content_root(base), **overrides}
    with pytest.raises(error, match=match):
        apply(held, data, **kwargs)
    assert identical(held, base), "a refused delta must leave the weights exactly as they were"


def test_refuses_the_wrong_base_version_or_root(versions: tuple) -> None:
    base, _, delta = versions
    refuses(base, delta, WrongBase, r"applies to version 7 .* held are version 6", base_version=6)
    refuses(base, delta, WrongBase, r"applies to version 7", base_root=b"\x01" * 32)


def test_refuses_weights_that_are_not_the_base_even_under_the_right_root(versions: tuple) -> None:
    base, _, delta = versions
    drifted = snapshot(base)
    bits_of(drifted["b"])[3] ^= 1  # a holder whose copy silently differs from what it believes it holds
    held = snapshot(drifted)
    with pytest.raises(WrongBase, match="does not match the signed target"):
        apply(held, delta, trainer=TRAINER.address, base_version=7, base_root=content_root(base))
    assert identical(held, drifted)


def test_refuses_a_bad_signature_or_another_signer(versions: tuple) -> None:
    base, target, delta = versions
    refuses(base, delta, BadSignature, r"signed by .*, not the trainer", trainer=STRANGER.address)
    forged = encode(base, target, base_version=7, version=8, signer=STRANGER)
    refuses(base, forged, BadSignature, r"not the trainer")
    raw = bytearray(delta.to_bytes())
    trailer_length = 84 + 32 * len(delta.sections) + 65
    raw[-trailer_length + 60] ^= 0xFF  # inside the signed target root: the signature no longer matches
    refuses(base, bytes(raw), BadSignature, r"not the trainer|malformed signature")
    raw = bytearray(delta.to_bytes())
    raw[-1] ^= 0xFF  # the signature's recovery byte
    refuses(base, bytes(raw), BadSignature, r"not the trainer|malformed signature")


@pytest.mark.parametrize("where", ["section", "truncated", "magic", "garbage", "extra"])
def test_refuses_corrupt_bytes(versions: tuple, where: str) -> None:
    base, _, delta = versions
    raw = bytearray(delta.to_bytes())
    if where == "section":
        raw[40] ^= 0x10
    elif where == "truncated":
        raw = raw[: len(raw) // 2]
    elif where == "magic":
        raw[0:8] = b"NOTDELTA"
    elif where == "garbage":
        raw = bytearray(random.Random(1).randbytes(500))
    else:
        raw += b"\x00" * 9
    refuses(base, bytes(raw), CorruptDelta, r"corrupt delta")


def test_a_signed_but_malformed_payload_is_refused_and_rolled_back(versions: tuple) -> None:
    """A buggy or malicious trainer signs a section whose payload lies: the target hashes catch it."""
    base, target, delta = versions
    sections = list(delta.sections)
    _, payload = split_section(sections[1])
    tampered_target = snapshot(target)
    bits_of(tampered_target["b"])[0] += 5
    promised = split_section(encode_section("b", base["b"], tampered_target["b"]))[0].pack()
    sections[1] = write_varint(len(promised)) + promised + payload  # the old payload under a header promising more
    from rollnet.node.delta.container import Trailer, section_hash

    trailer = Trailer(7, 8, content_root(base), content_root({"a": target["a"], "b": tampered_target["b"]}),
                      [section_hash(s) for s in sections])
    trailer.sign(TRAINER)
    lying = Delta(sections, trailer)
    refuses(base, lying.to_bytes(), WrongBase, r"does not match the signed target")


def test_streaming_sends_first_sections_before_the_last_tensor_is_read() -> None:
    events: list[str] = []

    class Recording(Mapping[str, torch.Tensor]):
        def __init__(self, tensors: dict[str, torch.Tensor], label: str):
            self.tensors, self.label = tensors, label

        def __getitem__(self, name: str) -> torch.Tensor:
            events.append(f"read {self.label} {name}")
            return self.tensors[name]

        def __iter__(self) -> Iterator[str]:
            return iter(self.tensors)

        def __len__(self) -> int:
            return len(self.tensors)

    base = {f"t{i}": torch.randn(100) for i in range(5)}
    target = snapshot(base)
    for tensor in target.values():
        tensor[0] += 1
    chunks = []
    for chunk in encode_stream(Recording(base, "base"), Recording(target, "target"), base_version=0, version=1,
                               signer=TRAINER, base_root=content_root(base)):
        events.append("sent")
        chunks.append(chunk)
    first_sent, last_read = events.index("sent", 1), max(i for i, e in enumerate(events) if e.startswith("read"))
    assert first_sent < last_read
    pieces = b"".join(chunks)
    cut = [pieces[i : i + 7] for i in range(0, len(pieces), 7)]  # arrives in arbitrary network-sized pieces
    held = snapshot(base)
    apply(held, read_records(cut), trainer=TRAINER.address, base_version=0, base_root=content_root(base))
    assert identical(held, target)


def test_compression_at_one_percent_beats_naive_sparse_by_far() -> None:
    generator = torch.Generator().manual_seed(1)
    base = {"w": (torch.randn(2_000_000, generator=generator) * 0.02).to(torch.bfloat16)}
    target = snapshot(base)
    rng = np.random.default_rng(0)
    positions = rng.choice(2_000_000, 20_000, replace=False)
    bits_of(target["w"])[positions] += rng.choice(np.array([1, 65535], dtype=np.uint16), 20_000)
    size = len(encode(base, target, base_version=0, version=1, signer=TRAINER).to_bytes())
    full, naive = 2 * 2_000_000, 6 * 20_000
    assert full / size > 150 and naive / size > 4.5


def test_policy_store_chains_anchors_prunes_and_serves_late_joiners(tmp_path: Path) -> None:
    trainer_store = PolicyStore(tmp_path / "trainer", trainer=TRAINER.address, anchor_every=3, keep_anchors=2)
    weights = {"w": torch.randn(500).to(torch.bfloat16)}
    history = {}
    for version in range(10):
        weights = snapshot(weights)
        bits_of(weights["w"])[version::40] += 1
        history[version] = snapshot(weights)
        published = trainer_store.publish(version, weights, TRAINER, previous=history.get(version - 1))
        assert published.root == content_root(weights)
        assert published.anchored == (version % 3 == 0)
    assert trainer_store.anchors == [6, 9] and sorted(trainer_store.deltas) == [7, 8, 9]
    assert not trainer_store.anchor_path(3).exists()
    assert identical(trainer_store.materialize(8), history[8])
    with pytest.raises(DeltaError, match="no anchor at or below version 5"):
        trainer_store.materialize(5)

    late = PolicyStore(tmp_path / "late", trainer=TRAINER.address)
    late.add_anchor(6, trainer_store.materialize(6), root=content_root(history[6]))
    with pytest.raises(DeltaError, match="extends version 8, which this store lacks"):
        late.add_delta(trainer_store.delta_path(9).read_bytes())
    for version in (7, 8, 9):
        late.add_delta(trainer_store.delta_path(version).read_bytes())
    held = late.materialize(6)
    assert late.advance(held, 6, 9) == content_root(history[9]) and identical(held, history[9])
    reopened = PolicyStore(tmp_path / "late", trainer=TRAINER.address)
    assert identical(reopened.materialize(9), history[9])

    suspicious = PolicyStore(tmp_path / "suspicious", trainer=STRANGER.address)
    suspicious.add_anchor(8, history[8])
    with pytest.raises(BadSignature):
        suspicious.add_delta(trainer_store.delta_path(9).read_bytes())
