#!/usr/bin/env python3
"""make-chat-goldens.py - chat-template goldens from transformers itself.

usage: make-chat-goldens.py OUTDIR

Run by t/ref/make-chat-goldens.sh once under transformers 4.57.6 and once
under 5.24.0, each into its own OUTDIR; the script compares the two.  It
writes into OUTDIR:

  conversations.jsonl        the conversations, {"messages": [...]} a line
  templates/*.jinja          mistral-instruct and chatml (no trailing
                             newline) and the four {% generation %} variants
  golden-T.jsonl             per template T in qwen3, llama3, mistral, chatml:
                             one line per conversation, in order
  README.md                  what the files are, with the counts

Nothing depends on the date, the time, the machine or the transformers
release line: the conversations come from a fixed seed and the text of
data/corpus/, none of the templates calls strftime_now, and the README only
names both pinned versions.  The script asserts that each {% generation %}
variant renders byte-identically to its original on every conversation and
gives the same ids, and checks the shape of every assistant mask; it exits
1 on a failed check.
"""
import json
import os
import random
import sys
import unicodedata

import transformers
from transformers import AutoTokenizer

SEED = 20251203
PINS = {"4": "4.57.6", "5": "5.24.0"}
JINJA2 = "3.1.6"
TOKENIZERS = {"4": "0.22.2", "5": "0.23.3"}
TEXT_MAX = 2000          # "text" is kept for rendered strings up to this many characters
SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Mistral-7B-Instruct-v0.2's chat template as first published (the same
# string as Mixtral-8x7B-Instruct-v0.1's); sources in the README.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
           "roles are supported!') }}{% endif %}{% endfor %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def swap(text, old, new, count=1):
    """text with old replaced by new, asserting old occurs exactly count times"""
    n = text.count(old)
    if n != count:
        sys.exit("make-chat-goldens: template edit expected %d of %r, found %d" % (count, old, n))
    return text.replace(old, new)


def generation_variants(orig):
    """T-generation.jinja for each template: the original with the assistant
    turn's header taken out in front and {% generation %} around the rest
    (content through the end-of-turn token; not the newline after it)"""
    q = orig["qwen3"]
    q = swap(q, "        {%- if loop.index0 > ns.last_query_index %}\n"
                "            {%- if loop.last or (not loop.last and reasoning_content) %}",
             "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
             "        {%- generation %}\n"
             "        {%- if loop.index0 > ns.last_query_index %}\n"
             "            {%- if loop.last or (not loop.last and reasoning_content) %}")
    q = swap(q, "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content",
             "{{- '<think>\\n' + reasoning_content")
    q = swap(q, "{{- '<|im_start|>' + message.role + '\\n' + content }}", "{{- content }}", 2)
    q = swap(q, "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
             "        {{- '<|im_end|>' }}\n        {%- endgeneration %}\n        {{- '\\n' }}\n"
             "    {%- elif message.role == \"tool\" %}")
    l = orig["llama3"]
    head = "{% set loop_messages = messages %}{% for message in loop_messages %}"
    l = swap(l, head, head + "{% if message['role'] == 'assistant' %}"
             "{% set header = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' %}"
             "{% if loop.index0 == 0 %}{% set header = bos_token + header %}{% endif %}{{ header }}"
             "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}")
    l = swap(l, "{{ content }}{% endfor %}", "{{ content }}{% endif %}{% endfor %}")
    m = swap(orig["mistral"], "{{ message['content'] + eos_token}}",
             "{% generation %}{{ message['content'] + eos_token}}{% endgeneration %}")
    c = swap(orig["chatml"], "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
             "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
             "{% for message in messages %}{% if message['role'] == 'assistant' %}"
             "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
             "{% endgeneration %}{{ '\\n' }}{% else %}{{'<|im_start|>' + message['role'] + '\\n' + "
             "message['content'] + '<|im_end|>' + '\\n'}}{% endif %}{% endfor %}")
    return {"qwen3": q, "llama3": l, "mistral": m, "chatml": c}


# ---------------------------------------------------------------- text


def paragraphs(name, maxlen):
    text = open(os.path.join(SRC, "data", "corpus", name), encoding="utf-8").read()
    out = []
    for p in text.replace("\r\n", "\n").split("\n\n"):
        p = p.strip()
        if 40 <= len(p) <= maxlen and "<|endoftext|>" not in p:
            out.append(p)
    return out


