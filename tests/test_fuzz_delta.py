"""Bounded fuzzing of delta parsing and application: corrupted, truncated, reordered and re-signed deltas.

Invariant: whatever bytes arrive, `apply` either raises a DeltaError and leaves the weights held bit for bit as
they were (ties and strided views included), or returns weights whose content root is the signed target root;
afterwards the honest delta still applies. Every case is seeded and bounded by iteration counts, never by
time, so a failure names the case that reproduces it. Deltas are signed, so most corruptions stop at the
signature or the section hashes; the re-signed cases sign the mutated sections with the trainer's test key
(as a buggy or compromised trainer would) so that they reach the section and entropy decoders.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import pytest
import torch
import zstandard
from rollnet.node.delta import apply, content_root, encode, entropy
from rollnet.node.delta.bitcast import bits_of
from rollnet.node.delta.checkpoint import root_of_hashes
from rollnet.node.delta.container import MAGIC, Delta, Trailer, section_hash
from rollnet.node.delta.section import Kind, SectionError, SectionHeader, split_section
from rollnet.node.errors import BadSignature, DeltaError
from rollnet.node.keys import dev_account
from rollnet.node.varint import read_varint, write_varint

TRAINER = dev_account(0)
BASE_VERSION = 3
BLOCK = 256  # small blocks: most sparse sections span several
TIED = ("0.weight", "4.weight")  # the embedding and the output head share one tensor
STRIDED = "1.weight"  # held as a column-major view
HUGE = [2**40, 2**62, 2**63 - 1, 2**64 - 1, 2**70 - 1]


def model_versions() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A tiny real model's bf16 state dict before and after two SGD steps, with a tied head, a BatchNorm's int64
    counter, a tensor removed, one retyped and one added (so the delta has sparse, full and removed sections)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(96, 24), torch.nn.Linear(24, 48), torch.nn.BatchNorm1d(48),
                                torch.nn.Linear(48, 24), torch.nn.Linear(24, 96, bias=False))
    model[4].weight = model[0].weight
    base = bf16_state(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        tokens = torch.randint(0, 96, (32,))
        loss = torch.nn.functional.cross_entropy(model(tokens), torch.randint(0, 96, (32,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    target = bf16_state(model)
    del target["3.bias"]
    target["2.running_var"] = target["2.running_var"].float()
    target["5.scale"] = torch.linspace(0.5, 1.5, 24)
    return base, target


def bf16_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    state = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in state.items()}
    state[TIED[1]] = state[TIED[0]]
    return state


def held_copy(base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    held = {name: tensor.clone() for name, tensor in base.items()}
    held[TIED[1]] = held[TIED[0]]
    held[STRIDED] = base[STRIDED].t().contiguous().t()
    assert not held[STRIDED].is_contiguous()
    return held


def identical(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and np.array_equal(bits_of(a[k].contiguous()), bits_of(b[k].contiguous()))
        for k in a
    )


def sign(sections: list[bytes], base_root: bytes, target_root: bytes | None = None) -> bytes:
    """The trainer's signature over `sections`, with the target root their headers add up to (or the given one
    where a header does not parse)."""
    if target_root is None:
        try:
            parsed = [split_section(section)[0] for section in sections]
            target_root = root_of_hashes({h.name: h.target_hash for h in parsed if h.kind is not Kind.REMOVED})
        except (SectionError, DeltaError):
            target_root = b"\x00" * 32
    trailer = Trailer(BASE_VERSION, BASE_VERSION + 1, base_root, target_root, [section_hash(s) for s in sections])
    trailer.sign(TRAINER)
    return Delta(sections, trailer).to_bytes()


def records(raw: bytes) -> list[tuple[int, int, int]]:
    """(offset of the record's length varint, its end, the record's end) for every record of a delta."""
    spans, offset = [], len(MAGIC)
    while offset < len(raw):
        length, body = read_varint(raw, offset + 1)
        spans.append((offset + 1, body, body + length))
        offset = body + length
    return spans


def any_varint(rng: random.Random, honest: int) -> int:
    return rng.choice([0, 1, max(0, honest - 1), honest + 1, honest * 2 + 3, rng.randrange(1 << 16), *HUGE[:4]])


def flip(data: bytes, rng: random.Random, count: int = 4) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, count)):
        out[rng.randrange(len(out))] ^= rng.randrange(1, 256)
    return bytes(out)


@dataclasses.dataclass
class Bench:
    """The honest versions, a holder's weights, and what every attempt did to them."""

    base: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]
    delta: Delta
    held: dict[str, torch.Tensor]
    before: dict[str, torch.Tensor]
    outcomes: Counter
    streams: dict[int, list[list[np.ndarray]]]  # each changing sparse section's decoded blocks, by index

    @classmethod
    def start(cls) -> Bench:
        base, target = model_versions()
        delta = encode(base, target, base_version=BASE_VERSION, version=BASE_VERSION + 1, signer=TRAINER,
                       block_elements=BLOCK)
        held = held_copy(base)
        streams = {}
        for index, section in enumerate(delta.sections):
            header, payload = split_section(section)
            if header.kind is Kind.SPARSE and header.changed:
                streams[index] = [list(block) for block in entropy.decode_blocks(payload)]
        return cls(base, target, delta, held, {k: v.clone() for k, v in held.items()}, Counter(), streams)

    @property
    def base_root(self) -> bytes:
        return self.delta.trailer.base_root

    @property
    def raw(self) -> bytes:
        return self.delta.to_bytes()

    def sections(self, kind: Kind | None = None) -> list[int]:
        return [i for i, s in enumerate(self.delta.sections) if kind is None or split_section(s)[0].kind is kind]

    def attempt(self, data: bytes, case: str) -> None:
        """Apply one variant; it must be refused untouched or applied exactly as signed."""
        try:
            applied = apply(self.held, data, trainer=TRAINER.address, base_version=BASE_VERSION,
                            base_root=self.base_root)
        except DeltaError as exc:
            self.outcomes[type(exc).__name__] += 1
            assert identical(self.held, self.before), f"{case}: a refused delta changed the weights ({exc})"
            assert self.held[TIED[1]] is self.held[TIED[0]] and not self.held[STRIDED].is_contiguous(), case
            return
        except Exception as exc:  # noqa: BLE001 - anything but a DeltaError is the failure this suite looks for
            pytest.fail(f"{case}: raised {type(exc).__name__} instead of a DeltaError: {exc}")
        self.outcomes["applied"] += 1
        assert content_root(self.held) == applied.root, f"{case}: applied weights are not the signed target"
        self.held = held_copy(self.base)

    def honest_still_applies(self) -> None:
        applied = apply(self.held, self.raw, trainer=TRAINER.address, base_version=BASE_VERSION,
                        base_root=self.base_root)
        assert applied.root == content_root(self.target) == content_root(self.held)
        assert identical(self.held, self.target) and self.held[TIED[1]] is self.held[TIED[0]]


