#!/usr/bin/env python3
"""tok_hf.py - HF tokenizers' encoding throughput, the baseline of tok-bench.sh.

usage: python tok_hf.py TOKENIZER.json FILE [REPEAT]

One thread (RAYON_NUM_THREADS=1 is set by the caller), no special tokens,
the file encoded as one text and line by line, best of REPEAT runs, loading
excluded.  Prints one JSON line like hp-test-tool tokbench.
"""
import json
import sys
import time

from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    data = open(sys.argv[2], "rb").read()
    text = data.decode("utf-8")
    lines = text.split("\n")
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    best_whole = best_lines = float("inf")
    ntok = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        ntok = len(tok.encode(text, add_special_tokens=False).ids)
        best_whole = min(best_whole, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for line in lines:
            tok.encode(line, add_special_tokens=False)
        best_lines = min(best_lines, time.perf_counter() - t0)
    print(json.dumps({"impl": "hf", "whole_mb_s": round(len(data) / best_whole / 1e6, 2),
                      "lines_mb_s": round(len(data) / best_lines / 1e6, 2),
                      "tokens": ntok, "bytes": len(data)}))


if __name__ == "__main__":
    main()