class Text:
    def __init__(self, rng):
        self.rng = rng
        self.ts = paragraphs("tinystories_val_excerpt.txt", 700)
        self.pp = paragraphs("pride_and_prejudice.txt", 700)
        self.ts_all = paragraphs("tinystories_val_excerpt.txt", 100000)
        self.pp_all = paragraphs("pride_and_prejudice.txt", 100000)
        self.sample = open(os.path.join(SRC, "data", "corpus", "tinystories_sample.txt"),
                           encoding="utf-8").read()

    def para(self, short=False):
        r = self.rng
        p = r.choice(self.ts if r.random() < 0.5 else self.pp)
        if short or len(p) > 400:
            p = self.cut(p, r.randint(50, 260))
        # Austen's paragraphs keep their line breaks half the time
        if "\n" in p and r.random() < 0.5:
            p = " ".join(p.split())
        return p

    def cut(self, p, n):
        """p cut to about n characters at a sentence or word end"""
        if len(p) <= n:
            return p
        q = p[:n]
        for end in (". ", "! ", "? ", "\n", " "):
            k = q.rfind(end)
            if k > n // 3:
                return q[:k + 1].rstrip()
        return q

    def sentence(self):
        p = self.para(short=True)
        parts = [s for s in p.replace("\n", " ").split(". ") if s]
        s = self.rng.choice(parts).strip()
        return s if s.endswith((".", "!", "?", '"')) else s + "."

    def long(self, n):
        """about n characters of consecutive real paragraphs, line breaks kept"""
        r = self.rng
        pool = self.ts_all if r.random() < 0.5 else self.pp_all
        k = r.randrange(len(pool))
        out = []
        while sum(len(x) + 2 for x in out) < n:
            out.append(pool[k % len(pool)])
            k += 1
        return "\n\n".join(out)

    def lower(self, s):
        return s[:1].lower() + s[1:]

    def ask(self):
        r = self.rng
        p = self.para()
        forms = [
            lambda: "Can you summarize this passage?\n\n" + p,
            lambda: "What happens next in this story: " + p,
            lambda: "Please rewrite this in simpler words:\n" + p,
            lambda: "Who is speaking here, and why? " + self.sentence(),
            lambda: "Here is a line from a book: \"" + self.sentence() + "\" What does it mean?",
            lambda: "Tell me a short story that starts with: " + self.sentence(),
            lambda: "Is this sentence happy or sad? " + self.sentence(),
            lambda: "Give me three words that describe this scene.\n" + p,
            lambda: "Why do you think the character acted this way?",
            lambda: "Thanks! And what about the ending?",
            lambda: "Explain it to a five year old.",
            lambda: self.sentence() + " Continue, please.",
            lambda: "Translate into French: " + self.sentence(),
            lambda: "ok",
            lambda: "Write one more paragraph in the same style.",
        ]
        return r.choice(forms)()

    def answer(self):
        r = self.rng
        p = self.para()
        forms = [
            lambda: "Sure! Here is a summary: " + p,
            lambda: "In this passage, " + self.lower(self.sentence()),
            lambda: p,
            lambda: "Here is a simpler version:\n\n" + p,
            lambda: "The speaker seems surprised. " + self.sentence(),
            lambda: "It is mostly happy.",
            lambda: "1. " + self.sentence() + "\n2. " + self.sentence() + "\n3. " + self.sentence(),
            lambda: "Once upon a time, " + self.lower(self.sentence()) + " " + p,
            lambda: "I think so, yes.",
            lambda: "Bright, quiet and warm.",
        ]
        return r.choice(forms)()

    def system(self):
        return self.rng.choice([
            "You are a helpful assistant.",
            "You are a patient teacher who explains stories to children.",
            "You are an expert on the novels of Jane Austen. Answer briefly.",
            "Answer in one sentence.",
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
            "Always be kind. Never use the word \"very\".",
            "You are a storyteller.\nKeep answers under 100 words.\nUse simple words.",
        ])


def M(role, content, **kw):
    d = {"role": role, "content": content}
    d.update(kw)
    return d


def dialog(t, turns, system=None, end_user=False):
    """turns user/assistant pairs; end_user drops the last assistant"""
    msgs = [M("system", system)] if system is not None else []
    for k in range(turns):
        msgs.append(M("user", t.ask()))
        if not (end_user and k == turns - 1):
            msgs.append(M("assistant", t.answer()))
    return msgs


# ---------------------------------------------------------------- conversations

WS = ["  ", "\n", "\n\n", " \n ", "\t", "\r\n", "\u00a0", "\u3000", "\x1c\x1d\x1e\x1f", "\u2028",
      "\u0085", "\x0b\x0c", "\u200b", "\ufeff", " \t\n\r "]

UNICODE = [
    "从前有一只小兔子，它住在森林里。它每天都和朋友们一起玩。",
    "小さな猫が窓のそばで眠っていました。とても静かな午後でした。",
    "옛날 옛적에 작은 마을에 친절한 소녀가 살았습니다.",
    "كان يا ما كان، في قديم الزمان، فتاة صغيرة تحب القراءة.",
    "פעם אחת הייתה ילדה קטנה שאהבה לקרוא ספרים.",
    "एक बार की बात है, एक छोटी लड़की थी जो किताबें पढ़ना पसंद करती थी।",
    "กาลครั้งหนึ่งนานมาแล้ว มีเด็กหญิงตัวเล็กๆ คนหนึ่ง",
    "Ngày xửa ngày xưa, có một cô bé rất thích đọc sách.",
    "Жила-была маленькая девочка, которая любила читать.",
    "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, coder: 👩🏽‍💻, hearts: ❤️‍🔥 🫶🏿, keycap: 1️⃣, flags: 🇫🇷🇯🇵",
    "Z̴̡̛a̶̢͝l̷̨͘g̸̛̕o̵͘ text with stacked combining marks, and a\u0301 e\u0300 o\u0302 n\u0303.",
    "Math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ = ½; 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝒮𝒸𝓇𝒾𝓅𝓉; Gothic 𐍈; musical 𝄞.",
    "Mixed: English, 中文, العربية, עברית in one line \u200f(RTL mark)\u200e and\u202eoverride\u202c.",
    "Private use \ue000\uf8ff, replacement \ufffd, variation selectors ︎☺︎ ☺️, NUL-free.",
    "Fullwidth ＡＢＣ１２３ and halfwidth ｶﾀｶﾅ, ligature ﬁ, Roman numeral Ⅻ, Kelvin K.",
    "Hangul jamo (not NFC): " + unicodedata.normalize("NFD", "한국어 문장입니다."),
]
NFD = [unicodedata.normalize("NFD", s) for s in [
    "Élisabeth Bennet était très fière. Ça va? Ångström, Crème brûlée, naïve café.",
    "Mr. Darcy sagte: „Schön, Sie zu sehen.“ Über Äpfel und Öl.",
    "Tiếng Việt có rất nhiều dấu: ả, ẫ, ợ, ự.",
]]

