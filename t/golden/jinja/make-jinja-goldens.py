#!/usr/bin/env python3
"""make-jinja-goldens.py - differential goldens for lib/text/jinja_*.c, from jinja2 itself.

Regenerate (from the top of the source tree; the venv is the one
scripts/ builds for the chat tests, with transformers and jinja2 3.1.6):

    build/chat-venv5/bin/python t/golden/jinja/make-jinja-goldens.py > t/golden/jinja/cases.jsonl

Every case is rendered by the environment transformers builds for
apply_chat_template (transformers.utils.chat_template_utils.
_cached_compile_jinja_template: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, AssistantTracker, its tojson,
raise_exception, strftime_now, dict and namespace), so the goldens are what
transformers renders.  Output, one JSON object a line:

    {"default_vars": {...}}                       first line: vars shared by most cases
    {"name", "template", "vars" ("default" or an object), "out" | "error": true,
     "gen": [[start, end], ...] in code points, for templates with {% generation %}}

The output is deterministic: no case reaches strftime_now, and dicts keep
their insertion order.  t/unit/test-jinja.c renders every case with
lib/text/jinja_*.c and compares the bytes.
"""
import json
import os
import re
import sys

from transformers.utils.chat_template_utils import _render_with_assistant_indices

try:  # transformers 5
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template as compile_template
except ImportError:  # 4.x (build/chat-venv4): the same environment, less namespace()'s name check
    from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

DEFAULT = {
    "a": [1, 2, 3],
    "b": [3, 1, 2, 1],
    "s": "h\u00e9llo w\u00f6rld",
    "w": "  padded \t\n",
    "d": {"k": "v", "n": 1, "z": None, "l": [1, "x"]},
    "e": "",
    "f": 1.5,
    "i": 7,
    "neg": -3,
    "u": "\u00c4\u00d6\u00fc \u00df \ufb01 \u03a3\u03b1\u03c3 \U0001F600",
    "words": ["b", "A", "a", "C"],
    "people": [{"name": "bob", "age": 31}, {"name": "Al", "age": 25}, {"name": "cy", "age": 31}],
    "nested": {"x": {"y": {"z": "deep"}}},
    "csv": "a,b,,c",
    "t": True,
    "nil": None,
}

CASES = []


def case(name, template, vars=None):
    CASES.append((name, template, vars))


# --- whitespace control, trim_blocks, lstrip_blocks, trailing newline -------
case("ws-plain", "a\n{% if true %}\nb\n{% endif %}\nc\n")
case("ws-lstrip", "  {% if true %}\n  x\n  {% endif %}\n  y")
case("ws-minus", "a   {%- if true -%}   b   {%- endif -%}   c")
case("ws-minus-var", "a  \n {{- 'x' -}} \n  b")
case("ws-plus", "  {%+ if true %}x{% endif %}")
case("ws-plus-end", "{% if true +%}\nx{% endif %}")
case("ws-comment", "a\n  {# note #}\nb {#- x -#}  c")
case("ws-comment-plus", "a\n  {#+ note +#}\nb")
case("ws-trailing-two", "x\n\n")
case("ws-trailing-crlf", "x\r\ny\r\n")
case("ws-cr", "x\ry")
case("ws-var-no-trim", "{{ 'a' }}\nb")
case("ws-tab-lstrip", "\t \t{% if true %}x{% endif %}")
case("ws-mid-line", "a {% if true %}x{% endif %} b\n  c")
case("ws-unicode-minus", "a\u3000\u00a0 {{- 'b' }}")
case("ws-raw", "{% raw %}{{ x }} {% if %}{% endraw %}!")
case("ws-raw-strip", "a  {%- raw -%}  {{ x }}  {%- endraw -%}  b")
case("ws-raw-lstrip", "x\n  {% raw %}\nA\n  {% endraw %}\ny")
case("ws-nested", "{% for x in a %}\n  {% if x > 1 %}\n    {{ x }}\n  {% endif %}\n{% endfor %}\n")
case("ws-line-start-after-tag", "{% if true %}\n    {% if true %}\nX\n    {% endif %}\n{% endif %}")
case("ws-empty", "")
case("ws-only-newline", "\n")
case("ws-set-trim", "{% set x = 1 %}\n{{ x }}")
case("ws-block-after-text", "text  {% if true %}\ny{% endif %}")

