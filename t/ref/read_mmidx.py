#!/usr/bin/env python3
"""read_mmidx.py - an independent reader of Megatron's indexed dataset.

Written from the format of megatron/core/datasets/indexed_dataset.py
(_IndexWriter / _IndexReader, MMIDIDX version 1), with nothing but the
Python standard library, so that the tests of hp-data check hp's writer
against the format rather than against hp's own reader (lib/format/indexed.c):

  PREFIX.idx, little-endian, no padding:
    9 bytes   magic b"MMIDIDX\\x00\\x00"
    u64       version, 1
    u8        dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
              6 float64, 7 float32, 8 uint16
    u64       sequence count S
    u64       document count D (entries of doc_idx, documents + 1)
    S x i32   sequence lengths
    S x i64   sequence pointers (byte offsets into PREFIX.bin)
    D x i64   document indices (first sequence of each document, then S)
  PREFIX.bin  the token ids of every sequence, back to back

Every invariant Megatron's own writer guarantees is checked, strictly: the
pointers are the running sums of lengths times the item size, the .bin is
exactly that long, doc_idx runs from 0 to S without decreasing, and
nothing follows doc_idx in the .idx.

Usage:
  read_mmidx.py PREFIX          one line per sequence: its ids, space-separated
  read_mmidx.py --info PREFIX   "dtype NAME", "sequences S", "documents D-1",
                                "tokens N" and "doc_idx ..." lines
Exit status 0, or 1 with a message on stderr when the files break the format.
"""
import struct
import sys

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {  # code: (numpy name, struct format, item size)
    1: ("uint8", "B", 1),
    2: ("int8", "b", 1),
    3: ("int16", "h", 2),
    4: ("int32", "i", 4),
    5: ("int64", "q", 8),
    6: ("float64", "d", 8),
    7: ("float32", "f", 4),
    8: ("uint16", "H", 2),
}


def fail(msg):
    sys.stderr.write("read_mmidx.py: %s\n" % msg)
    sys.exit(1)


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        bin_ = f.read()
    if len(idx) < 34:
        fail("%s.idx: %d bytes, shorter than the header" % (prefix, len(idx)))
    if idx[:9] != MAGIC:
        fail("%s.idx: bad magic %r" % (prefix, idx[:9]))
    (version,) = struct.unpack_from("<Q", idx, 9)
    if version != 1:
        fail("%s.idx: version %d, expected 1" % (prefix, version))
    (code,) = struct.unpack_from("<B", idx, 17)
    if code not in DTYPES:
        fail("%s.idx: unknown dtype code %d" % (prefix, code))
    name, fmt, size = DTYPES[code]
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    want = 34 + 4 * nseq + 8 * nseq + 8 * ndoc
    if len(idx) != want:
        fail("%s.idx: %d bytes, the header says %d" % (prefix, len(idx), want))
    off = 34
    lens = struct.unpack_from("<%di" % nseq, idx, off)
    off += 4 * nseq
    ptrs = struct.unpack_from("<%dq" % nseq, idx, off)
    off += 8 * nseq
    docs = struct.unpack_from("<%dq" % ndoc, idx, off)
    pos = 0
    for i in range(nseq):
        if lens[i] < 0:
            fail("sequence %d: negative length %d" % (i, lens[i]))
        if ptrs[i] != pos:
            fail("sequence %d: pointer %d, expected %d" % (i, ptrs[i], pos))
        pos += lens[i] * size
    if pos != len(bin_):
        fail("%s.bin: %d bytes, the index says %d" % (prefix, len(bin_), pos))
    if ndoc < 1 or docs[0] != 0 or docs[-1] != nseq:
        fail("doc_idx must run from 0 to %d: %r" % (nseq, docs[:3] + docs[-3:]))
    if any(docs[i] > docs[i + 1] for i in range(ndoc - 1)):
        fail("doc_idx decreases")
    seqs = []
    for i in range(nseq):
        seqs.append(struct.unpack_from("<%d%s" % (lens[i], fmt), bin_, ptrs[i]))
    return name, docs, seqs


def main(argv):
    info = len(argv) == 3 and argv[1] == "--info"
    if len(argv) != 2 and not info:
        sys.stderr.write("usage: read_mmidx.py [--info] PREFIX\n")
        return 2
    name, docs, seqs = read(argv[-1])
    out = sys.stdout
    if info:
        out.write("dtype %s\n" % name)
        out.write("sequences %d\n" % len(seqs))
        out.write("documents %d\n" % (len(docs) - 1))
        out.write("tokens %d\n" % sum(len(s) for s in seqs))
        out.write("doc_idx %s\n" % " ".join(str(d) for d in docs))
    else:
        for s in seqs:
            out.write(" ".join(str(x) for x in s) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
