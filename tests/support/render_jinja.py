#!/usr/bin/python3
"""Renders chat templates as transformers' apply_chat_template does (its Jinja environment:
sandboxed, trim_blocks, lstrip_blocks, loop controls, raise_exception), for the tests that
check ChatTemplate::jinja() against ChatTemplate::render().

usage: render_jinja.py CASES.json OUT.json
CASES: [{"template": str, "messages": [...], "add_generation_prompt": bool, "enable_thinking"?: bool}]
OUT:   [rendered text, ...]
"""
import json
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise ValueError(message)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        extra = {"enable_thinking": case["enable_thinking"]} if "enable_thinking" in case else {}
        out.append(env.from_string(case["template"]).render(
            messages=case["messages"], add_generation_prompt=case["add_generation_prompt"], **extra))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