# --- output formatting (Python str / repr) ---------------------------------
case("fmt-ints", "{{ 3 }} {{ -0 }} {{ 10 ** 15 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }}")
case("fmt-floats", "{{ 1.0 }} {{ 0.1 }} {{ 1e-05 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 1.5e300 * 1e10 }} {{ -0.0 }} {{ 2.5e-10 }} {{ 1/3 }} {{ 0.1 + 0.2 }} {{ 100.0 }}")
case("fmt-bool-none", "{{ true }} {{ False }} {{ none }} {{ None }} {{ nil }}")
case("fmt-list", "{{ a }} {{ [1, 'a', none, true, 1.5] }} {{ [] }} {{ [[1], ['x']] }}")
case("fmt-tuple", "{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ 1, 2 }}")
case("fmt-dict", "{{ d }} {{ {} }} {{ {'a': {'b': [1]}} }} {{ {1: 2, 'x': none} }}")
case("fmt-repr-quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'back\\\\slash', 'nl\\n tab\\t'] }}")
case("fmt-repr-unicode", "{{ ['\u00e9', '\\x00\\x7f', '\\u00a0', '\\u200b', '\U0001F600', '\\u2028'] }}")
case("fmt-undefined", "[{{ missing }}][{{ d.missing }}][{{ a[10] }}]")
case("fmt-items", "{{ d.items() }} {{ d.keys() }} {{ d.values() }}")
case("fmt-namespace", "{% set ns = namespace(a=1, b='x') %}{{ ns }}")
case("fmt-string-list", "{{ ['a'] ~ 1 }}|{{ 1 ~ 2.0 ~ none ~ true }}")

# --- literals and escapes --------------------------------------------------
case("lit-strings", "{{ 'a' \"b\" 'c' }}|{{ \"\\t\\\\\\x41\\u00e9\\U0001F600\\101\" }}|{{ '\\q' }}|{{ 'it\\'s' }}")
case("lit-multiline-string", "{{ 'a\nb' }}")
case("lit-numbers", "{{ 1.5e3 }} {{ 1E3 }} {{ 2.5 }} {{ 1_0.0_1 }}")
case("lit-dict-dup", "{{ {'a': 1, 'b': 2, 'a': 3} }}")
case("lit-trailing-comma", "{{ [1, 2,] }} {{ {'a': 1,} }} {{ (1, 2,) }}")

# --- arithmetic -------------------------------------------------------------
case("ar-int", "{{ 7 + 2 }} {{ 7 - 9 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
case("ar-float", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 2.0 ** 3 }} {{ 1.5 + 1 }} {{ 3 * 1.5 }}")
case("ar-prec", "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }} {{ -(a|length) }} {{ -i|abs }}")
case("err-ar-neg-filter", "{{ -a|length }}")
case("ar-bool", "{{ true + 1 }} {{ true * 'ab' }} {{ false + 0.5 }} {{ true / 2 }}")
case("ar-str", "{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ 'ab' * 0 }}|{{ 'ab' * -1 }}|{{ 'a' + 'b' }}|{{ [1] * 2 }}")
case("ar-list", "{{ a + [4] }} {{ a + b }} {{ (1,) + (2,) }}")
case("ar-unary", "{{ -i }} {{ +i }} {{ --i }} {{ -f }} {{ +true }} {{ -(3) }}")
case("ar-concat", "{{ 1 ~ 'a' ~ [1] ~ none ~ missing ~ 1.0 }}")
case("ar-concat-prec", "{{ 'a' ~ 2 * 3 }} {{ 1 ~ 2 + 3 ~ 4 if false else 'x' }}")
case("err-ar-concat-prec", "{{ 1 + 2 ~ 3 }}")
case("err-ar-div0", "{{ 1 / 0 }}")
case("err-ar-mod0", "{{ 1 % 0 }}")
case("err-ar-floordiv0", "{{ 1 // 0.0 }}")
case("err-ar-str-int", "{{ 'a' + 1 }}")
case("err-ar-list-int", "{{ a + 1 }}")
case("err-ar-undef", "{{ missing + 1 }}")
case("err-ar-undef-neg", "{{ -missing }}")
case("err-ar-str-minus", "{{ 'a' - 'b' }}")
case("err-ar-dict-add", "{{ d + d }}")

