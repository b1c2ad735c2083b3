#!/usr/bin/python3
"""mkidx.py - write a Megatron indexed dataset of fixed-length records.

The fallback for `hp-test-tool mkidx --vocab V --records-of N -o PREFIX JSONL`
when that helper is not built: reads a JSONL file whose lines carry "ids"
(token ids from a tokenizer), joins them into one stream in file order (no
separator is added, as hp-test-tool does), cuts the stream into records of
N tokens (the tail that does not fill a record is dropped) and writes PREFIX.bin (raw
little-endian uint16 tokens) and PREFIX.idx (MMIDIDX version 1: magic
b"MMIDIDX\\0\\0", u64 version, u8 dtype code 8 = uint16, u64 sequence count,
u64 document count = records + 1, int32 lengths, int64 byte pointers,
int64 document indices 0..records).  Each record is its own document.

Usage: /usr/bin/python3 bench/mkidx.py --vocab 512 --records-of 257 -o PREFIX FILE.jsonl
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

DTYPE_UINT16 = 8


def main():
    ap = argparse.ArgumentParser(description="write fixed-length MMIDIDX records")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--records-of", type=int, required=True, metavar="N")
    ap.add_argument("-o", "--out", required=True, metavar="PREFIX")
    ap.add_argument("jsonl")
    a = ap.parse_args()
    if a.vocab > 65536:
        sys.exit("mkidx: vocab %d does not fit uint16" % a.vocab)

    stream = []
    with open(a.jsonl) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            ids = json.loads(line)["ids"]
            for t in ids:
                if not 0 <= t < a.vocab:
                    sys.exit("mkidx: '%s': line %d: token %d outside vocab %d"
                             % (a.jsonl, lineno, t, a.vocab))
            stream.extend(ids)
    n = len(stream) // a.records_of
    if n == 0:
        sys.exit("mkidx: '%s': fewer than %d tokens" % (a.jsonl, a.records_of))
    tokens = np.asarray(stream[:n * a.records_of], dtype="<u2")

    lengths = np.full(n, a.records_of, dtype="<i4")
    pointers = (np.arange(n, dtype="<i8") * (a.records_of * 2)).astype("<i8")
    docs = np.arange(n + 1, dtype="<i8")
    for ext, payload in ((".bin", [tokens.tobytes()]),
                         (".idx", [b"MMIDIDX\x00\x00",
                                   struct.pack("<QBQQ", 1, DTYPE_UINT16, n, n + 1),
                                   lengths.tobytes(), pointers.tobytes(),
                                   docs.tobytes()])):
        path = a.out + ext
        with open(path + ".tmp", "wb") as f:
            for p in payload:
                f.write(p)
        os.replace(path + ".tmp", path)
    print("mkidx: %d records of %d tokens -> %s.{bin,idx}" % (n, a.records_of, a.out),
          file=sys.stderr)


if __name__ == "__main__":
    main()
