"""Time to first token over a growing conversation and over clients that
share a long system prompt: tokenwire (prefix cache on, and off) against
llama.cpp's server (llama-cpp-python's `llama_cpp.server`) on the same GGUF
file, the same prompt text and the same threads. `run.sh` starts the
servers; this script only talks to them.

Conversation: every turn's prompt is the whole ChatML conversation so far
(system, the user turns, the replies) plus the new user turn, sent as the
very same text to tokenwire's `POST /v1/generate` and to llama.cpp's
`POST /v1/completions`, both streaming (SSE), greedy, one after the other.
The replies kept in the history are tokenwire's (cache on), so every side
gets identical prompts. Then the same turns through tokenwire's `session`
dialect (one WebSocket, the server renders the history) and `responses`
continuations (`previous_response_id` over HTTP, SSE).

Shared system prompt: CLIENTS requests one after another, each a ChatML
prompt of one ~1,000-token system prompt and its own question; time to first
token of each, on each server.

Prints one table per experiment, in milliseconds (median of ROUNDS).
"""
import argparse
import http.client
import json
import statistics
import time
import urllib.parse

from websockets.sync.client import connect

USER_TURNS = [
    "I want to plan a small vegetable garden behind my house. The space is about four by six "
    "metres and the soil looks quite heavy. Where should I start, and what should I do first?",
    "The spot gets about six hours of direct sun in summer, less in spring. Which vegetables "
    "grow well with that much light, and which ones should I avoid?",
    "Tomatoes and lettuce sound good, and maybe some beans. How far apart should I plant them, "
    "and should the rows run north to south?",
    "What kind of soil do they need? Should I add compost or manure before planting, and how "
    "much for a bed of that size?",
    "How often should I water them during a hot summer week, and is it better to water in the "
    "morning or in the evening?",
    "Some leaves on my tomatoes are turning yellow from the bottom up, and a few have brown "
    "spots. What could cause that, and what can I do?",
    "Snails are eating the lettuce every night. How can I keep them away without using poison, "
    "since my dog plays in the garden?",
    "When is the right time to harvest the first tomatoes, and should I pick them fully red or "
    "a little earlier?",
    "Can I grow herbs like basil and parsley next to the tomatoes, or do they compete for water "
    "and nutrients?",
    "What should I do with the garden when autumn comes? Should I pull everything out or leave "
    "the roots in the soil?",
    "Which vegetables could I plant for a winter harvest in a mild climate, and do they need any "
    "protection from frost?",
    "Thank you, this helps a lot. Can you summarise the whole plan in a few short steps that I can "
    "print and keep in the shed?",
]
SYSTEM = "You are a helpful gardening assistant. Answer clearly and briefly."

SHARED_SYSTEM_PARAGRAPHS = [
    "You are the support assistant of Greenleaf Tools, a company that makes garden tools, "
    "watering systems and small greenhouses for home gardeners.",
    "Always greet the customer politely, answer the question that was asked, and keep "
    "answers short unless the customer asks for details.",
    "Our product range: the Greenleaf Spade (carbon steel blade, ash handle, lifetime "
    "warranty), the Greenleaf Fork, the Trowel Set of three, the Pruning Shears Pro with "
    "replaceable blades, the Hose Reel 30 with a thirty metre hose, the Drip Kit for up to "
    "forty plants, the Rain Barrel 200, the Mini Greenhouse (two by three metres, "
    "polycarbonate panels) and the Seed Starter Tray with a clear lid.",
    "Warranty: hand tools have a lifetime warranty against breakage in normal use. Watering "
    "products have a two year warranty. Greenhouses have a five year warranty on the frame "
    "and two years on the panels. Customers need the order number or a receipt.",
    "Shipping: orders over fifty euros ship free within the country. Standard delivery "
    "takes three to five working days, express delivery one to two working days for a fee "
    "of nine euros. Greenhouses ship separately on a pallet and need a delivery appointment.",
    "Returns: unused products can be returned within thirty days for a full refund. The "
    "customer pays the return shipping unless the product was faulty. Refunds are made to "
    "the original payment method within fourteen days of receiving the return.",
    "Care advice: clean tools after use, dry them, and oil the blades before winter. Empty "
    "hoses and the drip kit before the first frost. Clean greenhouse panels with mild soap "
    "and water, never with solvents or abrasive sponges.",
    "If a customer is upset, apologise for the trouble, explain what you can do, and offer "
    "to pass the case to a human colleague by email at support@greenleaf.example.",
    "Never promise discounts, never share other customers' information, and never guess an "
    "order's status: ask for the order number and say that a colleague will check it.",
    "Opening hours of the phone line: Monday to Friday from eight to six, Saturday from "
    "nine to one. The online shop is always open.",
]
SHARED_QUESTIONS = [
    "How long is the warranty on the Mini Greenhouse?",
    "Can I return a spade I bought three weeks ago?",
    "How do I store the hose reel in winter?",
    "Does express delivery cost extra?",
    "Which product waters forty tomato plants?",
    "What are your phone opening hours on Saturday?",
    "How should I clean the greenhouse panels?",
    "Is shipping free for an order of sixty euros?",
]