# --- comparisons and logic ---------------------------------------------------
case("cmp-basic", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ (1, 2) == (1, 2) }} {{ [1] == (1,) }}")
case("cmp-mixed-eq", "{{ 1 == 'a' }} {{ none == none }} {{ none == 0 }} {{ true == 1 }} {{ d == {'k': 'v', 'n': 1, 'z': none, 'l': [1, 'x']} }} {{ missing == missing }}")
case("cmp-chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 != 2 }}")
case("cmp-in", "{{ 'el' in s }} {{ 2 in a }} {{ 'k' in d }} {{ 'v' in d }} {{ 5 not in a }} {{ 'x' in missing }} {{ (1, 2) in [(1, 2)] }} {{ '' in 'abc' }}")
case("cmp-unicode-order", "{{ '\u00e9' > 'z' }} {{ '\U0001F600' > '\uffff' }}")
case("logic", "{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ '' or [] }} {{ not 0 }} {{ not a }} {{ missing or 'dflt' }} [{{ missing and 1 }}] {{ not missing }}")
case("logic-prec", "{{ not 1 == 2 }} {{ true or false and false }} {{ not true or true }}")
case("cond", "{{ 'y' if t else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ 1 if 0 else 2 if 0 else 3 }}")
case("truthiness", "{% for x in [0, 1, 0.0, 0.5, '', 'a', [], [0], {}, {'a': 1}, none, true, false, missing] %}{{ 'T' if x else 'F' }}{% endfor %}")
case("err-cmp-int-str", "{{ 1 < 'a' }}")
case("err-cmp-undef", "{{ missing < 1 }}")
case("err-cmp-none", "{{ none < 1 }}")
case("err-in-int-str", "{{ 1 in 'abc' }}")
case("err-in-int", "{{ 1 in 5 }}")

# --- variables, attributes, items, slices ------------------------------------
case("attr-dict", "{{ d.k }} {{ d['k'] }} {{ d.l[1] }} {{ d.l.0 }} {{ nested.x.y.z }} {{ nested['x']['y'].z }}")
case("attr-method-vs-key", "{% set m = {'items': 'key!', 'x': 1} %}{{ m['items'] }}|{{ m.x }}")
case("item-list", "{{ a[0] }} {{ a[-1] }} {{ a[-3] }} [{{ a[3] }}] [{{ a[-4] }}] {{ a[true] }}")
case("item-str", "{{ s[0] }} {{ s[1] }} {{ s[-1] }} {{ u[-1] }} [{{ s[100] }}]")
case("slice-list", "{{ a[1:] }} {{ a[:-1] }} {{ a[::-1] }} {{ a[::2] }} {{ a[-2:] }} {{ a[5:] }} {{ a[1:1] }} {{ a[::-2] }} {{ a[2:0:-1] }} {{ a[-10:10] }}")
case("slice-str", "{{ s[1:4] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ s[-3:] }}|{{ u[::-1] }}|{{ u[2:-2] }}|{{ s[:0] }}|{{ s[10:2:-3] }}")
case("slice-tuple", "{{ (1, 2, 3)[1:] }} {{ (1, 2, 3)[::-1] }}")
case("undef-defined", "{{ missing is defined }} {{ d.k is defined }} {{ d.q is defined }} {{ a[9] is defined }} {{ missing is undefined }}")
case("undef-iter", "[{% for x in missing %}x{% endfor %}] {{ missing|length }} {{ missing|list }}")
case("undef-string", "[{{ missing|string }}] [{{ missing ~ 'a' }}] [{{ missing|default('d') }}]")
case("err-undef-attr", "{{ missing.x }}")
case("err-undef-item", "{{ missing[0] }}")
case("err-undef-call", "{{ missing() }}")
case("err-undef-attr-of-attr", "{{ d.q.r }}")
case("err-undef-defined-of-undef", "{{ missing.x is defined }}")
case("err-undef-method", "{{ missing.strip() }}")
case("err-subscript-int", "{{ i[0] }}")
case("err-slice-step0", "{{ a[::0] }}")
case("err-call-int", "{{ i() }}")
case("err-unpack", "{% set x, y = [1, 2, 3] %}")
case("err-unpack-few", "{% for x, y in [[1]] %}{% endfor %}")

