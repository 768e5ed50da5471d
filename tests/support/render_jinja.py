#!/usr/bin/python3
"""Renders chat templates as transformers' apply_chat_template does (its Jinja environment:
sandboxed, trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now, and its
tojson: json.dumps with ensure_ascii=False, keys in order), for the tests that check
ChatTemplate::jinja() against ChatTemplate::render().

usage: render_jinja.py CASES.json OUT.json
CASES: [{"template": str, "messages": [...], "add_generation_prompt": bool, "enable_thinking"?: bool,
         "tools"?: [...], "date_string"?: str}]
OUT:   [rendered text, ...]
"""
import json
import sys
from datetime import datetime

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise ValueError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.filters["tojson"] = tojson
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        extra = {k: case[k] for k in ("enable_thinking", "tools", "date_string") if k in case}
        out.append(env.from_string(case["template"]).render(
            messages=case["messages"], add_generation_prompt=case["add_generation_prompt"], **extra))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
