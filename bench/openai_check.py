"""What an application developer sees with the official OpenAI client against a running
``speccompile serve``: a strict json_schema answer, a forced tool call, top_logprobs, the
per-request speculation opt-out and streaming, checked and written as JSON.

    python bench/openai_check.py --base-url http://127.0.0.1:8000/v1 --json bench/results/X.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from openai import OpenAI

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "language", "stars", "topics"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "language": {"type": "string", "maxLength": 20},
                         "stars": {"type": "integer", "minimum": 0, "maximum": 10000000},
                         "topics": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 20}}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "repo", "schema": SCHEMA, "strict": True}}
PROMPT = ("Extract the repository as JSON: 'ripgrep (BurntSushi/ripgrep) is a line-oriented search tool written in "
          "Rust that recursively searches directories for a regex pattern; 52,000 stars; topics: cli, search, regex.'")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


def matches(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == set(SCHEMA["required"]) and isinstance(obj["stars"], int)
            and isinstance(obj["topics"], list) and all(isinstance(t, str) for t in obj["topics"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    out = {"base_url": args.base_url, "model": model, "checks": {}}
    msgs = [{"role": "user", "content": PROMPT}]

    def ask(**kw):
        t0 = time.perf_counter()
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=160, temperature=0, **kw)
        return r, time.perf_counter() - t0

    r, sec = ask(response_format=FORMAT)
    text = r.choices[0].message.content
    try:
        obj, parsed = json.loads(text), True
    except ValueError:
        obj, parsed = None, False
    plain, plain_sec = ask(response_format=FORMAT, extra_body={"speculative": False})
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=msgs, max_tokens=160, temperature=0, response_format=FORMAT, stream=True) if c.choices)
    out["checks"]["json_schema"] = {"text": text, "parses": parsed, "matches_schema": matches(obj),
                                    "finish_reason": r.choices[0].finish_reason, "seconds": sec,
                                    "identical_without_speculation": plain.choices[0].message.content == text,
                                    "plain_seconds": plain_sec, "streamed_identical": streamed == text}
    t0 = time.perf_counter()
    t = client.chat.completions.create(model=model, max_tokens=96, temperature=0, tools=[WEATHER],
                                       messages=[{"role": "user", "content": "Is it raining in Bergen right now?"}],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = t.choices[0].message.tool_calls or []
    args_ok = False
    if calls:
        try:
            a = json.loads(calls[0].function.arguments)
            args_ok = set(a) == {"city", "unit"} and a["unit"] in ("celsius", "fahrenheit")
        except ValueError:
            pass
    auto = client.chat.completions.create(model=model, max_tokens=96, temperature=0, tools=[WEATHER],
                                          messages=[{"role": "user", "content": "Is it raining in Bergen right now?"}])
    out["checks"]["tool_call"] = {"finish_reason": t.choices[0].finish_reason, "seconds": time.perf_counter() - t0,
                                  "calls": [c.model_dump() for c in calls], "valid_arguments": args_ok,
                                  "auto": {"finish_reason": auto.choices[0].finish_reason,
                                           "calls": [c.function.model_dump() for c in auto.choices[0].message.tool_calls or []],
                                           "content": auto.choices[0].message.content}}
    lp, _ = ask(logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    lp_plain, _ = ask(logprobs=True, top_logprobs=3, extra_body={"speculative": False})
    same = [(c.token, c.logprob) for c in content] == [(c.token, c.logprob) for c in lp_plain.choices[0].logprobs.content]
    out["checks"]["logprobs"] = {"tokens": len(content), "three_each": all(len(c.top_logprobs) == 3 for c in content),
                                 "identical_without_speculation": same}
    ok = (out["checks"]["json_schema"]["matches_schema"] and out["checks"]["json_schema"]["identical_without_speculation"]
          and out["checks"]["json_schema"]["streamed_identical"] and args_ok
          and out["checks"]["logprobs"]["three_each"] and same)
    out["all_passed"] = bool(ok)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("parses", "matches_schema", "valid_arguments",
                                                                     "identical_without_speculation", "three_each",
                                                                     "streamed_identical", "finish_reason")}
                      for k, v in out["checks"].items()}, indent=1))
    print("all passed" if ok else "SOME CHECK FAILED")


if __name__ == "__main__":
    main()
