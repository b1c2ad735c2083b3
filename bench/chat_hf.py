#!/usr/bin/env python3
"""chat_hf.py - transformers' apply_chat_template throughput, a baseline for hp's chat rendering.

usage: python chat_hf.py TEMPLATE [CONVERSATIONS.jsonl] [REPEAT]

TEMPLATE is qwen3, llama3, mistral or chatml, as in data/chat/README.md
(the tokenizer of data/tokenizers/, and for mistral and chatml the template
of data/chat/templates/).  CONVERSATIONS defaults to
data/chat/conversations.jsonl.  Every conversation is rendered and
tokenized with apply_chat_template(tokenize=True), on one thread
(TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1 are set here, before
tokenizers loads), best of REPEAT (default 3) passes, loading excluded;
conversations the template rejects (Mistral's alternation check) are
counted as errors and still timed.  Prints one JSON line.  Run it with a
transformers venv's python, e.g. build/chat-venv5/bin/python (made by
t/ref/make-chat-goldens.sh); not part of make check.
"""
import json
import os
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOKDIR = {"qwen3": "qwen3", "llama3": "llama3", "mistral": "mistral", "chatml": "qwen3"}
TEMPLATE = {"mistral": "mistral-instruct.jinja", "chatml": "chatml.jinja"}


def ids_of(r):
    return r if isinstance(r, list) else r["input_ids"]


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in TOKDIR:
        sys.exit(__doc__.split("\n\n")[1])
    name = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(SRC, "data", "chat", "conversations.jsonl")
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    tok = AutoTokenizer.from_pretrained(os.path.join(SRC, "data", "tokenizers", TOKDIR[name]))
    kw = {}
    if name in TEMPLATE:
        with open(os.path.join(SRC, "data", "chat", "templates", TEMPLATE[name]), encoding="utf-8") as f:
            kw["chat_template"] = f.read()
    with open(path, encoding="utf-8") as f:
        convs = [json.loads(line)["messages"] for line in f if line.strip()]
    nbytes = sum(len(m["content"].encode("utf-8")) for c in convs for m in c)
    best = float("inf")
    ntok = errors = 0
    for _ in range(repeat):
        ntok = errors = 0
        t0 = time.perf_counter()
        for msgs in convs:
            try:
                ntok += len(ids_of(tok.apply_chat_template(msgs, tokenize=True, **kw)))
            except Exception:
                errors += 1
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"impl": "hf", "transformers": transformers.__version__, "template": name,
                      "conversations": len(convs), "errors": errors, "tokens": ntok,
                      "content_bytes": nbytes, "seconds": round(best, 4),
                      "conversations_per_s": round(len(convs) / best, 1),
                      "tokens_per_s": round(ntok / best, 1)}))


if __name__ == "__main__":
    main()