@pytest.fixture(scope="module")
def honest() -> Bench:
    return Bench.start()


@pytest.fixture
def bench(honest: Bench) -> Bench:
    held = held_copy(honest.base)
    return dataclasses.replace(honest, held=held, before={k: v.clone() for k, v in held.items()}, outcomes=Counter())


def run(bench: Bench, seed: int, iterations: int, mutators: list[Callable[[Bench, random.Random], bytes]]) -> None:
    rng = random.Random(seed)
    for i in range(iterations):
        mutate = mutators[i % len(mutators)]
        bench.attempt(mutate(bench, rng), f"seed {seed} case {i} ({mutate.__name__})")
    bench.honest_still_applies()


# ------------------------------------------------------------------------------------------ unsigned corruption


def flipped_bytes(bench: Bench, rng: random.Random) -> bytes:
    return flip(bench.raw, rng)


def truncated(bench: Bench, rng: random.Random) -> bytes:
    return bench.raw[:rng.randrange(len(bench.raw))]


def extended(bench: Bench, rng: random.Random) -> bytes:
    return bench.raw + rng.randbytes(rng.randint(1, 64))


def record_length_altered(bench: Bench, rng: random.Random) -> bytes:
    raw = bench.raw
    start, body, end = rng.choice(records(raw))
    return raw[:start] + write_varint(any_varint(rng, end - body)) + raw[body:]


def records_swapped(bench: Bench, rng: random.Random) -> bytes:
    raw = bench.raw
    spans = [(start - 1, end) for start, _, end in records(raw)][:-1]  # sections only, not the trailer
    (a0, a1), (b0, b1) = sorted(rng.sample(spans, 2))
    return raw[:a0] + raw[b0:b1] + raw[a1:b0] + raw[a0:a1] + raw[b1:]


def record_dropped_or_repeated(bench: Bench, rng: random.Random) -> bytes:
    raw = bench.raw
    start, _, end = rng.choice(records(raw)[:-1])
    piece = raw[start - 1:end]
    return raw[:start - 1] + raw[end:] if rng.random() < 0.5 else raw[:end] + piece + raw[end:]