# --- statements ---------------------------------------------------------------
case("if-elif", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %} {% endfor %}")
case("for-loopvars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}")
case("for-prev-next", "{% for x in a %}[{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }}]{% endfor %}")
case("for-cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}")
case("for-filter", "{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}")
case("for-else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in a %}{{ x }}{% else %}no{% endfor %}|{% for x in a if x > 5 %}x{% else %}none-kept{% endfor %}")
case("for-unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for a1, (b1, c1) in [(1, (2, 3))] %}{{ a1 }}{{ b1 }}{{ c1 }}{% endfor %}")
case("for-dict", "{% for k in d %}{{ k }}{% endfor %}")
case("for-string", "{% for c in u %}[{{ c }}]{% endfor %}")
case("for-nested-loop", "{% for x in a %}{% for y in a %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}")
case("for-break-continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case("for-scope", "{% set x = 3 %}{% for i in range(2) %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}")
case("for-scope2", "{% for i in range(3) %}{% if i == 1 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}")
case("for-loop-outside", "{% for i in a %}{% endfor %}[{{ loop }}]")
case("for-tuple-iter", "{% for x in 1, 2 %}{{ x }}{% endfor %}")
case("for-items-filter", "{% for k, v in d|items %}{{ k }}{% endfor %}|{% for k, v in d|dictsort %}{{ k }}{% endfor %}")
case("set-basic", "{% set x = 1 %}{% set y, z = 2, 3 %}{{ x }}{{ y }}{{ z }}{% set x = x + 1 %}{{ x }}")
case("set-block", "{% set t %}a{{ 1 }}\nb{% endset %}[{{ t }}]{{ t|length }}")
case("set-block-filter", "{% set t | upper | trim %}  hello {{ 'x' }} {% endset %}[{{ t }}]")
case("set-if-leaks", "{% if true %}{% set x = 'in' %}{% endif %}{{ x }}")
case("ns-loop", "{% set ns = namespace(total=0, last=none) %}{% for x in a %}{% set ns.total = ns.total + x %}{% set ns.last = x %}{% endfor %}{{ ns.total }} {{ ns.last }}")
case("ns-new-attr", "{% set ns = namespace() %}{% set ns.y = 2 %}{{ ns.y }} [{{ ns.q }}]")
case("ns-dict-arg", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
case("err-ns-underscore", "{% set ns = namespace(_x=1) %}")
case("err-ns-set-underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}")
case("err-ns-not-ns", "{% set ns = {} %}{% set ns.x = 1 %}")
case("macro-basic", "{% macro f(a, b=2) %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=3) }}{{ f(b=4, a=5) }}{{ f() }}")
case("macro-late-binding", "{% macro f() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ f() }}")
case("macro-scope", "{% set x = 1 %}{% macro f() %}{{ x }}{% set x = 2 %}{{ x }}{% endmacro %}{{ f() }}{{ x }}")
case("macro-in-loop", "{% for i in range(2) %}{% set x = i * 7 %}{% macro g() %}{{ x }}{% endmacro %}{{ g() }}{% endfor %}")
case("macro-default-expr", "{% macro f(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ f('hi') }}")
case("macro-recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(5) }}")
case("macro-varargs", "{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, x=4) }}")
case("macro-result-string", "{% macro f() %} x {% endmacro %}[{{ f()|trim }}]{{ f()|length }}")
case("macro-json-schema", "{%- macro render(p) -%}{%- if p.type == 'object' -%}{ {%- for k, v in p.properties.items() -%}{{ k }}: {{ render(v) }}{{ ', ' if not loop.last }}{%- endfor -%} }{%- elif p.type == 'array' -%}{{ render(p.items) }}[]{%- else -%}{{ p.type }}{%- endif -%}{%- endmacro -%}{{ render(schema) }}",
     {"schema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}, "c": {"type": "object", "properties": {"d": {"type": "boolean"}}}}}})
case("err-macro-too-many", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}")
case("err-macro-bad-kw", "{% macro f(a) %}{% endmacro %}{{ f(b=1) }}")
case("filter-block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter replace('a', 'b') | trim %} aaa {% endfilter %}")
case("generation-basic", "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
     {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "h\u00e9llo"}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})

# --- errors that must be raised ------------------------------------------------
case("err-raise", "{{ raise_exception('boom: ' ~ 1) }}")
case("err-raise-in-loop", "{% for m in a %}{% if m == 2 %}{{ raise_exception('two') }}{% endif %}{% endfor %}")
case("err-append", "{{ a.append(4) }}")
case("err-update", "{{ d.update({'x': 1}) }}")
case("err-underscore-attr", "{{ s.__class__() }}")
case("err-range-big", "{{ range(100001)|length }}")
case("range-max", "{{ range(100000)|length }}")
case("err-syntax-unclosed", "{% if true %}x")
case("err-syntax-endfor", "{% endfor %}")
case("err-syntax-unknown-tag", "{% frobnicate %}")
case("err-syntax-bad-expr", "{{ 1 + }}")
case("err-syntax-unclosed-var", "{{ 1 ")
case("err-syntax-unclosed-comment", "{# x ")
case("err-syntax-paren", "{{ (1 }}")
case("err-syntax-bracket", "{{ [1) }}")
case("err-unknown-filter", "{{ 1 | nosuchfilter }}")
case("err-unknown-test", "{{ 1 is nosuchtest }}")
case("err-break-outside", "{% break %}")
case("err-assign-const", "{% set true = 1 %}")
case("err-split-empty", "{{ 'a'.split('') }}")
case("err-join-int", "{{ ', '.join([1, 2]) }}")
case("err-list-index", "{{ a.index(9) }}")
case("err-tojson-undef", "{{ missing|tojson }}")
case("err-tojson-ns", "{{ namespace(a=1)|tojson }}")
case("err-length-int", "{{ 5|length }}")
case("err-sort-mixed", "{{ [1, 'a']|sort }}")
case("err-unhashable", "{{ {[1]: 2} }}")

# --- tests -------------------------------------------------------------------
case("tests-types", "{% for x in [1, 1.5, 'a', [1], {'a': 1}, none, true, missing, (1,)] %}{{ [x is number, x is integer, x is float, x is string, x is mapping, x is iterable, x is sequence, x is none, x is boolean, x is defined]|map('int')|join }} {% endfor %}")
case("tests-values", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ none is none }} {{ 2 is eq 2 }} {{ 2 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is le 2 }} {{ 3 is gt 2 }} {{ 2 is ge 3 }} {{ 2 is in a }} {{ 2 is equalto 2 }} {{ 1 is greaterthan 0 }} {{ 1 is lessthan 0 }}")
case("tests-str", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '1A' is upper }} {{ none is sameas none }} {{ true is sameas true }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }} {{ range is callable }} {{ 1 is callable }}")
case("tests-not", "{{ 1 is not none }} {{ missing is not defined }} {{ not 1 is none }} {{ 'x' is not string }}")
case("err-test-odd-undef", "{{ missing is odd }}")

