#!/usr/bin/env python3
# make-sft.py - write sft.jsonl, the demo's conversation set, from the
# TinyStories validation excerpt (data/corpus, CDLA-Sharing-1.0): each of
# the first 400 one-paragraph rows of 200 to 700 characters becomes a user
# asking for a story that starts with the row's first sentence and the
# assistant answering with the rest.  Deterministic; run from the top of
# the tree:  python3 examples/stories260K/make-sft.py
import json
import re

text = open('data/corpus/tinystories_val_excerpt.txt', encoding='utf-8').read()
rows = [r.strip() for r in re.split(r'\n\s*\n', text) if r.strip()]
asks = ["Tell me a story that starts like this: \"{}\"",
        "Continue this story: \"{}\"",
        "Write a short story beginning with: \"{}\"",
        "Can you finish this story? \"{}\""]
out = []
for r in rows:
    if len(out) >= 400:
        break
    if len(r) < 200 or len(r) > 700 or '\n' in r:
        continue
    m = re.match(r'(.+?[.!?])\s+(.*)', r)
    if not m or len(m.group(1)) < 20:
        continue
    first, rest = m.group(1), m.group(2)
    msgs = [{"role": "user", "content": asks[len(out) % 4].format(first)},
            {"role": "assistant", "content": rest}]
    out.append({"messages": msgs})
with open('examples/stories260K/sft.jsonl', 'w') as f:
    for o in out:
        f.write(json.dumps(o, ensure_ascii=False) + "\n")