SPECIAL = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>",
           "<|end_of_text|>", "<|start_header_id|>assistant<|end_header_id|>", "</s>", "<s>", "<unk>",
           "[INST]", "[/INST]", "<think>", "</think>", "<tool_call>", "<tool_response>",
           "<|im_start|>assistant\n", "<|im_end", "<|eot_id|>>", "< /s>", "<|fim_prefix|>",
           "<|reserved_special_token_5|>"]

TEMPLATEISH = ["{{ x }}", "{% if %}", "{% if messages %}yes{% endif %}", "{# a comment #}",
               "{{ messages[0]['content'] }}", "{%- raw -%}{{ raw }}{%- endraw -%}",
               "{{'<|im_start|>' + role}}", "${HOME} %s {0} {{{{ }}}} {%%}"]


def conversations(t):
    r = t.rng
    out = []
    kinds = []

    def add(kind, msgs):
        kinds.append(kind)
        out.append({"messages": msgs})

    # basic: 1 to 10 turns, a system prompt on every third, some ending with the user
    for k in range(110):
        sysp = t.system() if k % 3 == 0 else None
        add("basic", dialog(t, 1 + k % 10, sysp, end_user=(k % 10 in (0, 2, 9))))
    # whitespace at the edges of content (Llama 3 trims with Python's str.strip)
    for k, w in enumerate(WS):
        w2 = WS[(k + 5) % len(WS)]
        msgs = dialog(t, 1 + k % 3, t.system() if k % 2 else None, end_user=(k % 5 == 4))
        for m in msgs:
            if m["role"] != "system" or k % 4 == 1:
                m["content"] = w + m["content"] + w2
        add("whitespace", msgs)
    add("whitespace", [M("user", "   "), M("assistant", " \n\t ")])
    add("whitespace", [M("system", "\n\n"), M("user", "\nhello\n"), M("assistant", "\n\nHi!\n\n")])
    add("whitespace", [M("user", "line one\nline two\r\nline three\rline four"),
                       M("assistant", "\n\n\n" + t.para() + "\n\n\n")])
    # empty messages
    add("empty", [M("user", ""), M("assistant", "")])
    add("empty", [M("user", ""), M("assistant", t.answer())])
    add("empty", [M("user", t.ask()), M("assistant", "")])
    add("empty", [M("system", ""), M("user", t.ask()), M("assistant", t.answer())])
    add("empty", [M("system", ""), M("user", ""), M("assistant", "")])
    add("empty", [M("user", "")])
    add("empty", [M("system", t.system()), M("user", "")])
    add("empty", [M("user", t.ask()), M("assistant", ""), M("user", t.ask()), M("assistant", "")])
    add("empty", [M("user", t.ask()), M("assistant", t.answer()), M("user", "")])
    add("empty", [M("user", ""), M("assistant", ""), M("user", ""), M("assistant", ""), M("user", "")])
    add("empty", [M("system", ""), M("user", "")])
    add("empty", [M("user", t.ask()), M("assistant", "", reasoning_content="")])
    # long messages, 5 to 40 KB
    for k, n in enumerate([5000, 6000, 8000, 10000, 14000, 30000]):
        big = t.long(n)
        if k % 2 == 0:
            msgs = [M("user", "Please summarize this text:\n\n" + big), M("assistant", t.answer())]
        else:
            msgs = [M("user", t.ask()), M("assistant", big), M("user", "Shorter, please.")]
            if k >= 3:
                msgs.append(M("assistant", t.answer()))
        if k == 2:
            msgs.insert(0, M("system", t.system()))
        add("long", msgs)
    # Unicode
    for k, s in enumerate(UNICODE + NFD):
        if k % 3 == 0:
            msgs = [M("user", s), M("assistant", t.answer())]
        elif k % 3 == 1:
            msgs = [M("user", t.ask() + " " + s), M("assistant", s + "\n" + t.sentence()),
                    M("user", "Again: " + s)]
        else:
            msgs = [M("system", "Reply in the language of the user. " + s), M("user", s),
                    M("assistant", s + s)]
        add("unicode", msgs)
    add("unicode", [M("user", "".join(UNICODE[9:12])), M("assistant", "".join(NFD))])
    # special-token strings and template-looking text inside content
    # (Mistral's <s>, </s>, <unk> are never followed by a space here: after a
    # special token, transformers 4.x (tokenizer.json's Prepend normalizer)
    # adds a second U+2581 where 5.x (Metaspace, prepend_scheme "always")
    # does not, so the two release lines give different ids)
    for k, s in enumerate(SPECIAL):
        a = t.sentence()
        q = "'" if s in ("<s>", "</s>", "<unk>") else ""
        if k % 3 == 0:
            msgs = [M("user", "What does " + q + s + q + " mean?"), M("assistant", "It is " + s + ". " + a)]
        elif k % 3 == 1:
            msgs = [M("user", s + t.ask() + s + q), M("assistant", a + s), M("user", s + q)]
        else:
            msgs = [M("system", s), M("user", s + s), M("assistant", s)]
        add("special", msgs)
    for k, s in enumerate(TEMPLATEISH):
        msgs = [M("user", "Render this: " + s), M("assistant", s + " " + t.sentence())]
        if k % 2:
            msgs = [M("system", s)] + msgs + [M("user", s)]
        add("templateish", msgs)
    # Qwen3 thinking: <think> in content, reasoning_content, earlier and last turns
    def think(reason, answer, nl=True):
        return ("<think>\n" + reason + "\n</think>\n\n" + answer) if nl else \
            ("<think>" + reason + "</think>" + answer)
    add("think", [M("user", t.ask()), M("assistant", think(t.para(), t.answer()))])
    add("think", [M("user", t.ask()), M("assistant", think(t.para(), t.answer())),
                  M("user", t.ask()), M("assistant", think(t.para(), t.answer()))])
    add("think", [M("user", t.ask()), M("assistant", think(t.para(), t.answer())),
                  M("user", t.ask()), M("assistant", t.answer())])
    add("think", [M("user", t.ask()), M("assistant", think(t.para(), t.answer())),
                  M("user", t.ask())])
    add("think", [M("system", t.system()), M("user", t.ask()), M("assistant", think("", t.answer())),
                  M("user", t.ask()), M("assistant", think("", t.answer()))])
    add("think", [M("user", t.ask()), M("assistant", "<think>\n\n</think>\n\n" + t.answer())])
    add("think", [M("user", t.ask()), M("assistant", "<think></think>" + t.answer())])
    add("think", [M("user", t.ask()), M("assistant", think(t.sentence(), t.answer(), nl=False))])
    add("think", [M("user", t.ask()), M("assistant", think(t.sentence(), t.answer(), nl=False)),
                  M("user", t.ask()), M("assistant", think(t.sentence(), t.answer(), nl=False))])
    add("think", [M("user", t.ask()), M("assistant", "\n\n<think>\n\n\n" + t.sentence() + "\n\n\n</think>"
                                           "\n\n\n\n" + t.answer() + "\n")])
    add("think", [M("user", t.ask()), M("assistant", t.sentence() + "</think>" + t.answer())])
    add("think", [M("user", t.ask()), M("assistant", "<think>a</think>b</think>\nc")])
    add("think", [M("user", t.ask()), M("assistant", think(t.sentence(), ""))])
    add("think", [M("user", t.ask()), M("assistant", "<think>\n" + t.sentence())])
    add("think", [M("user", t.ask()), M("assistant", "  <think>\n" + t.sentence() + "\n</think>\n\n  "
                                           + t.answer())])
    for k in range(6):
        msgs = []
        n = 2 + k
        for j in range(n):
            msgs.append(M("user", t.ask()))
            if j < n - 1 or k % 2 == 0:
                msgs.append(M("assistant", think(t.sentence(), t.answer())))
        add("think", msgs)
    add("think", [M("user", t.ask()), M("assistant", t.answer(), reasoning_content=t.para())])
    add("think", [M("user", t.ask()), M("assistant", t.answer(), reasoning_content=t.para()),
                  M("user", t.ask()), M("assistant", t.answer(), reasoning_content=t.para())])
    add("think", [M("user", t.ask()), M("assistant", t.answer(), reasoning_content=t.para()),
                  M("user", t.ask())])
    add("think", [M("user", t.ask()), M("assistant", t.answer(), reasoning_content="")])
    add("think", [M("user", t.ask()), M("assistant", think(t.sentence(), t.answer()), reasoning_content=None)])
    add("think", [M("user", t.ask()), M("assistant", think(t.sentence(), t.answer()),
                                        reasoning_content="the field wins over the tags")])
    add("think", [M("user", t.ask()), M("assistant", "\n\n" + t.answer(),
                                        reasoning_content="\n\n" + t.sentence() + "\n\n")])
    add("think", [M("system", t.system()), M("user", t.ask()),
                  M("assistant", t.answer(), reasoning_content="你好，我在思考。🤔"),
                  M("user", "继续"), M("assistant", "好的。", reasoning_content="用户想要继续。")])
    add("think", [M("user", t.ask()), M("assistant", "\n\n" + t.answer()), M("user", t.ask()),
                  M("assistant", "\n\n" + t.answer())])
    add("think", [M("user", "<think>user thinking?</think> " + t.ask()), M("assistant", t.answer())])
    # tool messages (Qwen3's template renders them inside a user turn)
    add("tool", [M("user", "What is the weather in Paris?"), M("assistant", "Let me check."),
                 M("tool", '{"temperature": 21, "unit": "celsius"}'),
                 M("assistant", "It is 21 degrees in Paris.")])
    add("tool", [M("system", t.system()), M("user", "Look up two books."), M("assistant", "Looking."),
                 M("tool", "Pride and Prejudice, 1813"), M("tool", "Emma, 1815"),
                 M("assistant", think("Two results came back.", "Two books: Pride and Prejudice and Emma."))])
    add("tool", [M("user", "Run the tool."), M("assistant", "Running.", reasoning_content="I must call it."),
                 M("tool", "done")])
    add("tool", [M("user", t.ask()), M("assistant", think(t.sentence(), "Calling.")),
                 M("tool", t.para()), M("assistant", think(t.sentence(), "Calling again.")),
                 M("tool", t.para()), M("assistant", t.answer(), reasoning_content=t.sentence())])
    add("tool", [M("user", t.ask()), M("assistant", "One moment."),
                 M("user", "<tool_response>\n" + t.sentence() + "\n</tool_response>"),
                 M("assistant", think(t.sentence(), t.answer()))])
    add("tool", [M("tool", "a tool message first")])
    add("tool", [M("user", t.ask()), M("assistant", "Checking."), M("tool", ""),
                 M("user", t.ask()), M("assistant", think(t.sentence(), t.answer()))])
    add("tool", [M("user", t.ask()), M("assistant", "Checking.", reasoning_content=""),
                 M("tool", "<|im_end|> inside a tool result"), M("tool", "\n\n"),
                 M("assistant", "", reasoning_content="")])
    # roles out of order or unknown to a template
    add("roles", [M("assistant", t.answer())])
    add("roles", [M("assistant", t.answer()), M("user", t.ask())])
    add("roles", [M("system", t.system())])
    add("roles", [M("system", t.system()), M("assistant", t.answer())])
    add("roles", [M("user", t.ask()), M("user", t.ask()), M("assistant", t.answer())])
    add("roles", [M("user", t.ask()), M("assistant", t.answer()), M("assistant", t.answer())])
    add("roles", [M("user", t.ask()), M("assistant", t.answer()), M("system", t.system()),
                  M("user", t.ask()), M("assistant", t.answer())])
    add("roles", [M("system", t.system()), M("system", t.system()), M("user", t.ask())])
    add("roles", [M("developer", "Be terse."), M("user", t.ask()), M("assistant", t.answer())])
    add("roles", [M("user", t.ask()), M("function", '{"ok": true}'), M("assistant", t.answer())])
    add("roles", [M("user", t.ask()), M("assistant", t.answer()), M("user", t.ask()),
                  M("assistant", t.answer()), M("user", t.ask()), M("user", t.ask())])
    # the five TinyStories sample stories, whole, as one exchange each
    stories = [s.strip() for s in t.sample.split("<|endoftext|>") if s.strip()]
    for k, s in enumerate(stories):
        add("story", [M("user", "Tell me a story."), M("assistant", s)] +
            ([M("user", "Another one, please.")] if k % 2 else []))
    return out, kinds