def chatml(messages, generation_prompt=True):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def sse(base, path, body, first_event, collect):
    """POSTs `body` to `base+path` and reads server-sent events. Returns
    (ms to the first event `first_event` accepts, text `collect` gathers,
    the last event)."""
    u = urllib.parse.urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{base}{path}: {r.status} {r.read()[:300]!r}")
    first, text, ev = None, [], None
    for raw in r:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if first is None and first_event(ev):
            first = (time.perf_counter() - t0) * 1000
        text.append(collect(ev))
    c.close()
    return first, "".join(text), ev


def tokenwire_generate(base, prompt, max_tokens):
    """(time to first token, text, prompt tokens as the server counted them)."""
    ttft, text, last = sse(
        base,
        "/v1/generate",
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True},
        lambda e: e.get("type") == "token",
        lambda e: e.get("token", "") if e.get("type") == "token" else "",
    )
    return ttft, text, last["usage"]["prompt_tokens"]


def llama_completion(base, prompt, max_tokens):
    ttft, text, _ = sse(
        base,
        "/v1/completions",
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True},
        lambda e: bool(e.get("choices")),
        lambda e: e["choices"][0].get("text", "") if e.get("choices") else "",
    )
    return ttft, text, None


def system(nonce):
    """The system prompt, opened by a label unique to each run, so that no
    run finds another's prompts cached (its first 16-token block differs)."""
    return f"Conversation {nonce}. {SYSTEM}"


def conversation_raw(servers, max_tokens, nonce):
    """Per turn: prompt tokens and each server's time to first token."""
    rows = []
    history = [{"role": "system", "content": system(nonce)}]
    for said in USER_TURNS:
        history.append({"role": "user", "content": said})
        prompt = chatml(history)
        row = {}
        reply = None
        for name, base in servers.items():
            send = llama_completion if name == "llama.cpp" else tokenwire_generate
            ttft, text, tokens = send(base, prompt, max_tokens)
            row[name] = ttft
            if name == "tokenwire":
                reply, row["tokens"] = text, tokens
        history.append({"role": "assistant", "content": reply})
        rows.append(row)
    return rows


def conversation_session(base, max_tokens, nonce):
    u = urllib.parse.urlparse(base)
    out = []
    with connect(f"ws://{u.hostname}:{u.port}/ws/session", max_size=None) as ws:
        ws.send(json.dumps({"type": "session_init", "session_id": "bench", "job_id": "bench",
                            "conversation_context": [{"role": "system", "content": system(nonce)}]}))
        assert json.loads(ws.recv())["type"] == "session_ready"
        for i, said in enumerate(USER_TURNS):
            t0 = time.perf_counter()
            ws.send(json.dumps({"type": "prompt", "session_id": "bench", "content": said,
                                "message_index": 2 * i, "max_tokens": max_tokens,
                                "temperature": 0}))
            first = None
            while True:
                v = json.loads(ws.recv())
                if v["type"] == "stream_chunk" and first is None:
                    first = (time.perf_counter() - t0) * 1000
                if v["type"] == "response":
                    break
                if v["type"] == "error":
                    raise RuntimeError(v)
            out.append(first)
    return out