# --- filters -------------------------------------------------------------------
case("f-length", "{{ a|length }} {{ s|length }} {{ u|count }} {{ d|length }} {{ ''|length }}")
case("f-trim", "[{{ w|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ w|strip if false else w.strip() }}] [{{ '\u3000a\u00a0'|trim }}] [{{ 12|trim }}]")
case("f-case", "{{ s|upper }} {{ 'ABC'|lower }} {{ 'hello world-foo(bar)'|title }} {{ \"they're bill's\"|title }} {{ 'hELLO'|capitalize }} {{ u|upper }} {{ u|lower }} {{ u|title }} {{ u|capitalize }}")
case("f-case-special", "{{ '\u00df\u0130\u03a3'|lower }} {{ '\u00df\ufb01\u0149'|upper }} {{ 'A\u03a3 A\u03a3B'|lower }} {{ '\u01c6x'|capitalize }}")
case("f-replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ s|replace('l', 'L') }} {{ 'x'|replace('y', 'z') }}")
case("f-string", "{{ 1|string }} {{ [1]|string }} {{ 1.0|string ~ 'x' }}")
case("f-int-float", "{{ '42'|int }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '0x1F'|int(0, 16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ '1e3'|float }} {{ true|int }} {{ none|int }}")
case("f-abs-round", "{{ -3|abs }} {{ (-3)|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} {{ 3|round }} {{ 1234.5678|round(-2) }} {{ 0.125|round(2) }}")
case("f-first-last", "{{ a|first }} {{ a|last }} {{ s|first }} {{ s|last }} [{{ []|first }}] {{ d|first }}")
case("f-join", "{{ a|join }} {{ a|join(', ') }} {{ people|join(', ', attribute='name') }} {{ [1, none, 'x']|join('-') }} {{ 'abc'|join('.') }}")
case("f-list-reverse", "{{ 'abc'|list }} {{ d|list }} {{ a|reverse|list }} {{ s|reverse }} {{ (1, 2)|list }}")
case("f-sort", "{{ b|sort }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|sort(reverse=true) }} {{ people|sort(attribute='age')|map(attribute='name')|join(',') }} {{ people|sort(attribute='name')|map(attribute='name')|join(',') }}")
case("f-sort-stable", "{{ people|sort(attribute='age', reverse=true)|map(attribute='name')|join(',') }}")
case("f-unique", "{{ b|unique|list }} {{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ people|unique(attribute='age')|map(attribute='name')|list }}")
case("f-map", "{{ a|map('string')|list }} {{ words|map('upper')|join }} {{ people|map(attribute='name')|list }} {{ people|map(attribute='nope', default='-')|list }} {{ [' a ', 'b ']|map('trim')|list }} {{ ['a,b', 'c']|map('replace', ',', ';')|list }}")
case("f-select", "{{ a|select('odd')|list }} {{ a|reject('odd')|list }} {{ [0, 1, '', 'x']|select|list }} {{ a|select('gt', 1)|list }} {{ a|select('in', [1, 3])|list }} {{ people|selectattr('age', 'eq', 31)|map(attribute='name')|list }} {{ people|rejectattr('age', 'equalto', 31)|map(attribute='name')|list }} {{ people|selectattr('name')|list|length }}")
case("f-default", "{{ missing|default('x') }} {{ none|default('x') }} {{ ''|default('x') }} {{ ''|default('x', true) }} {{ 0|d('z', true) }} {{ d.q|d('dq') }} [{{ missing|default }}]")
case("f-items-dictsort", "{{ d|items|list }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }} {{ {'b': 1, 'a': 3}|dictsort(by='value') }} {{ {'b': 1, 'a': 3}|dictsort(reverse=true) }} {{ missing|items|list }}")
case("f-minmax-sum", "{{ b|max }} {{ b|min }} {{ words|max }} {{ words|min }} {{ a|sum }} {{ people|sum(attribute='age') }} {{ [1.5, 2]|sum }} {{ a|sum(start=10) }} {{ people|max(attribute='age') }}")
case("f-batch", "{{ a|batch(2)|list }} {{ a|batch(2, 0)|list }}")
case("f-indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('> ', blank=true) }}|{{ 'x'|indent(first=true) }}")
case("f-wordcount", "{{ 'hello big-world, 3 times_x'|wordcount }} {{ u|wordcount }} {{ ''|wordcount }}")
case("f-format", "{{ '%s-%s'|format('a', 1) }} {{ '%d%%'|format(50) }} {{ '%.2f'|format(1.23456) }} {{ '%5s|%-5s|'|format('a', 'b') }} {{ '%(x)s'|format(x='y') }} {{ '%r'|format('q') }} {{ '%x %o %e'|format(255, 8, 12345.678) }}")
case("f-percent-op", "{{ 'n=%d s=%s' % (3, 'x') }} {{ '%s' % 'one' }} {{ '%s' % [1, 2] }} {{ '%(a)s' % {'a': 1} }} {{ '%05.1f' % 3.14159 }} {{ '%c%c' % (65, 'b') }}")
case("f-escape-safe", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|safe }} {{ 5|safe }} {{ '<'|escape }}")
case("f-attr", "{{ d|attr('k') }}|{{ d|attr('items') is callable }}|{{ people[0]|attr('name') }}")
case("f-center", "[{{ 'ab'|center(7) }}] [{{ 'abc'|center(6) }}]")
case("f-chain", "{{ '  A,B , c '|trim|lower|replace(' ', '')|title }} {{ (a|map('string')|join('+')) ~ '=' ~ a|sum }}")
case("err-f-unsupported", "{{ a|groupby('x') }}")
case("err-f-first-int", "{{ 5|first }}")

