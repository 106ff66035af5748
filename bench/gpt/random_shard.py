#!/usr/bin/env python3
"""Random GPT-2 token ids (vocabulary 50257) in llm.c's shard format: a header of 256 int32 (magic 20240520,
version 1, the token count), then the tokens as uint16. Speed runs do not depend on the tokens.

    random_shard.py PATH TOKENS [PATH TOKENS ...]     (one generator, seed 1337, over the files in order)
"""
import random
import struct
import sys


def main(args):
    if len(args) < 2 or len(args) % 2:
        sys.exit("random_shard.py: expected PATH TOKENS pairs, found " + " ".join(args))
    rng = random.Random(1337)
    for path, count in zip(args[::2], args[1::2]):
        n = int(count)
        with open(path, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))


if __name__ == "__main__":
    main(sys.argv[1:])
