"""Speculative decoding by prompt lookup, measured end to end: the same
Chat Completions requests (streamed, greedy) to two tokenwire servers on the
same GGUF file, one with `--draft-tokens 0` (off) and one with drafting on,
one request at a time, alternating. `run.sh` starts the servers.

Tasks: answers that copy their prompt (repeat a passage, edit a function,
extract sentences), where guesses are often right, and one that copies
nothing, where they cost what a wasted guess costs. For each: the answer's
tokens, decode speed (tokens after the first per second, from the first
streamed token to the last; median of the rounds) on each server, and the
speed-up; the draft tokens fed and confirmed per answer, read from the
drafting server's /metrics, and the tokens per engine step they make
(tokens / (tokens - confirmed): exact, where wall-clock speeds on a shared
machine are not). The
two servers must write the same answer (greedy decoding is exact under
speculation); a difference is printed and fails the run.
"""
import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse

LINCOLN = open("benches/texts/lincoln-1861.txt", encoding="utf-8").read()
PASSAGE = " ".join(LINCOLN.split()[:140])
CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        price = item["price"] * item["quantity"]
        if item.get("discount"):
            price = price - price * item["discount"]
        total = total + price
    total = total + total * tax_rate
    return round(total, 2)
'''
TASKS = [
    ("repeat a passage", f"Repeat the following text exactly, word for word:\n\n{PASSAGE}"),
    ("edit code", "Rewrite this Python function so that the variable `total` is called "
     f"`amount` everywhere. Reply with the code only.\n\n{CODE}"),
    ("extract", "Copy the first three sentences of this text, then stop.\n\n"
     + " ".join(LINCOLN.split()[:220])),
    ("free answer", "Write a short story about a lighthouse keeper and a storm."),
]


def stream(base, model, prompt, max_tokens):
    """One streamed chat completion: (text, tokens, first, last) with the
    arrival times of the first and last content chunks."""
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {
        "model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"{base}: HTTP {resp.status}: {resp.read()[:300]!r}")
    text, tokens, first, last = "", 0, None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for c in chunk.get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                text += piece
    conn.close()
    return text, tokens, first, last


def model_name(base):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def draft_counts(base):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", "/metrics")
    counts = {}
    for line in conn.getresponse().read().decode().splitlines():
        for name in ("tokenwire_draft_tokens_total", "tokenwire_draft_tokens_accepted_total"):
            if line.startswith(name + " "):
                counts[name] = float(line.split()[1])
    return counts.get("tokenwire_draft_tokens_total", 0), counts.get(
        "tokenwire_draft_tokens_accepted_total", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", required=True)
    ap.add_argument("--on", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    a = ap.parse_args()
    models = {base: model_name(base) for base in (a.off, a.on)}
    print(f"{'task':<18} {'tokens':>6} {'off tok/s':>10} {'on tok/s':>10} {'speed-up':>8} "
          f"{'drafted':>8} {'confirmed':>9} {'tok/step':>8}")
    same = True
    for name, prompt in TASKS:
        speeds = {a.off: [], a.on: []}
        texts = {}
        drafted = confirmed = 0
        for _ in range(a.rounds):
            for base in (a.off, a.on):
                before = draft_counts(base) if base == a.on else (0, 0)
                text, tokens, first, last = stream(base, models[base], prompt, a.max_tokens)
                if base == a.on:
                    after = draft_counts(base)
                    drafted += after[0] - before[0]
                    confirmed += after[1] - before[1]
                if tokens > 1 and last > first:
                    speeds[base].append((tokens - 1) / (last - first))
                texts.setdefault(base, []).append((text, tokens))
        # Every round's answer, on both servers, is the first one's.
        answers = set(texts[a.off] + texts[a.on])
        (t_on, n_on) = texts[a.on][0]
        if len(answers) != 1:
            same = False
            print(f"  {name}: {len(answers)} different answers")
        off, on = statistics.median(speeds[a.off]), statistics.median(speeds[a.on])
        print(f"{name:<18} {n_on:>6} {off:>10.1f} {on:>10.1f} {on / off:>7.2f}x "
              f"{drafted / a.rounds:>8.0f} {confirmed / a.rounds:>9.0f} "
              f"{n_on / max(n_on - confirmed / a.rounds, 1):>8.2f}")
    if not same:
        sys.exit("the servers wrote different answers")


main()
