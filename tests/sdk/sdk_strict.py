"""What the SDK checks share: a failed check, strict validation of a
server's JSON against the official SDK's own pydantic types (strict mode,
and no field the SDK does not know, at any depth), and the structured-output
model the checks ask for."""

from __future__ import annotations

import traceback
from typing import Annotated, Any, Callable, List, Literal, Optional, Tuple, Type

import pydantic


class Hero(pydantic.BaseModel):
    """A structured output small models can always finish: bounded fields
    and no others (`extra="forbid"` writes `additionalProperties: false`)."""
    model_config = pydantic.ConfigDict(extra="forbid")
    name: Annotated[str, pydantic.Field(min_length=1, max_length=16)]
    age: Annotated[int, pydantic.Field(ge=1, le=99)]
    place: Literal["forest", "castle", "sea"]
    brave: bool


def run_checks(checks: List[Tuple[str, Callable[[], None]]]) -> int:
    """Runs each (name, check), printing `ok: name` or `FAIL: name: reason`
    (any exception fails a check, with its trace), then how many passed;
    returns the process exit status (0 only when all passed)."""
    failed = 0
    for name, fn in checks:
        try:
            fn()
            print(f"ok: {name}", flush=True)
        except CheckFailed as e:
            failed += 1
            print(f"FAIL: {name}: {e}", flush=True)
        except Exception:  # noqa: BLE001 - any other error is a failed check, with its trace
            failed += 1
            print(f"FAIL: {name}: {traceback.format_exc()}", flush=True)
    print(f"{len(checks) - failed} of {len(checks)} checks passed", flush=True)
    return 1 if failed else 0


class CheckFailed(Exception):
    """A check's expectation was not met; the message says which and shows the frame."""


def fail(reason: str, raw: Optional[str] = None) -> None:
    """Raises CheckFailed with the reason and, when given, the offending frame's text."""
    raise CheckFailed(reason if raw is None else f"{reason}\n    frame: {raw}")


def find_extras(value: Any, path: str = "$") -> List[str]:
    """Lists, recursively, every field that landed in a model's `model_extra`."""
    found: List[str] = []
    if isinstance(value, pydantic.BaseModel):
        for key in value.model_extra or {}:
            found.append(f"{path}.{key}")
        for name in type(value).model_fields:
            found += find_extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found += find_extras(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += find_extras(item, f"{path}.{key}")
    return found


def validate_strict(
    model: Type[pydantic.BaseModel], raw: str, what: str, allowed: Tuple[str, ...] = ()
) -> Any:
    """Validates JSON text against an SDK model in strict mode, with no unknown
    fields but those named in `allowed` (at any depth)."""
    try:
        parsed = model.model_validate_json(raw, strict=True)
    except pydantic.ValidationError as err:
        fail(f"{what} is not strictly valid as the SDK's {model.__name__}:\n{err}", raw)
    extras = [e for e in find_extras(parsed) if e.rsplit(".", 1)[-1] not in allowed]
    if extras:
        fail(f"{what} has fields the SDK's {model.__name__} does not know: {', '.join(extras)}", raw)
    return parsed


def drop_unscored_first(body: Any) -> Any:
    """A Completions body (reply or chunk) with the first entry of each
    choice's `logprobs` arrays left out where it is the unscored first
    token of an echoed prompt (`token_logprobs[0]` and `top_logprobs[0]`
    null). OpenAI's API answers null there (as vLLM does, and
    lm-evaluation-harness reads), but the SDK's generated `Completion`
    admits no null in those lists (its parser does not validate), so
    strict validation checks the rest."""
    for c in body.get("choices", []):
        lp = c.get("logprobs") or {}
        scores, tops = lp.get("token_logprobs") or [0], lp.get("top_logprobs") or [0]
        if scores[0] is None and tops[0] is None:
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                lp[key] = lp.get(key, [None])[1:]
    return body