def test_fuzz_unsigned_corruptions_are_refused_untouched(bench: Bench) -> None:
    run(bench, 1, 1200, [flipped_bytes, truncated, extended, record_length_altered, records_swapped,
                        record_dropped_or_repeated])
    assert set(bench.outcomes) <= {"CorruptDelta", "BadSignature"}, bench.outcomes


# ------------------------------------------------------------------------------------------ re-signed sections


def resigned(bench: Bench, change: Callable[[list[bytes]], list[bytes]], keep_root: bool = False) -> bytes:
    sections = change(list(bench.delta.sections))
    return sign(sections, bench.base_root, bench.delta.trailer.target_root if keep_root else None)


def section_bytes_flipped(bench: Bench, rng: random.Random) -> bytes:
    index = rng.choice(bench.sections())

    def change(sections: list[bytes]) -> list[bytes]:
        sections[index] = flip(sections[index], rng, 3)
        return sections

    return resigned(bench, change, keep_root=rng.random() < 0.3)


def section_truncated(bench: Bench, rng: random.Random) -> bytes:
    index = rng.choice(bench.sections())

    def change(sections: list[bytes]) -> list[bytes]:
        sections[index] = sections[index][:rng.randrange(len(sections[index]))]
        return sections

    return resigned(bench, change)


def header_length_altered(bench: Bench, rng: random.Random) -> bytes:
    index = rng.choice(bench.sections())

    def change(sections: list[bytes]) -> list[bytes]:
        header_len, offset = read_varint(sections[index], 0)
        sections[index] = write_varint(any_varint(rng, header_len)) + sections[index][offset:]
        return sections

    return resigned(bench, change)


def header_field_altered(bench: Bench, rng: random.Random) -> bytes:
    """A header that packs: huge or wrong shapes, change counts, block sizes, names, kinds, hashes."""
    index = rng.choice(bench.sections())
    header, payload = split_section(bench.delta.sections[index])
    field = rng.choice(["shape", "shape", "changed", "block", "name", "kind", "hash", "dtype"])
    if field == "shape":
        shape = rng.choice([(rng.choice(HUGE[:3]),), (2**62, 0), (2**31, 2**31), header.shape[::-1],
                            (*header.shape, 1), header.shape[1:], (rng.randrange(1, 5000),)])
        header = dataclasses.replace(header, shape=shape)
    elif field == "changed":
        header = dataclasses.replace(header, changed=any_varint(rng, header.changed))
    elif field == "block":
        header = dataclasses.replace(header, block_elements=any_varint(rng, header.block_elements))
    elif field == "name":
        names = sorted(split_section(s)[0].name for s in bench.delta.sections)
        header = dataclasses.replace(header, name=rng.choice([*names, "", "new.tensor", "\u00e9" * 3]))
    elif field == "kind":
        header = dataclasses.replace(header, kind=rng.choice([k for k in Kind if k is not header.kind]))
    elif field == "hash":
        header = dataclasses.replace(header, target_hash=rng.randbytes(32))
    else:
        header = dataclasses.replace(header, dtype=rng.choice([torch.bfloat16, torch.float32, torch.int64,
                                                               torch.bool, torch.float64, torch.int8]))
    packed = header.pack()

    def change(sections: list[bytes]) -> list[bytes]:
        sections[index] = write_varint(len(packed)) + packed + payload
        return sections

    return resigned(bench, change)


def header_byte_set(bench: Bench, rng: random.Random) -> bytes:
    """Raw header bytes set to any value: unknown kinds and dtype codes, broken UTF-8, overlong varints."""
    index = rng.choice(bench.sections())

    def change(sections: list[bytes]) -> list[bytes]:
        header_len, offset = read_varint(sections[index], 0)
        section = bytearray(sections[index])
        section[offset + rng.randrange(header_len)] = rng.choice([0, 0x7F, 0x80, 0xC3, 0xFF, rng.randrange(256)])
        sections[index] = bytes(section)
        return sections

    return resigned(bench, change, keep_root=rng.random() < 0.3)


def test_fuzz_resigned_section_bytes_reach_the_decoder(bench: Bench) -> None:
    run(bench, 2, 1100, [section_bytes_flipped, section_truncated, header_length_altered, header_field_altered,
                        header_byte_set])
    assert "BadSignature" not in bench.outcomes, bench.outcomes
    assert {"CorruptDelta", "WrongBase", "UnsupportedDelta"} <= set(bench.outcomes), bench.outcomes


# ------------------------------------------------------------------------------------------ re-signed payloads