# --- tojson ------------------------------------------------------------------------
case("json-basic", "{{ d|tojson }} {{ a|tojson }} {{ 'x\"y\\\\z\\n\\t\\u0001\\x7f'|tojson }} {{ none|tojson }} {{ true|tojson }} {{ 1.0|tojson }} {{ 1e20|tojson }} {{ (1, 2)|tojson }} {{ {}|tojson }} {{ []|tojson }}")
case("json-unicode", "{{ u|tojson }} {{ u|tojson(ensure_ascii=true) }} {{ s|tojson(true) }}")
case("json-indent", "{{ d|tojson(indent=2) }}\n{{ people|tojson(indent=4) }}\n{{ {'a': [], 'b': {}}|tojson(indent=2) }}\n{{ a|tojson(indent=0) }}\n{{ a|tojson(indent='\\t') }}")
case("json-separators", "{{ d|tojson(separators=(',', ':')) }} {{ d|tojson(indent=1, separators=(';', '=')) }}")
case("json-sort", "{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}")
case("json-keys", "{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'}|tojson }}")
case("json-floats", "{{ [0.1, 1e-07, 123456789.125, 1e16, -0.0, 3.0]|tojson }}")
case("json-nested", "{{ nested|tojson }} {{ [[[]], [{}]]|tojson(indent=1) }}")
case("json-tools", "{% for tool in tools %}{{ tool|tojson }}\n{% endfor %}",
     {"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather \u2600 in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "K\u00f8benhavn"]}, "days": {"type": "integer", "minimum": 1, "default": 3}, "ratio": {"type": "number", "default": 0.5}}, "required": ["city"]}}}]})

# --- string methods ---------------------------------------------------------------------
case("m-startswith", "{{ s.startswith('h\u00e9') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'h')) }} {{ s.endswith(('x', 'y')) }} {{ ''.startswith('') }}")
case("m-split", "{{ csv.split(',') }} {{ ' a  b  '.split() }} {{ 'a b c'.split(none, 1) }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c '.rsplit(none, 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ 'abc'.split('abc') }}")
case("m-strip", "[{{ w.strip() }}] [{{ w.lstrip() }}] [{{ w.rstrip() }}] [{{ '\\n\\nx\\n'.strip('\\n') }}] [{{ 'xyaxy'.strip('yx') }}] [{{ 'aab'.lstrip('a') }}] [{{ 'abb'.rstrip('b') }}] [{{ '\u00e9x\u00e9'.strip('\u00e9') }}]")
case("m-case", "{{ s.upper() }} {{ 'ABC'.lower() }} {{ 'hello wORLD 1st'.title() }} {{ \"they're\".title() }} {{ 'hELLO'.capitalize() }} {{ 'aBc'.swapcase() }}")
case("m-replace", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'ab'.replace('', '.') }}")
case("m-find", "{{ s.find('l') }} {{ s.rfind('l') }} {{ s.find('zz') }} {{ s.count('l') }} {{ 'aaa'.count('aa') }} {{ s.index('w') }} {{ u.find('\u03b1') }}")
case("m-join", "{{ ', '.join(['a', 'b']) }} {{ '-'.join('abc') }} {{ ''.join([]) }}")
case("m-is", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ '\u00e9t\u00e9'.isalpha() }} {{ ' \\t'.isspace() }} {{ ''.isspace() }} {{ 'a1'.isalnum() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }}")
case("m-dict", "{{ d.get('k') }} {{ d.get('q') }} {{ d.get('q', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {% for k, v in d.items() %}{{ k }}{% endfor %}")
case("m-list", "{{ a.index(2) }} {{ b.count(1) }} {{ [1, 2, 1].count(1) }}")
case("m-misc", "{{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ '7'.zfill(3) }} {{ '-7'.zfill(4) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'pre-x'.removeprefix('pre-') }} {{ 'a\\nb\\r\\nc'.splitlines() }}")
case("m-unicode-index", "{{ u[4] }} {{ u|length }} {{ u.split()|length }} {{ u.split()[-1] }} {{ u[-1:] }}")

