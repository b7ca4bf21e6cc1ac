#!/usr/bin/env python3
"""The official OpenAI Python SDK and LangChain's `OpenAIEmbeddings`
against tokenwire's `POST /v1/embeddings` (both pinned in requirements.txt):

    python embeddings_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K --size 64

Checks: the SDK's default call (which asks for base64 and decodes it) gives
the vectors a float request gives, each reply strictly valid as the SDK's
`CreateEmbeddingResponse`; vectors are unit length, `--size` long, in input
order, with usage; `dimensions` cuts them; token-id inputs work; errors are
the SDK's exceptions; LangChain embeds documents and a query to the same
vectors. Each check prints `ok: <name>` or `FAIL: <name>: <reason>`; exit
status 0 only when all passed.

With `--one-request-per-minute` (a server started with
`--anon-requests-per-minute 1`) it checks the limit instead: LangChain's
`embed_documents` sends many documents as one request, which is admitted
and answered whole, and the SDK's next call is refused with its
`RateLimitError` and a `Retry-After`.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, List

import openai
from langchain_openai import OpenAIEmbeddings
from openai import OpenAI
from openai.types import CreateEmbeddingResponse

from sdk_strict import fail, run_checks, validate_strict as strict

TEXTS = ["Once upon a time", "Lily and Ben went to the park.", "A red ball"]


def close(a: List[float], b: List[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b))


def norm(v: List[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--one-request-per-minute", action="store_true")
    args = ap.parse_args()
    sdk = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    checks: List[tuple[str, Callable[[], None]]] = []

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    def floats(inputs, **kw) -> CreateEmbeddingResponse:
        raw = sdk.embeddings.with_raw_response.create(model=args.model, input=inputs,
                                                      encoding_format="float", **kw)
        return strict(CreateEmbeddingResponse, raw.http_response.text, "a float reply")

    @check
    def the_default_base64_call_decodes_to_the_float_vectors() -> None:
        raw = sdk.embeddings.with_raw_response.create(model=args.model, input=TEXTS)
        if not isinstance(raw.http_response.json()["data"][0]["embedding"], str):
            fail("the SDK's default call did not get base64", raw.http_response.text)
        got = raw.parse()
        want = floats(TEXTS)
        for i, (g, w) in enumerate(zip(got.data, want.data)):
            if not close(g.embedding, w.embedding):
                fail(f"input {i}: base64 {g.embedding[:4]}... vs float {w.embedding[:4]}...")

    @check
    def vectors_are_unit_length_in_order_with_usage() -> None:
        r = floats(TEXTS)
        if [d.index for d in r.data] != [0, 1, 2] or r.object != "list" or r.model != args.model:
            fail(f"shape {r!r}")
        for d in r.data:
            if len(d.embedding) != args.size or abs(norm(d.embedding) - 1) > 1e-5:
                fail(f"input {d.index}: {len(d.embedding)} values, norm {norm(d.embedding)}")
        if r.usage.prompt_tokens < len(TEXTS) or r.usage.total_tokens != r.usage.prompt_tokens:
            fail(f"usage {r.usage!r}")
        alone = floats(TEXTS[1]).data[0].embedding
        if not close(alone, r.data[1].embedding):
            fail("an input alone gets another vector than in a batch")
        if close(r.data[0].embedding, r.data[1].embedding):
            fail("two texts got the same vector")

    @check
    def dimensions_cut_and_renormalize() -> None:
        full = floats(TEXTS[0]).data[0].embedding
        cut = floats(TEXTS[0], dimensions=8).data[0].embedding
        n = norm(full[:8])
        if len(cut) != 8 or not close(cut, [x / n for x in full[:8]]):
            fail(f"dimensions=8 gave {cut}")

    @check
    def token_ids_are_inputs_too() -> None:
        r = floats([[1, 400, 27], [1, 403]])
        if len(r.data) != 2 or close(r.data[0].embedding, r.data[1].embedding):
            fail(f"ids gave {r!r}")

    @check
    def errors_are_the_sdk_s_exceptions() -> None:
        try:
            sdk.embeddings.create(model=args.model, input="")
            fail("an empty input was accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "input":
                fail(f"empty input: {e.body!r}")
        try:
            sdk.embeddings.create(model="not-" + args.model, input="a")
            fail("another model was accepted")
        except openai.NotFoundError:
            pass
        try:
            sdk.embeddings.create(model=args.model, input="a", dimensions=args.size + 1)
            fail("too many dimensions were accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "dimensions":
                fail(f"dimensions: {e.body!r}")

    def one_request_per_minute() -> None:
        lc = OpenAIEmbeddings(model=args.model, base_url=args.base_url, api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0)
        docs = [f"{TEXTS[i % 3]} ({i})" for i in range(150)]
        vectors = lc.embed_documents(docs)
        if len(vectors) != 150 or not all(len(v) == args.size for v in vectors):
            fail(f"embed_documents gave {len(vectors)} vectors for 150 documents")
        try:
            sdk.embeddings.create(model=args.model, input="a")
            fail("a second request in the minute was accepted")
        except openai.RateLimitError as e:
            if e.body.get("code") != "rate_limit_exceeded" or not e.response.headers.get("retry-after"):
                fail(f"refused without the API's code or Retry-After: {e.body!r}")

    @check
    def langchain_embeds_documents_and_queries() -> None:
        # LangChain counts tokens with tiktoken unless told not to, which
        # only OpenAI's own models match (as vLLM's docs say too).
        lc = OpenAIEmbeddings(model=args.model, base_url=args.base_url, api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0)
        docs = lc.embed_documents(TEXTS)
        want = floats(TEXTS).data
        if len(docs) != 3 or not all(close(d, w.embedding) for d, w in zip(docs, want)):
            fail("embed_documents differs from the SDK's vectors")
        if not close(lc.embed_query(TEXTS[2]), want[2].embedding):
            fail("embed_query differs from the SDK's vector")

    if args.one_request_per_minute:
        return run_checks([("many_inputs_are_one_request_to_the_limit", one_request_per_minute)])
    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