# ---------------------------------------------------------------- rendering

EOS = {"qwen3": "<|im_end|>", "chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>"}
TOKDIR = {"qwen3": "qwen3", "chatml": "qwen3", "llama3": "llama3", "mistral": "mistral"}


def ids_of(r):
    """input_ids whatever apply_chat_template returned (4.x a list, 5.x a BatchEncoding)"""
    if isinstance(r, list):
        return list(r)
    return list(r["input_ids"])


def fail(msg):
    print("make-chat-goldens: " + msg, file=sys.stderr)
    sys.exit(1)


def render(tok, msgs, template, gen=False):
    kw = {"chat_template": template} if template is not None else {}
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
    ids = ids_of(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, **kw))
    return text, ids


def main():
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    outdir = sys.argv[1]
    line = transformers.__version__.split(".")[0]
    if PINS.get(line) != transformers.__version__:
        fail("transformers %s is not one of the pinned %s" % (transformers.__version__, PINS))
    os.makedirs(os.path.join(outdir, "templates"), exist_ok=True)

    rng = random.Random(SEED)
    convs, kinds = conversations(Text(rng))
    write_jsonl(os.path.join(outdir, "conversations.jsonl"), convs)

    toks = {d: AutoTokenizer.from_pretrained(os.path.join(SRC, "data", "tokenizers", d))
            for d in ("qwen3", "llama3", "mistral")}
    orig = {"qwen3": toks["qwen3"].chat_template, "llama3": toks["llama3"].chat_template,
            "mistral": MISTRAL, "chatml": CHATML}
    gens = generation_variants(orig)
    for name, text in (("mistral-instruct", MISTRAL), ("chatml", CHATML)):
        write(os.path.join(outdir, "templates", name + ".jinja"), text)
    for name in ("qwen3", "llama3", "mistral", "chatml"):
        write(os.path.join(outdir, "templates", name + "-generation.jinja"), gens[name])

    stats = {}
    for name in ("qwen3", "llama3", "mistral", "chatml"):
        tok = toks[TOKDIR[name]]
        template = None if name in ("qwen3", "llama3") else orig[name]
        eos_id = tok.convert_tokens_to_ids(EOS[name])
        st = stats[name] = {"ok": 0, "error": 0, "tokens": 0, "masked": 0, "gen": 0, "text": 0,
                            "errors": {}}
        lines = []
        for i, conv in enumerate(convs):
            msgs = conv["messages"]
            try:
                text, ids = render(tok, msgs, template)
            except Exception as e:  # the template's raise_exception, an undefined role...
                msg = str(e)
                try:
                    tok.apply_chat_template(msgs, tokenize=False, chat_template=gens[name])
                    fail("%s #%d: the original raises (%s), the generation variant does not" % (name, i, msg))
                except Exception as e2:
                    if str(e2) != msg:
                        fail("%s #%d: variant raises %r, the original %r" % (name, i, str(e2), msg))
                lines.append({"i": i, "error": msg})
                st["error"] += 1
                st["errors"][msg] = st["errors"].get(msg, 0) + 1
                continue
            gtext = tok.apply_chat_template(msgs, tokenize=False, chat_template=gens[name])
            if gtext != text:
                fail("%s #%d: the generation variant renders differently" % (name, i))
            r = tok.apply_chat_template(msgs, tokenize=True, chat_template=gens[name], return_dict=True,
                                        return_assistant_tokens_mask=True)
            if ids_of(r) != ids:
                fail("%s #%d: the generation variant tokenizes differently" % (name, i))
            mask = [int(x) for x in r["assistant_masks"]]
            check_mask(name, i, msgs, ids, mask, eos_id)
            line = {"i": i}
            if len(text) <= TEXT_MAX:
                line["text"] = text
                st["text"] += 1
            line["ids"] = ids
            if msgs[-1]["role"] == "user":
                _, gids = render(tok, msgs, template, gen=True)
                line["gen_ids"] = gids
                st["gen"] += 1
            line["mask"] = mask
            lines.append(line)
            st["ok"] += 1
            st["tokens"] += len(ids)
            st["masked"] += sum(mask)
        write_jsonl(os.path.join(outdir, "golden-%s.jsonl" % name), lines)
    write(os.path.join(outdir, "README.md"), readme(outdir, convs, kinds, stats))