# --- dict / namespace / range globals ----------------------------------------------------
case("g-range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3, 1)|list }}")
case("g-dict", "{{ dict(a=1, b='x') }} {{ dict({'a': 1}, b=2) }} {{ dict() }}")
case("g-loop-mod", "{% for m in a %}{{ loop.index0 % 2 }}{% endfor %}")

# --- real chat templates ----------------------------------------------------------------------
def tmpl_from(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fp:
        return json.load(fp)["chat_template"]


QWEN3 = tmpl_from("data/tokenizers/qwen3/tokenizer_config.json")
LLAMA3 = tmpl_from("data/tokenizers/llama3/tokenizer_config.json")

CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

CHATML_GEN = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

MISTRAL_V01 = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"

MISTRAL_V02 = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

GEMMA = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"

PHI3 = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Z\u00fcrich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add numbers", "parameters": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}}},
]

def turns(*ts):
    """Messages from (role, content) pairs, a dict of further fields as a third item."""
    return [dict({"role": t[0], "content": t[1]}, **(t[2] if len(t) > 2 else {})) for t in ts]


CONVS = {
    "single": turns(("user", "Hello!")),
    "basic": turns(("user", "Hello!"), ("assistant", "Hi there. How can I help?"), ("user", "Tell me a joke.")),
    "system": turns(("system", "You are a helpful assistant."), ("user", "What is 2+2?"), ("assistant", "4")),
    "padded": turns(("system", "  Be brief.\n\n"), ("user", "\n  spaces around  \n"), ("assistant", "  ok  ")),
    "unicode": turns(
        ("user", "Gr\u00fc\u00df dich! \u4f60\u597d \U0001F600 \"quoted\" 'single' \\back"),
        ("assistant", "\u00c7a va \u2014 tr\u00e8s bien.\n\tTabbed."),
    ),
    "think": turns(
        ("user", "Solve x+1=2"),
        ("assistant", "<think>\nx = 2 - 1\n</think>\n\nx = 1"),
        ("user", "And x+2=5?"),
        ("assistant", "<think>\n\nsubtract 2\n\n</think>\n\n\nx = 3"),
    ),
    "reasoning-field": turns(
        ("user", "Q1"),
        ("assistant", "A1", {"reasoning_content": "\nthought one\n"}),
        ("user", "Q2"),
        ("assistant", "A2", {"reasoning_content": "thought two"}),
    ),
    "tools": turns(
        ("system", "You can call tools."),
        ("user", "Weather in Paris?"),
        ("assistant", "", {"tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]}),
        ("tool", "{\"temp\": 21}"),
        ("tool", "second result"),
        ("assistant", "It is 21 degrees."),
    ),
    "tools-string-args": turns(
        ("user", "Add 1 and 2"),
        ("assistant", "Let me add.", {"tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{\"x\": 1, \"y\": 2}"}}, {"name": "add", "arguments": {"x": 3.5, "y": -1}}]}),
        ("tool", "3"),
    ),
    "empty": turns(("user", ""), ("assistant", "")),
    "ten-turns": turns(*[t for k in range(10) for t in (
        ("user", "Question number %d: what is %d squared?" % (k, k)),
        ("assistant", "<think>\nSquare of %d.\n</think>\n\n%d squared is %d." % (k, k, k * k)),
    )]),
    "bad-alternation": turns(("user", "a"), ("user", "b")),
    "system-only": turns(("system", "sys")),
}

