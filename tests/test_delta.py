"""Sparse policy deltas: bitwise exactness over dtypes, shapes and special values, and every refusal."""

from __future__ import annotations

import random
import resource
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollnet.node.delta import PolicyStore, apply, codec, content_root, encode, encode_stream, entropy, tensor_hash
from rollnet.node.delta.bitcast import bits_of
from rollnet.node.delta.checkpoint import root_of_hashes
from rollnet.node.delta.container import Delta, Trailer, read_records, section_hash
from rollnet.node.delta.section import Kind, SectionHeader, encode_section, split_section
from rollnet.node.errors import BadSignature, ConfigError, CorruptDelta, DeltaError, UnsupportedDelta, WrongBase
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
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and np.array_equal(bits_of(a[k].contiguous()), bits_of(b[k].contiguous()))
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


# ------------------------------------------------- issue 14: every refusal leaves the weights as they were


def section_bytes(header: SectionHeader, payload: bytes) -> bytes:
    packed = header.pack()
    return write_varint(len(packed)) + packed + payload


def signed(sections: list[bytes], base: Mapping[str, torch.Tensor], base_version: int = 7,
           target_root: bytes | None = None) -> bytes:
    """The trainer's signature over any sections (a buggy or malicious trainer), with the target root they add up
    to unless `target_root` is given."""
    if target_root is None:
        hashes = {}
        for section in sections:
            header, _ = split_section(section)
            if header.kind is not Kind.REMOVED:
                hashes[header.name] = header.target_hash
        target_root = root_of_hashes(hashes)
    trailer = Trailer(base_version, base_version + 1, content_root(base), target_root,
                      [section_hash(s) for s in sections])
    trailer.sign(TRAINER)
    return Delta(sections, trailer).to_bytes()


def unchanged(base: Mapping[str, torch.Tensor]) -> list[bytes]:
    """Sections that keep every base tensor as it is (so a delta is complete around the section under test)."""
    return [encode_section(name, tensor, tensor) for name, tensor in sorted(base.items())]


def zstd_of_zeros(size: int, *, sized: bool = False) -> bytes:
    """zstd of `size` zero bytes, compressed a MiB at a time (a bomb: a few KB that expand to `size`)."""
    chunk = bytes(min(size, 1 << 20))
    compressor = zstandard.ZstdCompressor(write_content_size=sized).compressobj(size=size if sized else -1)
    out = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join([*out, compressor.flush()])


def full_header(name: str, dtype: torch.dtype, shape: tuple[int, ...], target_hash: bytes = b"\x01" * 32,
                ) -> SectionHeader:
    return SectionHeader(Kind.FULL, name, dtype, shape, target_hash, 0, 0)


def strided_versions() -> tuple[dict, dict]:
    """A base whose "b" is a transposed view and "c" a column slice (neither contiguous), and a target."""
    generator = torch.Generator().manual_seed(3)
    base = {"a": torch.randn(6, 5, generator=generator), "b": torch.randn(5, 4, generator=generator).t(),
            "c": torch.randn(4, 9, generator=generator)[:, 2:7]}
    target = {name: tensor.contiguous().clone() for name, tensor in base.items()}
    for tensor in target.values():
        bits_of(tensor)[::3] += 1
    return base, target


def test_a_non_contiguous_base_tensor_is_updated_in_place_exactly() -> None:
    base, target = strided_versions()
    assert not base["b"].is_contiguous() and not base["c"].is_contiguous()
    held = {name: tensor.clone() for name, tensor in base.items()}
    held["c"] = torch.randn(4, 9)[:, 2:7].copy_(base["c"])  # clone() would make the slice contiguous
    views = {name: (tensor, tensor.stride()) for name, tensor in held.items()}
    applied = apply(held, encode(base, target, base_version=7, version=8, signer=TRAINER), trainer=TRAINER.address,
                    base_version=7, base_root=content_root(base))
    assert identical(held, target) and applied.root == content_root(target)
    assert all(held[name] is view and held[name].stride() == stride for name, (view, stride) in views.items())


def test_a_refusal_after_a_non_contiguous_tensor_leaves_every_tensor_untouched() -> None:
    base, target = strided_versions()
    delta = encode(base, target, base_version=7, version=8, signer=TRAINER)
    drifted = {name: tensor.clone() for name, tensor in base.items()}
    drifted["c"] = torch.randn(4, 9)[:, 2:7].copy_(base["c"])
    drifted["c"][0, 0] += 1  # still a strided view, one element off the delta's base
    before = snapshot(drifted)
    with pytest.raises(WrongBase, match="'c' does not match the signed target"):
        apply(drifted, delta, trainer=TRAINER.address, base_version=7, base_root=content_root(base))
    assert identical(drifted, before)


