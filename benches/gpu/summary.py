"""The summary that benches/gpu/run.sh prints last: the parity tests' result
lines, then one table row per engine-bench run and batch (speeds as the
timed run measured them) and, for profiled runs, where a decode step's time
went (device timestamps, per step), the host's planning, recording and
submitting of a decode step with its submissions, and decode attention (attn_decode plus
attn_merge) as a share of the step, and the four layer products with the
bytes they read per second (their weights only, for 2-byte weights); then,
for profiled prefills, each layer product's time and arithmetic rate
(2 x tokens x weights per product, in TFLOP/s) and its kernel, and the
prefill's attention time; last, llama-bench's tables (run.sh's anchors).

    python3 benches/gpu/summary.py DIR   # DIR: run.sh's NN-label.txt files
"""

import pathlib
import re
import sys

SPEED = re.compile(r"^wgpu\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s*$", re.M)
SHAPE = re.compile(r"hidden (\d+), layers (\d+), heads (\d+)/(\d+) kv, head_dim (\d+), ffn (\d+)")
PROFILE = re.compile(r"^profile: wgpu batch (\d+), decode, (\d+) steps")
PREFILL = re.compile(r"^profile: wgpu batch (\d+), prefill of (\d+) tokens")
HOST = re.compile(
    r"\s*host per decode step: plan ([\d.]+) us, record ([\d.]+) us, submit ([\d.]+) us, "
    r"wait and read back ([\d.]+) us; ([\d.]+) submissions"
)
ROW = re.compile(r"^  (.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
PRODUCTS = ("qkv", "gate_up", "down", "o")


def product_weights(text):
    """Weights each layer product holds (all layers), or None without a
    shape line."""
    m = SHAPE.search(text)
    if not m:
        return None
    h, layers, nq, nkv, hd, ffn = map(int, m.groups())
    per_layer = {
        "qkv": (nq + 2 * nkv) * hd * h,
        "gate_up": 2 * ffn * h,
        "down": h * ffn,
        "o": h * nq * hd,
    }
    return {k: layers * v for k, v in per_layer.items()}


def prefill_profiles(text):
    """Per (batch, tokens): {product: (us, kernel names)} of the prefill
    profile."""
    out = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = PREFILL.match(line)
        if not m:
            continue
        groups = {}
        for row in lines[i + 2:]:
            r = ROW.match(row)
            if not r:
                break
            name, us = r.group(1), float(r.group(3))
            key = next((p for p in PRODUCTS if name.startswith(p + " ")), None)
            if name.startswith("attn_"):
                key = "attn"
            if key:
                total, kernels = groups.get(key, (0.0, set()))
                kernels.add(name.split(" ", 1)[-1])
                groups[key] = (total + us, kernels)
        out[(int(m.group(1)), int(m.group(2)))] = groups
    return out


def product_bytes(text):
    """Weight bytes each layer product reads per step (all layers), for
    2-byte weights; None for other dtypes or no shape line."""
    m = SHAPE.search(text)
    if not m or not re.search(r"random in (bf16|f16)", text):
        return None
    h, layers, nq, nkv, hd, ffn = map(int, m.groups())
    per_layer = {
        "qkv": (nq + 2 * nkv) * hd * h,
        "gate_up": 2 * ffn * h,
        "down": h * ffn,
        "o": h * nq * hd,
    }
    return {k: 2 * layers * v for k, v in per_layer.items()}


def decode_profiles(text):
    """Per batch: {kernel group: us per step} of the decode profile."""
    out = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = PROFILE.match(line)
        if not m:
            continue
        groups = {}
        for row in lines[i + 2:]:
            r = ROW.match(row)
            if not r:
                break
            name, us = r.group(1), float(r.group(3))
            if name.startswith("attn_decode") or name.startswith("attn_merge"):
                key = "attn"
            else:
                key = next((p for p in PRODUCTS if name.startswith(p + " ")), "other")
            groups[key] = groups.get(key, 0.0) + us
        out[int(m.group(1))] = groups
    return out


def main():
    d = pathlib.Path(sys.argv[1])
    tests = d / "tests"
    if tests.exists():
        for line in tests.read_text().splitlines():
            if line.startswith("test result") or line.startswith("tests exit"):
                print(line)
    print()
    head = ["run", "batch", "prefill tok/s", "decode tok/s", "step", "GB/s",
            "host us (submits)", "attn % of decode", "attn us"] + [f"{p} us (GB/s)" for p in PRODUCTS]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for f in sorted(d.glob("*.txt")):
        label = f.stem.split("-", 1)[1]
        text = f.read_text()
        prof = decode_profiles(text)
        nbytes = product_bytes(text)
        for m in SPEED.finditer(text):
            batch = int(m.group(1))
            cells = [label, str(batch), m.group(2), m.group(3), m.group(4), m.group(5)]
            # The host's plan, record and submit time of a decode step: what
            # the device waits on between steps, less what early
            # submissions overlap.
            h = HOST.match(text, m.end())
            cells.append(
                f"{sum(float(h.group(i)) for i in (1, 2, 3)):.0f} ({h.group(5)})" if h else "")
            g = prof.get(batch)
            if g:
                total = sum(g.values())
                cells += [f"{100 * g.get('attn', 0) / total:.1f}%", f"{g.get('attn', 0):.0f}"]
                for p in PRODUCTS:
                    us = g.get(p, 0.0)
                    bw = ""
                    if nbytes and us > 0 and batch == 1:
                        bw = f" ({nbytes[p] / us / 1e3:.0f})"
                    cells.append(f"{us:.0f}{bw}")
            else:
                cells += [""] * (2 + len(PRODUCTS))
            print("| " + " | ".join(cells) + " |")
    rows = []
    for f in sorted(d.glob("*.txt")):
        label = f.stem.split("-", 1)[1]
        text = f.read_text()
        weights = product_weights(text)
        for (batch, tokens), g in prefill_profiles(text).items():
            cells = [label, str(batch), str(tokens)]
            for p in PRODUCTS:
                us, kernels = g.get(p, (0.0, set()))
                rate = ""
                if weights and us > 0:
                    rate = f" ({2 * tokens * weights[p] / us / 1e6:.1f})"
                cells.append(f"{us / 1e3:.1f}{rate} {'/'.join(sorted(kernels))}")
            cells.append(f"{g.get('attn', (0.0, set()))[0] / 1e3:.1f}")
            rows.append(cells)
    if rows:
        print()
        head = ["run", "batch", "prefill tokens"] + [f"{p} ms (TFLOP/s) kernel" for p in PRODUCTS]
        head.append("attention ms")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")

    for f in sorted(d.glob("llama-*.md")):
        print()
        print(f"llama.cpp Vulkan, {f.stem[len('llama-'):]}:")
        print(f.read_text().rstrip())


if __name__ == "__main__":
    main()