def conversation_responses(base, max_tokens, nonce):
    out = []
    previous = None
    for i, said in enumerate(USER_TURNS):
        body = {"input": said, "max_output_tokens": max_tokens, "temperature": 0,
                "stream": True}
        # `instructions` do not carry over to a continuation (OpenAI's
        # rule, and this server's): sent every turn, as clients do.
        body["instructions"] = system(nonce)
        if previous:
            body["previous_response_id"] = previous
        ids = []

        def collect(e):
            if e.get("type") in ("response.completed", "response.incomplete"):
                ids.append(e["response"]["id"])
            return ""

        ttft, _, _ = sse(base, "/v1/responses", body,
                      lambda e: e.get("type") == "response.output_text.delta", collect)
        previous = ids[-1]
        out.append(ttft)
    return out


def shared_prompt(servers, clients, nonce):
    paragraphs = SHARED_SYSTEM_PARAGRAPHS * 2 + SHARED_SYSTEM_PARAGRAPHS[:2]
    shared = f"Deployment {nonce}. " + " ".join(paragraphs)
    rows = []
    for i in range(clients):
        q = SHARED_QUESTIONS[i % len(SHARED_QUESTIONS)]
        prompt = chatml([{"role": "system", "content": shared}, {"role": "user", "content": q}])
        row = {"client": i + 1}
        for name, base in servers.items():
            send = llama_completion if name == "llama.cpp" else tokenwire_generate
            row[name], _, tokens = send(base, prompt, 8)
            if name == "tokenwire":
                row["tokens"] = tokens
        rows.append(row)
    return rows


def median_rows(runs, keys):
    out = []
    for i in range(len(runs[0])):
        row = dict(runs[0][i])
        for k in keys:
            row[k] = statistics.median(r[i][k] for r in runs)
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenwire", required=True, help="base URL, prefix cache on")
    p.add_argument("--tokenwire-off", help="base URL, --prefix-cache off")
    p.add_argument("--llama", help="base URL of llama_cpp.server")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--clients", type=int, default=8)
    a = p.parse_args()
    servers = {"tokenwire": a.tokenwire}
    if a.tokenwire_off:
        servers["tokenwire (cache off)"] = a.tokenwire_off
    if a.llama:
        servers["llama.cpp"] = a.llama
    names = list(servers)

    rounds = range(a.rounds)
    raw = median_rows([conversation_raw(servers, a.max_tokens, f"raw-{r}") for r in rounds], names)
    sess = [conversation_session(a.tokenwire, a.max_tokens, f"session-{r}") for r in rounds]
    resp = [conversation_responses(a.tokenwire, a.max_tokens, f"responses-{r}") for r in rounds]
    print("\nConversation: time to first token (ms), median of", a.rounds)
    print("| turn | prompt tokens | " + " | ".join(f"{n} generate" if n.startswith("tokenwire") else n for n in names)
          + " | tokenwire session | tokenwire responses |")
    print("|---:|---:|" + "---:|" * (len(names) + 2))
    for i, row in enumerate(raw):
        s = statistics.median(r[i] for r in sess)
        rs = statistics.median(r[i] for r in resp)
        print(f"| {i + 1} | {row['tokens']} | " + " | ".join(f"{row[n]:,.0f}" for n in names)
              + f" | {s:,.0f} | {rs:,.0f} |")
    first, last = raw[0], raw[-1]
    print("turn 12 / turn 1:", ", ".join(f"{n} {last[n] / first[n]:.2f}x" for n in names))
    if "llama.cpp" in servers:
        print(f"turn 12 tokenwire / llama.cpp: {last['tokenwire'] / last['llama.cpp']:.2f}x")

    shared = median_rows([shared_prompt(servers, a.clients, r) for r in rounds], names)
    print(f"\nShared system prompt ({shared[0]['tokens']} tokens with the first question), "
          f"{a.clients} clients one after another: time to first token (ms)")
    print("| client | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for row in shared:
        print(f"| {row['client']} | " + " | ".join(f"{row[n]:,.0f}" for n in names) + " |")
    for n in names:
        later = max(r[n] for r in shared[1:])
        print(f"{n}: clients 2..{a.clients} at most {later / shared[0][n]:.2f}x the first's")


if __name__ == "__main__":
    main()