def test_a_base_tensor_whose_elements_overlap_is_refused_before_any_write() -> None:
    row = torch.randn(1, 4)
    base = {"a": torch.randn(8), "b": row.expand(3, 4)}  # "b": one row seen three times
    target = {"a": base["a"].clone(), "b": base["b"].contiguous().clone()}
    target["a"][0] += 1
    target["b"][1, 1] += 1
    held = {"a": base["a"].clone(), "b": row.clone().expand(3, 4)}  # clone() would give "b" rows of its own
    with pytest.raises(UnsupportedDelta, match=r"tensor 'b' has elements that overlap in memory"):
        apply(held, encode(base, target, base_version=7, version=8, signer=TRAINER), trainer=TRAINER.address,
              base_version=7, base_root=content_root(base))
    assert identical(held, base) and held["b"].stride() == (0, 1)


def test_a_mapping_that_fails_midway_gets_every_tensor_back() -> None:
    class Engine(dict):
        """Weights in a running engine: tensors may change in place but not disappear (as EngineWeights)."""

        def __delitem__(self, name: str) -> None:
            raise ConfigError(f"a delta may not remove tensor {name!r} from a running engine")

        def pop(self, name: str, *default: object) -> torch.Tensor:
            del self[name]
            raise AssertionError("unreachable")

    base = {"a": torch.randn(16), "z": torch.randn(3)}
    target = {"a": base["a"].clone()}
    target["a"][::4] += 1
    held = Engine(snapshot(base))
    with pytest.raises(ConfigError, match="may not remove tensor 'z'"):
        apply(held, encode(base, target, base_version=7, version=8, signer=TRAINER), trainer=TRAINER.address,
              base_version=7, base_root=content_root(base))
    assert identical(held, base)


def test_a_sparse_section_pointing_before_its_block_is_refused_and_rolled_back() -> None:
    """Gaps are unsigned: one of 2^64-2 read as a signed offset pointed 2 elements back from the block's end, and
    the undo record then restored a different element. Both blocks must stay inside their own range."""
    base = {"w": torch.arange(16, dtype=torch.float32)}
    block = 8
    payload = entropy.encode_blocks([
        [np.array([0], np.uint64), np.array([2], np.uint64)],
        [np.array([2**64 - 2], np.uint64), np.array([2], np.uint64)],
    ], 2)
    header = SectionHeader(Kind.SPARSE, "w", torch.float32, (16,), b"\x02" * 32, 2, block)
    refuses(base, signed([section_bytes(header, payload)], base), CorruptDelta, r"'w' points outside")


def test_a_full_section_expands_no_further_than_its_declared_size() -> None:
    """A signed FULL section of 16 KB that expands to 512 MiB: refused after reading its declared 16 bytes."""
    base = {"a": torch.randn(8)}
    bomb = zstd_of_zeros(512 << 20)
    assert len(bomb) < 64 << 10
    delta = signed([*unchanged(base), section_bytes(full_header("b", torch.float32, (4,)), bomb)], base)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    tracemalloc.start()
    try:
        refuses(base, delta, CorruptDelta, r"'b'.* more than the 16 bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"refusing the bomb allocated {peak >> 20} MiB"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - rss_before < 128 << 20


def test_a_full_section_whose_frame_declares_a_different_size_is_refused_unread() -> None:
    base = {"a": torch.randn(8)}
    sized = zstd_of_zeros(512 << 20, sized=True)  # the reported bomb: it expanded before its size was checked
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    tracemalloc.start()
    try:
        refuses(base, signed([*unchanged(base), section_bytes(full_header("b", torch.float32, (4,)), sized)], base),
                CorruptDelta, r"'b'.* 536870912 bytes, its header 16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"refusing the bomb allocated {peak >> 20} MiB"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - rss_before < 128 << 20


@pytest.mark.parametrize("shape", [(2**40,), (2**27,), (2**31, 2**31), (2**62, 0)])
def test_a_full_section_declaring_a_huge_tensor_is_refused_before_allocating(shape: tuple[int, ...]) -> None:
    base = {"a": torch.randn(8)}
    huge = section_bytes(full_header("huge", torch.float32, shape), zstandard.compress(b""))
    delta = signed([*unchanged(base), huge], base)
    refuses(base, delta, UnsupportedDelta, r"'huge' declares .* more than")


def test_new_tensors_together_may_not_exceed_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "ADDED_BYTES_FLOOR", 64 << 10)
    base = {"a": torch.randn(8)}
    zeros = torch.zeros(8 << 10)  # 32 KiB each: two fit in 64 KiB, three do not
    (same,) = unchanged(base)
    new = [section_bytes(full_header(f"new{i}", torch.float32, (8 << 10,), tensor_hash(f"new{i}", zeros)),
                         zstandard.compress(bytes(32 << 10))) for i in range(3)]
    refuses(base, signed([same, *new], base), UnsupportedDelta, r"'new2' declares .* more than the 65536")
    held = snapshot(base)
    apply(held, signed([same, *new[:2]], base), trainer=TRAINER.address, base_version=7,
          base_root=content_root(base))
    assert identical(held, {**base, "new0": zeros, "new1": zeros})


@pytest.mark.parametrize("claim", ["changes", "streams"])
def test_a_sparse_payload_claiming_more_than_the_tensor_is_refused_before_decoding(claim: str) -> None:
    base = {"w": torch.randn(64)}
    if claim == "changes":  # one block of 2^40 changes, all the same symbol: no rANS words needed at all
        histogram = write_varint(1) + write_varint(0) + write_varint(2**40)
        payload = write_varint(2) + histogram + histogram + write_varint(1) + write_varint(2**40)
    else:  # 2^16 streams: each would allocate a histogram
        payload = write_varint(2**16) + bytes(64 << 10)
    header = SectionHeader(Kind.SPARSE, "w", torch.float32, (64,), b"\x02" * 32, 3, 1 << 20)
    tracemalloc.start()
    try:
        refuses(base, signed([section_bytes(header, payload)], base), CorruptDelta, r"corrupt delta: .*'w'")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.float8_e4m3fn])
