#!/usr/bin/env python3
"""Decode tokens/s of one streamed chat completion with and without a JSON
schema (constrained decoding), as a client sees it: tokens after the first
divided by the time from the first content chunk to the last. Requests
alternate (free, schema, free, schema, ...) so both sides share the
machine's state; medians are printed last. Standard library only."""

import argparse
import http.client
import json
import statistics
import time
import urllib.parse

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "story": {"type": "string", "maxLength": 4000},
        "characters": {"type": "array", "items": {"type": "string", "maxLength": 40}},
        "happy_ending": {"type": "boolean"},
    },
    "required": ["title", "story", "characters", "happy_ending"],
    "additionalProperties": False,
}


def run(url, body):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = last = None
    chunks = 0
    usage = None
    text = []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
                text.append(piece)
    conn.close()
    tokens = usage["completion_tokens"]
    return tokens, (last - first), "".join(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    base = {
        "model": json.loads(http_get(a.url, "/v1/models"))["data"][0]["id"],
        "messages": [{"role": "user", "content": "Write a long story about a dragon and a knight, as JSON."}],
        "max_tokens": a.max_tokens,
        "temperature": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rates = {"free": [], "schema": []}
    valid = 0
    for r in range(a.rounds):
        for side in ("free", "schema"):
            body = dict(base, seed=r)
            if side == "schema":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA, "strict": True}}
            tokens, span, text = run(a.url, body)
            if tokens > 2 and span > 0:
                rates[side].append((tokens - 1) / span)
            if side == "schema" and tokens < a.max_tokens:
                json.loads(text)
                valid += 1
            print(f"round {r} {side:6} {tokens:4} tokens {span:7.3f} s", flush=True)
    free, schema = statistics.median(rates["free"]), statistics.median(rates["schema"])
    print(f"schema outputs that ended and parsed: {valid}")
    print(f"| side | decode tok/s (median of {a.rounds}) |")
    print("|---|---|")
    print(f"| free text | {free:.1f} |")
    print(f"| json_schema | {schema:.1f} |")
    print(f"| cost | {100 * (1 - schema / free):.1f}% |")


def http_get(url, path):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", path)
    body = conn.getresponse().read()
    conn.close()
    return body


if __name__ == "__main__":
    main()
