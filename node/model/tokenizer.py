"""A character-level tokenizer built in code with `tokenizers`, saved as a PreTrainedTokenizerFast.

Invariant: every character of the alphabet is one token and decoding joins tokens without separators,
so text round-trips exactly (spaces included); ids 0, 1, 2 are <pad>, <eos>, <unk>.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<eos>", "<unk>")


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for char in dict.fromkeys(alphabet):
        vocab.setdefault(char, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
