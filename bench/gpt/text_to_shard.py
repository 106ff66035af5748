#!/usr/bin/env python3
"""Writes a text file's bytes as llm.c token shards (zero-gpt --train/--val): a 256-int32 header (magic 20240520,
version 1, token count) then the tokens as uint16, one token per byte, split 90/10 as zero-gpt --text splits.
Byte values are valid GPT-2 token ids (< 50257) but not GPT-2's tokenization of the text: the shards serve to run
GPT-2's shapes (vocabulary 50257) for speed, not to learn English with GPT-2's tokenizer.

    text_to_shard.py TEXT TRAIN.bin VAL.bin
"""
import struct
import sys


def write_shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    data = open(sys.argv[1], "rb").read()
    val = len(data) // 10
    write_shard(sys.argv[2], list(data[: len(data) - val]))
    write_shard(sys.argv[3], list(data[len(data) - val :]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