def check_mask(name, i, msgs, ids, mask, eos_id):
    """each assistant turn is one run of 1s ending on the end-of-turn token"""
    runs = []
    k = 0
    while k < len(mask):
        if mask[k]:
            j = k
            while j + 1 < len(mask) and mask[j + 1]:
                j += 1
            runs.append((k, j))
            k = j + 1
        else:
            k += 1
    want = sum(1 for m in msgs if m["role"] == "assistant")
    if len(runs) != want:
        fail("%s #%d: %d masked runs for %d assistant turns" % (name, i, len(runs), want))
    for a, b in runs:
        if ids[b] != eos_id or a == 0:
            fail("%s #%d: a masked run %d..%d does not end on the end-of-turn token" % (name, i, a, b))


def write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def readme(outdir, convs, kinds, stats):
    def size(name):
        return os.path.getsize(os.path.join(outdir, name))
    ranges = []
    for k, kind in enumerate(kinds):
        if ranges and ranges[-1][0] == kind:
            ranges[-1][2] = k
        else:
            ranges.append([kind, k, k])
    nturns = [sum(1 for m in c["messages"] if m["role"] == "assistant") for c in convs]
    nuser = [sum(1 for m in c["messages"] if m["role"] == "user") for c in convs]
    chars = sum(len(m["content"]) for c in convs for m in c["messages"])
    ends_user = sum(1 for c in convs if c["messages"][-1]["role"] == "user")
    ends_asst = sum(1 for c in convs if c["messages"][-1]["role"] == "assistant")
    with_sys = sum(1 for c in convs if c["messages"][0]["role"] == "system")
    longest = max(len(m["content"].encode()) for c in convs for m in c["messages"])
    big = sum(1 for c in convs for m in c["messages"] if len(m["content"].encode()) >= 5000)
    rows = []
    for name in ("qwen3", "llama3", "mistral", "chatml"):
        s = stats[name]
        rows.append("| %s | %d | %d | %d | %d | %d | %d | %s |" % (
            name, s["ok"], s["error"], s["tokens"], s["masked"], s["gen"], s["text"],
            format(size("golden-%s.jsonl" % name), ",")))
    errs = []
    for name in ("qwen3", "llama3", "mistral", "chatml"):
        for msg, n in sorted(stats[name]["errors"].items()):
            errs.append("- %s, %d: `%s`" % (name, n, msg))
    kind_text = ", ".join("%s %d–%d" % (kind, a, b) for kind, a, b in ranges)
    return README.format(
        n=len(convs), chars=format(chars, ","), with_sys=with_sys, ends_user=ends_user,
        ends_asst=ends_asst, other_end=len(convs) - ends_user - ends_asst, big=big,
        longest=format(longest, ","), maxturns=max(nturns), maxuser=max(nuser), conv_size=format(size("conversations.jsonl"), ","),
        kinds=kind_text, table="\n".join(rows), errors="\n".join(errs) or "- none",
        tf4=PINS["4"], tf5=PINS["5"], tok4=TOKENIZERS["4"], tok5=TOKENIZERS["5"], jinja=JINJA2,
        textmax=TEXT_MAX, seed=SEED)