def test_unsupported_dtypes_are_refused_when_encoding(dtype: torch.dtype) -> None:
    odd = torch.zeros(4, dtype=dtype)
    plain = {"a": torch.randn(4)}
    cases = [({**plain, "x": odd}, {**plain, "x": odd}, None),  # changed or not: its hash cannot be taken
             (plain, {**plain, "x": odd}, content_root(plain)),  # a new tensor of that dtype
             ({**plain, "x": odd}, plain, b"\x00" * 32)]  # a removed one
    for base, target, root in cases:
        with pytest.raises(UnsupportedDelta, match=rf"tensor 'x' has dtype {dtype}, which .* bfloat16"):
            encode(base, target, base_version=7, version=8, signer=TRAINER, base_root=root)
    with pytest.raises(UnsupportedDelta, match="tensor 'x' has dtype"):
        content_root({"x": odd})


@pytest.mark.parametrize("code", [0, 11, 255])
def test_a_section_naming_an_unknown_dtype_is_refused_untouched(versions: tuple, code: int) -> None:
    base, _, delta = versions
    header, payload = split_section(delta.sections[1])
    packed = bytearray(header.pack())
    packed[2 + len(header.name)] = code  # kind, name length, name, then the dtype code
    sections = [delta.sections[0], write_varint(len(packed)) + bytes(packed) + payload]
    refuses(base, signed(sections, base, target_root=delta.trailer.target_root), UnsupportedDelta,
            rf"section 'b' names dtype code {code}, which")


def test_repeated_or_unordered_sections_are_refused(versions: tuple) -> None:
    base, target, delta = versions
    refuses(base, signed(delta.sections[::-1], base), CorruptDelta, r"not in name order.*'b'.*'a'")
    new = torch.ones(3)
    twice = [section_bytes(full_header("a", torch.float32, (3,), tensor_hash("a", new)),
                           zstandard.compress(bits_of(new).tobytes()))] * 2
    drifted = snapshot(base)
    bits_of(drifted["b"])[0] ^= 1
    held = snapshot(drifted)
    with pytest.raises(CorruptDelta, match=r"two sections for tensor 'a'"):
        apply(held, signed([*twice, delta.sections[1]], base), trainer=TRAINER.address, base_version=7,
              base_root=content_root(base))
    assert identical(held, drifted)


def test_a_version_that_cannot_be_encoded_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "store", trainer=TRAINER.address)
    weights = {"a": torch.randn(8), "z": torch.randn(2)}
    store.publish(0, weights, TRAINER)
    with pytest.raises(UnsupportedDelta, match=r"tensor 'z' has dtype torch.uint16"):
        store.publish(1, {"a": weights["a"] + 1, "z": torch.zeros(2, dtype=torch.uint16)}, TRAINER)
    assert store.deltas == {} and store.latest == 0 and not list((tmp_path / "store" / "deltas").iterdir())
    assert PolicyStore(tmp_path / "store", trainer=TRAINER.address).deltas == {}


def test_views_sharing_storage_change_together_or_not_at_all() -> None:
    """A weight held twice, as itself and as its transpose (one storage): a delta that changes both alike
    applies; one whose sections disagree about the shared memory is refused with both names untouched."""
    weight = torch.randn(4, 6)
    base = {"w": weight, "w.t": weight.t()}
    new = weight.clone()
    new[1, 2] += 1
    consistent = {"w": new, "w.t": new.t()}
    other = new.t().clone()
    other[0, 0] += 1
    for target, refused in ((consistent, False), ({"w": new, "w.t": other}, True)):
        held_weight = weight.clone()
        held = {"w": held_weight, "w.t": held_weight.t()}
        delta = encode(base, target, base_version=7, version=8, signer=TRAINER)
        if refused:
            with pytest.raises(WrongBase, match="shares memory with another tensor"):
                apply(held, delta, trainer=TRAINER.address, base_version=7, base_root=content_root(base))
            assert identical(held, base)
        else:
            apply(held, delta, trainer=TRAINER.address, base_version=7, base_root=content_root(base))
            assert identical(held, target)
        assert held["w.t"].data_ptr() == held_weight.data_ptr()  # still one storage