def sparse_streams(bench: Bench, rng: random.Random) -> tuple[int, SectionHeader, list[list[np.ndarray]]]:
    """A changing sparse section: its index, header and a copy of its decoded blocks."""
    index = rng.choice(sorted(bench.streams))
    header, _ = split_section(bench.delta.sections[index])
    return index, header, [[stream.copy() for stream in block] for block in bench.streams[index]]


def with_payload(bench: Bench, index: int, header: SectionHeader, payload: bytes) -> bytes:
    packed = header.pack()

    def change(sections: list[bytes]) -> list[bytes]:
        sections[index] = write_varint(len(packed)) + packed + payload
        return sections

    return resigned(bench, change)


def gaps_or_values_altered(bench: Bench, rng: random.Random) -> bytes:
    """Re-encoded streams whose gaps or values lie: past the block, wrapping to negative, or plain wrong."""
    index, header, blocks = sparse_streams(bench, rng)
    block = rng.choice(blocks)
    stream = block[rng.randrange(2)]
    if len(stream):
        at = rng.randrange(len(stream))
        stream[at] = np.uint64(rng.choice([2**64 - 1, 2**64 - 2, 2**63, BLOCK, BLOCK - 1, 2**32, rng.randrange(64)]))
    return with_payload(bench, index, header, entropy.encode_blocks(blocks, 2))


def blocks_added_or_dropped(bench: Bench, rng: random.Random) -> bytes:
    index, header, blocks = sparse_streams(bench, rng)
    choice = rng.randrange(4)
    if choice == 0:
        blocks.append([np.array([0], np.uint64), np.array([1], np.uint64)])
    elif choice == 1 and len(blocks) > 1:
        blocks.pop(rng.randrange(len(blocks)))
    elif choice == 2:
        blocks = blocks * rng.randint(2, 40)
    else:
        blocks[0] = [np.arange(BLOCK + 1, dtype=np.uint64) % 2, np.ones(BLOCK + 1, np.uint64)]
    changed = sum(len(b[0]) for b in blocks) if rng.random() < 0.7 else header.changed
    return with_payload(bench, index, dataclasses.replace(header, changed=changed), entropy.encode_blocks(blocks, 2))


def framing_altered(bench: Bench, rng: random.Random) -> bytes:
    """Stream count, histogram bins and block lengths rewritten around the honest rANS words."""
    index, header, _ = sparse_streams(bench, rng)
    payload = split_section(bench.delta.sections[index])[1]
    framing = entropy.read_framing(payload)
    histograms = [h.copy() for h in framing.histograms]
    lengths = framing.lengths.tolist()
    n_streams = len(histograms)
    what = rng.randrange(4)
    if what == 0:
        n_streams = rng.choice([0, 1, 3, 2**16, 2**40])
    elif what == 1:
        hist = rng.choice(histograms)
        hist[rng.randrange(len(hist))] = rng.choice([1, 2**40, 2**63 - 1])
    elif what == 2:
        lengths[rng.randrange(len(lengths))] = rng.choice([0, BLOCK + 1, 2**40, 2**63])
    else:
        lengths += [rng.choice([1, BLOCK])] * rng.randint(1, 3)
    hist_bytes = [entropy._pack_histogram(h) for h in histograms]
    body = b"".join([write_varint(n_streams), *hist_bytes[:min(n_streams, 2)], write_varint(len(lengths)),
                     *(write_varint(n) for n in lengths)])
    return with_payload(bench, index, header, body + payload[framing.offset:])