README = """\
# Chat-template goldens from transformers itself

Made by one command, `t/ref/make-chat-goldens.sh` (see its header): it runs
`t/ref/make-chat-goldens.py` under transformers {tf4} (tokenizers {tok4})
and under transformers {tf5} (tokenizers {tok5}), both with jinja2 {jinja}
and no torch, and keeps the files only when the two release lines write
byte-identical files.  Two runs write identical bytes (fixed seed {seed}; no
template here calls `strftime_now`, nothing reads the clock).  Not
hand-edited: change the generator and rerun.

## Files

- `conversations.jsonl`: {n} conversations, one a line, `{{"messages":
  [{{"role": ..., "content": ...}}, ...]}}`; a few assistant messages also carry
  `"reasoning_content"` (a string, `""` or `null`) for Qwen3.  Raw UTF-8,
  not NFC-normalised on purpose (some content is NFD); JSON escapes only
  for `"`, `\\` and control characters.  {chars} characters of content in
  all; {with_sys} start with a system message, {ends_user} end with a user
  message, {ends_asst} with an assistant message, {other_end} with a system or
  tool message; up to {maxuser} user and {maxturns} assistant turns; {big} messages of 5 KB or
  more, the longest {longest} bytes.  `conversations.jsonl` is {conv_size} bytes.
  By index: {kinds}.
  The text is TinyStories paragraphs and Pride and Prejudice paragraphs
  from `data/corpus/` (Austen's hard line breaks kept in about half), cut
  at sentence ends and mixed with hand-written question/answer phrasing,
  plus hand-written cases: whitespace at the edges (spaces, newlines,
  tabs, CR LF, NBSP, U+3000, U+001C..U+001F, U+2028, U+0085, VT/FF, and
  U+200B/U+FEFF which Python's `str.strip` keeps), empty messages, CJK,
  Arabic, Hebrew, Devanagari, Thai, emoji ZWJ sequences, stacked combining
  marks, NFD text, astral characters, special-token strings
  (`<|im_end|>`, `<|eot_id|>`, `</s>`, `[INST]`, `<think>`, ...) and
  Jinja-looking text (`{{{{ x }}}}`, `{{% if %}}`) inside content, Qwen3
  `<think>` blocks in earlier and last turns, empty think blocks, think
  tags without newlines, `reasoning_content`, tool messages, and roles out
  of order or unknown (`developer`, `function`).
- `templates/mistral-instruct.jinja`: the Mistral-7B-Instruct-v0.2 chat
  template (below), used with `data/tokenizers/mistral` (bos `<s>`, eos `</s>`).
- `templates/chatml.jinja`: plain ChatML, used with `data/tokenizers/qwen3`.
- `qwen3` and `llama3` use the `chat_template` of
  `data/tokenizers/{{qwen3,llama3}}/tokenizer_config.json` unchanged.
- `templates/T-generation.jinja` for T in qwen3, llama3, mistral, chatml:
  the same template with `{{% generation %}}...{{% endgeneration %}}` around
  what the model must produce in each assistant turn (below).  The
  generator asserts that each renders byte-identically to its original on
  every conversation (and raises the same error where the original does)
  and tokenizes to the same ids.
  The `.jinja` files hold the template string exactly, with no trailing
  newline.
- `golden-T.jsonl`: one line per conversation, in the order of
  `conversations.jsonl`.  Either
  `{{"i": index, "text": ..., "ids": [...], "gen_ids": [...], "mask": [...]}}` or
  `{{"i": index, "error": "message"}}`.
  - `ids`: `tokenizer.apply_chat_template(messages, tokenize=True)`
    (add_generation_prompt false; transformers 4.x returns a list, 5.x a
    BatchEncoding whose `input_ids` is taken).  As in transformers, the
    rendered string is encoded without adding special tokens, so special
    tokens come from the template text, and special-token strings inside
    content become those tokens too.
  - `text`: the rendered string (`tokenize=False`), only when it is at
    most {textmax} characters.
  - `gen_ids`: only for conversations whose last message is from the
    user: the ids with `add_generation_prompt=True`.  The llama3 template
    here (Meta-Llama-3-8B's) always ends with the assistant header and the
    Mistral template ignores the flag, so for those two `gen_ids` equals
    `ids`.
  - `mask`: one 0/1 per id, transformers' own `assistant_masks` from
    `apply_chat_template(..., tokenize=True, return_dict=True,
    return_assistant_tokens_mask=True)` with `T-generation.jinja`.
  - `error`: `str()` of what transformers raised (the template's
    `raise_exception`, a `TemplateError`).

## Counts

| template | rendered | errors | tokens | masked tokens | gen_ids | with text | bytes |
|---|---|---|---|---|---|---|---|
{table}

Errors:

{errors}

## The mask

1 marks the tokens the model learns to produce in an assistant turn:
everything after the assistant header (after what
`add_generation_prompt=True` emits: `<|im_start|>assistant\\n` for qwen3 and
chatml, `<|start_header_id|>assistant<|end_header_id|>\\n\\n` for llama3, after
` [/INST]` for mistral) through the end-of-turn token that closes the turn
(`<|im_end|>`, `<|eot_id|>`, `</s>`), not the newline after it.  For Qwen3
that includes the `<think>\\n...\\n</think>\\n\\n` the template emits in
turns after the last user query (an empty one in the last turn when there
is no reasoning), and the `<tool_response>` turns are not masked.  Headers,
system, user and tool turns, and the trailing assistant header of llama3
are 0.

transformers maps the generation block's character span to tokens with
`char_to_token`: from the token holding the span's first character through
the token holding its last character.  A token that straddles the start of
the span is therefore masked whole: in qwen3 and chatml, assistant content
that starts with newlines merges with the header's `\\n` into one token
(`\\n\\n\\n`), and that token is 1.  The span always ends on the
end-of-turn special token, so the end never straddles.  The generator
checks that every assistant turn is exactly one run of 1s ending on the
end-of-turn id.

## What transformers does that a port must copy

- Roles: Qwen3's template silently drops a role it does not know
  (`developer`, `function`), llama3 and chatml render any role as a
  header, the Mistral template raises on anything but alternating
  user/assistant (so on every system and tool message).
- Qwen3: the final assistant turn after the last user query always gets a
  `<think>\n...\n</think>\n\n` block, an empty one when there is no
  reasoning; earlier turns lose theirs.  `reasoning_content` (when not
  null) wins over `<think>` tags in the content, which then stay in the
  text as they are.  A user message wrapped in `<tool_response>` tags does
  not count as the last user query.
- Llama 3: this template (no `{{% if add_generation_prompt %}}`, unlike
  Meta-Llama-3-8B-Instruct's) always ends with the assistant header, so
  every `ids` ends with `<|start_header_id|>assistant<|end_header_id|>\n\n`
  (mask 0); `| trim` is Python's `str.strip()`, which removes
  U+001C..U+001F, U+0085, U+00A0, U+2028 and U+3000 too but not U+200B or
  U+FEFF.
- bos_token: the qwen3 tokenizer has none; in both release lines it is
  then undefined in the template (not None): `{{{{ bos_token }}}}` prints
  nothing and `bos_token is defined` is false.  No template here uses it
  with qwen3.
- The rendered text is encoded with add_special_tokens false, and
  special-token strings inside content are matched as special tokens
  (`<|im_end|>` in a user message is id 151645), as are Qwen3's non-special
  added tokens (`<think>`, `<tool_call>`, ...).

## Transformers 4.x and 5.x

On these files the two lines agree byte for byte.  One difference was
found and is kept out of the conversations: with the Mistral tokenizer,
a piece of text that starts with a space, at the start of the string or
after a special token (`</s> [/INST]`, `<unk> mean`; `encode(" hello")`
too), gets two U+2581 in 4.57.6 (tokenizer.json's normalizer,
Prepend U+2581 then spaces to U+2581: ids `28705, 733` for ` [`) and one in
5.24.0 (5.x rebuilds LlamaTokenizer with a Metaspace pre-tokenizer,
prepend_scheme "always", which does not prepend to a piece that already
starts with U+2581: id `733`).  So `<s>`, `</s>` and `<unk>` in content are
never followed by a space here.  HF tokenizers on tokenizer.json itself
(what `data/tokenizers/vectors` holds) behaves like 4.x.  5.x also
returns a BatchEncoding from `apply_chat_template(tokenize=True)` where
4.x returns a list, and builds Qwen3's ByteLevel pre-tokenizer with
trim_offsets true; neither changes ids or masks here.

## Mistral template

`templates/mistral-instruct.jinja` is the `chat_template` of
Mistral-7B-Instruct-v0.2's `tokenizer_config.json` as first published
(mistralai later replaced it on the hub with one that accepts a system
message), byte for byte as copied in the hub repository
PrunaAI/Mistral-7B-Instruct-v0.2-bnb-4bit, revision
ff58100143099bfea31d7af68cb518b32a7f217c, `tokenizer_config.json`; the
same string is llama-cpp-python's `MIXTRAL_INSTRUCT_CHAT_TEMPLATE`
(`llama_cpp/llama_chat_format.py`, "Source:
https://huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1/blob/main/tokenizer_config.json").
Mistral-7B-Instruct-v0.1's differs only by a space after `eos_token`.  It
alternates user/assistant (raising otherwise) and has no system role.

## Licenses

- TinyStories text: CDLA-Sharing-1.0.  Pride and Prejudice: public domain.
- Mistral chat template and tokenizer: Apache-2.0 (Mistral AI).
- Qwen3 chat template and tokenizer: Apache-2.0 (Alibaba Cloud).
- Llama 3 chat template and tokenizer: Meta Llama 3 Community License.
- ChatML template: the plain form published with OpenAI's ChatML and
  used by many models; the hand-written phrasing and the generator are
  this project's.
"""

if __name__ == "__main__":
    main()