REAL = [
    ("qwen3", QWEN3, {}, ["single", "basic", "system", "padded", "unicode", "think", "reasoning-field", "tools", "tools-string-args", "empty", "ten-turns"]),
    ("llama3", LLAMA3, {"bos_token": "<|begin_of_text|>"}, ["single", "basic", "system", "padded", "unicode", "empty"]),
    ("llama31", LLAMA31, {"bos_token": "<|begin_of_text|>", "date_string": "01 Jan 2025"}, ["single", "basic", "system", "padded", "unicode", "tools", "empty"]),
    ("chatml", CHATML, {}, ["single", "basic", "system", "unicode", "empty"]),
    ("chatml-gen", CHATML_GEN, {}, ["basic", "system", "unicode", "think", "ten-turns"]),
    ("mistral-v01", MISTRAL_V01, {"bos_token": "<s>", "eos_token": "</s>"}, ["single", "basic", "system", "bad-alternation", "unicode"]),
    ("mistral-v02", MISTRAL_V02, {"bos_token": "<s>", "eos_token": "</s>"}, ["single", "basic", "system", "bad-alternation", "padded"]),
    ("zephyr", ZEPHYR, {"eos_token": "</s>"}, ["single", "basic", "system", "unicode"]),
    ("gemma", GEMMA, {"bos_token": "<bos>"}, ["single", "basic", "system", "padded", "bad-alternation"]),
    ("phi3", PHI3, {"eos_token": "<|endoftext|>"}, ["single", "basic", "system", "unicode"]),
    ("qwen25", QWEN25, {}, ["single", "basic", "system", "tools", "tools-string-args", "unicode"]),
]

for tname, tmpl, extra, convs in REAL:
    for conv in convs:
        # add_generation_prompt changes only the end: both for the first conversation
        for agp in ((False, True) if conv == convs[1] else (conv == "single",)):
            v = dict(extra)
            v["messages"] = CONVS[conv]
            v["add_generation_prompt"] = agp
            case("%s-%s%s" % (tname, conv, "-agp" if agp else ""), tmpl, v)
        if tname in ("qwen3", "qwen25", "llama31") and conv in ("basic", "tools", "system"):
            v = dict(extra)
            v["messages"] = CONVS[conv]
            v["tools"] = TOOLS
            v["add_generation_prompt"] = True
            case("%s-%s-with-tools" % (tname, conv), tmpl, v)
case("qwen3-no-thinking", QWEN3, {"messages": CONVS["basic"], "add_generation_prompt": True, "enable_thinking": False})
case("llama31-builtin-tools", LLAMA31, {"bos_token": "<|begin_of_text|>", "date_string": "01 Jan 2025", "builtin_tools": ["brave_search", "code_interpreter"], "messages": CONVS["basic"]})
case("llama31-tools-not-in-user", LLAMA31, {"bos_token": "<|begin_of_text|>", "date_string": "01 Jan 2025", "tools": TOOLS, "tools_in_user_message": False, "messages": CONVS["system"]})
case("gemma-system-error", GEMMA, {"bos_token": "<bos>", "messages": CONVS["system-only"]})


def main():
    out = sys.stdout
    out.write(json.dumps({"default_vars": DEFAULT}, ensure_ascii=False) + "\n")
    names = set()
    for name, tmpl, v in CASES:
        assert name not in names, name
        names.add(name)
        vars_ = DEFAULT if v is None else v
        rec = {"name": name, "template": tmpl, "vars": "default" if v is None else v}
        try:
            compiled = compile_template(tmpl)
            if re.search(r"\{\%-?\s*generation\s*-?\%\}", tmpl):
                kw = {k: x for k, x in vars_.items() if k not in ("messages", "add_generation_prompt")}
                text, idx = _render_with_assistant_indices(compiled, vars_.get("messages"), None, None,
                                                           vars_.get("add_generation_prompt", False), **kw)
                rec["out"] = text
                rec["gen"] = [list(p) for p in idx]
            else:
                rec["out"] = compiled.render(**vars_)
        except Exception as ex:  # every jinja2 and Python error is a failed render
            rec["error"] = True
            rec["why"] = "%s: %s" % (type(ex).__name__, str(ex).split("\n")[0][:200])
        out.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