def rans_words_altered(bench: Bench, rng: random.Random) -> bytes:
    index, header, _ = sparse_streams(bench, rng)
    payload = split_section(bench.delta.sections[index])[1]
    offset = entropy.read_framing(payload).offset
    words = bytearray(payload[offset:])
    choice = rng.randrange(3)
    if choice == 0 and words:
        words[rng.randrange(len(words))] ^= rng.randrange(1, 256)
    elif choice == 1:
        words = words[:4 * rng.randrange(len(words) // 4 + 1)]
    else:
        words += rng.randbytes(4 * rng.randint(1, 8))
    return with_payload(bench, index, header, payload[:offset] + bytes(words))


def full_payload_altered(bench: Bench, rng: random.Random) -> bytes:
    """A full tensor's zstd replaced: a bomb (with or without a content size), truncated, junk, the right
    size with other bytes, two frames."""
    index = rng.choice(bench.sections(Kind.FULL))
    header, payload = split_section(bench.delta.sections[index])
    size = header.elements * torch.empty(0, dtype=header.dtype).element_size()
    choice = rng.randrange(6)
    if choice == 0:
        payload = bomb(rng.choice([size + 1, size * 2, 64 << 20]), sized=rng.random() < 0.5)
    elif choice == 1:
        payload = payload[:rng.randrange(len(payload))]
    elif choice == 2:
        payload = rng.randbytes(rng.randint(0, 64))
    elif choice == 3:
        payload = zstandard.compress(rng.randbytes(size))
    elif choice == 4:
        payload = payload + zstandard.compress(bytes(1 << 20))
    else:
        payload = zstandard.compress(rng.randbytes(max(0, size - rng.randint(1, 4))))
    return with_payload(bench, index, header, payload)


@functools.cache
def bomb(size: int, *, sized: bool) -> bytes:
    """zstd of `size` zero bytes, compressed a MiB at a time (with its content size in the frame when `sized`)."""
    chunk = bytes(min(size, 1 << 20))
    compressor = zstandard.ZstdCompressor(write_content_size=sized).compressobj(size=size if sized else -1)
    pieces = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join([*pieces, compressor.compress(bytes(size % len(chunk))), compressor.flush()])


def test_fuzz_resigned_payloads_are_refused_or_exact(bench: Bench) -> None:
    run(bench, 3, 800, [gaps_or_values_altered, blocks_added_or_dropped, framing_altered, rans_words_altered,
                        full_payload_altered])
    assert "BadSignature" not in bench.outcomes and bench.outcomes["WrongBase"] > 0, bench.outcomes


# ------------------------------------------------------------------------------------------ re-signed section lists


def sections_reordered(bench: Bench, rng: random.Random) -> bytes:
    def change(sections: list[bytes]) -> list[bytes]:
        i, j = rng.sample(range(len(sections)), 2)
        sections[i], sections[j] = sections[j], sections[i]
        return sections

    return resigned(bench, change)


def section_dropped_or_repeated(bench: Bench, rng: random.Random) -> bytes:
    def change(sections: list[bytes]) -> list[bytes]:
        i = rng.randrange(len(sections))
        if rng.random() < 0.5:
            return sections[:i] + sections[i + 1:]
        return sections[:i + 1] + sections[i:]

    return resigned(bench, change)


def huge_tensor_added(bench: Bench, rng: random.Random) -> bytes:
    shape = rng.choice([(2**40,), (2**27,), (2**62, 0), (1 << 24, 1 << 24), (2**20, 2**20, 2**20)])
    header = SectionHeader(Kind.FULL, "zz.huge", rng.choice([torch.float32, torch.bfloat16]), shape,
                           rng.randbytes(32), 0, 0)
    packed = header.pack()
    payload = rng.choice([b"", zstandard.compress(b""), bomb(1 << 20, sized=True)])
    return resigned(bench, lambda sections: [*sections, write_varint(len(packed)) + packed + payload])


def test_fuzz_resigned_section_lists_are_refused_untouched(bench: Bench) -> None:
    run(bench, 4, 375, [sections_reordered, section_dropped_or_repeated, huge_tensor_added])
    # "applied": dropping the new tensor's section signs a smaller, still consistent target
    assert set(bench.outcomes) <= {"CorruptDelta", "WrongBase", "UnsupportedDelta", "applied"}, bench.outcomes
    assert bench.outcomes["UnsupportedDelta"] >= 100, bench.outcomes


def test_fuzz_signatures_are_checked_before_any_section(bench: Bench) -> None:
    """The same re-signed variants, signed by anyone else, stop at the signature."""
    stranger = dev_account(9)
    rng = random.Random(5)
    for i in range(60):
        sections = list(bench.delta.sections)
        sections[rng.randrange(len(sections))] = flip(sections[rng.randrange(len(sections))], rng)
        trailer = Trailer(BASE_VERSION, BASE_VERSION + 1, bench.base_root, bench.delta.trailer.target_root,
                          [section_hash(s) for s in sections])
        trailer.sign(stranger)
        bench.attempt(Delta(sections, trailer).to_bytes(), f"seed 5 case {i} (stranger)")
    assert bench.outcomes == Counter({BadSignature.__name__: 60})
    bench.honest_still_applies()


def test_the_fuzz_bench_is_a_real_delta(honest: Bench) -> None:
    kinds = Counter(split_section(s)[0].kind for s in honest.delta.sections)
    assert kinds[Kind.SPARSE] >= 8 and kinds[Kind.FULL] == 2 and kinds[Kind.REMOVED] == 1
    assert any(split_section(s)[0].changed > BLOCK for s in honest.delta.sections)  # multi-block sections
