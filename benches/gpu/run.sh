#!/usr/bin/env bash
# On a GPU machine (see benches/gpu/build.sh), from the repository root:
#   tests           the wgpu parity tests (CI=true: a missing adapter fails)
#   bench:SHAPE     engine-bench on SHAPE (tinyllama-1.1b, llama-3.2-1b) in
#                   bf16, batch 1, 8 and 32, 128-token prompts, 32 decode
#                   steps, with the kernel profile
#   long:SHAPE      batch 1 at a 1,024-token prompt, 32 decode steps, with
#                   the profile: decode attention's share of a step at
#                   1,024-1,056 cached tokens; by the base build as well
#                   where build.sh made one (BASE=...)
#   base:SHAPE      this build against the base build, alternating, two
#                   rounds (ROUNDS=N: N): batch 1, 8 and 32, 128-token
#                   prompts, 32 steps
#   tune:SHAPE      the switches of the decode attention split and of the
#                   mat-vec, each against the default: --mat-vec-unroll 2
#                   and 4, --no-fused-norm (batch 1 and 8, 128-token
#                   prompts); --decode-workgroups 128 and 2048,
#                   --decode-min-split 16 and 64 (batch 1, 1,024-token
#                   prompt)
#   ab:SHAPE        the earlier kernel choices, each against its alternative
#                   on SHAPE (no profile): batch 32 on the wide mat-vec
#                   (default) vs the tiled matmul past 8 rows
#                   (--mat-vec-rows 8), and batch 1 and 8 with SiLU and the
#                   norms fused into the mat-vecs and subgroup reductions
#                   (default) vs each without (--no-fused-glu,
#                   --no-fused-norm, --no-subgroups)
#   coop:SHAPE      cooperative-matrix products: their parity tests
#                   (TOKENWIRE_REQUIRE_COOP=1: failing where the card
#                   offers no usable configuration), then the default
#                   (passes of 16+ rows on coop) against --no-coop,
#                   alternating, two rounds (batch 1, 8, 16, 32, 64;
#                   128-token prompts: prefills of 128 to 8,192 tokens),
#                   --coop-rows 4 and 64 (batch 4, 8, 16), --coop-slab 32
#                   (batch 1 and 32: --coop takes 64 where it fits), and
#                   coop profiled at batch 32 (coop in prefill and
#                   decode)
#   quick:SHAPE     coop:SHAPE cut short: the kernels' coop parity tests,
#                   then one round with --no-coop and without (batch 1 and
#                   32, 512-token prompt)
#   loops:SHAPE     shaders without wgpu's loop counters (the default)
#                   against --loop-bounding, alternating, two rounds (batch
#                   1, 8 and 32, 128-token prompts), then --loop-bounding
#                   profiled at batch 1 (bench:SHAPE profiles the default)
#   splitk:SHAPE    the coop products' k split and wide tile against their
#                   alternatives (--coop-split 0, --coop-tile 128), coop
#                   from 8 rows (batch 8), then the default profiled at
#                   batch 8 and 32 (128-token prompts)
#   table:SHAPE     the short call for the headline table: transformers
#                   on SHAPE, then engine-bench's defaults (batch 1, 8 and
#                   32, 128-token prompts) and the same with the default
#                   coop tile for every pass (--coop-wide-rows 1000000)
#   parity          the parity tests of attention, mat-vec and the coop products
#                   only (wgpu_kernels, wgpu_engine; and the engine's small
#                   models split every 8 positions over several layers, which
#                   reuse the folded merge's counters; steps submitted in
#                   pieces against whole; the fused mat-vec variants, RoPE's
#                   included, against the separate kernels): a short call's
#                   tests
#   attn:SHAPE      decode attention as it now stands (splits merged in the
#                   last split's workgroup, K rows loaded 16 vectors at a
#                   time) against each change alone undone (--no-fold-merge:
#                   the merge's own dispatch; --decode-k-chunk 1),
#                   alternating, two rounds: batch 1 and 32 at 128-token
#                   prompts, batch 1 at 1,024; then the default profiled at
#                   batch 1 at both lengths
#   batch32:SHAPE   coop decode batches as they now stand (the tall tile,
#                   128 weight rows by 32 tokens at side 16, for passes
#                   that fit it; split products summed by split_sum's
#                   dispatch) against the square tile (--no-coop-tall) and
#                   against split sums folded into the split that finishes
#                   last (--coop-fold), alternating, two rounds: batch
#                   16 and 32 at 128-token prompts; batch 8 on mat-vec (the
#                   default) against coop from 8 rows (--coop-rows 8, the
#                   tall tile), one round; then the default profiled at
#                   batch 32
#   submit:SHAPE    steps submitted in growing runs of dispatches (the
#                   default: the first 8, then 16, 32, ...) against one
#                   submission a step (--first-submit 0), alternating, one
#                   round (ROUNDS=N: N): batch 1, 8 and 32 at 128-token
#                   prompts, batch 1 at 1,024 (every run prints the host's
#                   share of a decode step)
#   rope:SHAPE      the batch-1 step's products: RoPE and the K/V write
#                   fused into the q|k|v mat-vec (the default: five
#                   dispatches a decode layer) against their own rope_kv
#                   dispatch (--no-fused-rope), and mat-vec's weight loads
#                   in flight re-measured now that the loop counters are
#                   gone (--mat-vec-unroll 4; unroll 1 won only while they
#                   were there), alternating, one round (ROUNDS=N: N):
#                   batch 1 and 8 at 128-token prompts; then the default
#                   sampling at temperature 0.8, top-p 0.95 (what the
#                   sampling kernel's searches cost against greedy's one
#                   argmax), profiled
#   switches:SHAPE  every default not yet measured on a GPU against its
#                   alternative, one run each, in one call (sized for
#                   the 15 minutes a session gets; the parts above
#                   repeat each comparison in alternating rounds): the
#                   defaults at batch 1, 8, 32 (128-token prompts) and
#                   at batch 1 at 1,024; RoPE in its own dispatch
#                   (--no-fused-rope); one submission a step
#                   (--first-submit 0); decode attention's merge in its
#                   own dispatch (--no-fold-merge, at 128 and 1,024) and
#                   K rows one vector at a time (--decode-k-chunk 1);
#                   coop decode batches on the square tile (--no-coop-tall)
#                   and with folded split sums (--coop-fold); mat-vec
#                   unroll 4; top-p sampling, profiled (radix select),
#                   then read back and sampled on the host (--host-sample),
#                   then on the device with a frequency penalty; then the
#                   defaults profiled at batch 1 and 32
#   hf:SHAPE        transformers eager on SHAPE only
#   next:SHAPE      prefill passes of 512, 1,024 and 4,096 rows
#                   (--max-rows-per-pass; batch 8 and 32, 128-token
#                   prompts, and batch 1 at 1,024; the 512 runs are the
#                   defaults' batch 8 and 32), and decode attention
#                   in one split (--decode-min-split 100000) or splits of
#                   256 against the default, at 128 and 1,024 cached
#                   tokens; then batch 1 profiled
# With no arguments: tests, bench on both shapes, and anchor, which can take
# longer than the device tool's 10 minutes per command; then split them
# over calls, e.g. `run.sh tests bench:tinyllama-1.1b long:tinyllama-1.1b
# base:tinyllama-1.1b tune:tinyllama-1.1b` (about 6 minutes on an H200, by
# estimate) and `run.sh bench:llama-3.2-1b anchor`.
# Output goes to stdout and, when $OUT is set, to $OUT/gpu-bench.log; a
# summary table of every engine-bench run of the call comes last.
# EB_ARGS, when set, is added to every engine-bench run of the bf16 shapes
# (e.g. EB_ARGS=--no-coop).
set -uo pipefail
cd "$(dirname "$0")/../.."
log=${OUT:-/tmp}/gpu-bench.log
exec > >(tee -a "$log") 2>&1
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests bench:tinyllama-1.1b bench:llama-3.2-1b anchor)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# The test binaries look for fixtures and models under the checkout they
# were built in; point that path at this copy.
root=$(cat .gpu/root)
if [ ! -e "$root" ]; then
    mkdir -p "$(dirname "$root")"
    ln -s "$PWD" "$root"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "build $(cat .gpu/commit 2>/dev/null), base $(cat .gpu/base 2>/dev/null || echo none)"
quiet() { grep -v XDG_RUNTIME_DIR; }
# Every engine-bench run's output, one file each, for the summary.
runs=$(mktemp -d)
n=0
# eb LABEL BINARY LIMIT ARGS...: one engine-bench run, kept for the summary.
eb() {
    local label=$1 bin=$2 limit=$3
    shift 3
    n=$((n + 1))
    echo "-- $label: $*"
    timeout "$limit" ".gpu/bin/$bin" "$@" 2>&1 | quiet | tee "$runs/$(printf %02d $n)-$label.txt"
}
has_base() {
    [ -x .gpu/bin/engine-bench-base ] && return 0
    echo "no .gpu/bin/engine-bench-base: run build.sh with BASE=<revision>"
    return 1
}
bf16() { echo --shape "$1" --backend wgpu --dtype bf16 --steps 32 ${EB_ARGS:-}; }
for part in "${parts[@]}"; do
    case $part in
    tests)
        echo "== parity tests =="
        status=0
        # A cold machine compiles every pipeline on first use: on an H200
        # wgpu_kernels took 32 s warm but ran past 150 s cold, so the limit
        # is generous (a hang still ends inside a 10-minute call).
        for t in wgpu_kernels wgpu_engine wgpu_sample; do
            CI=true timeout 360 ".gpu/bin/$t" -q 2>&1 | quiet | tee -a "$runs/tests" || status=1
        done
        # The SmolLM2 file is too big to carry (98 MB): without CI=true its
        # tests skip with their reason instead of failing.
        timeout 60 .gpu/bin/wgpu_gguf -q 2>&1 | quiet | tee -a "$runs/tests" || status=1
        echo "tests exit: $status" | tee -a "$runs/tests"
        ;;
    parity)
        echo "== attention and coop parity tests =="
        for t in wgpu_kernels wgpu_engine; do
            CI=true TOKENWIRE_REQUIRE_COOP=1 timeout 240 ".gpu/bin/$t" -q attention coop prefill mat_vec fused big_model early_submissions 2>&1 | quiet | tee -a "$runs/tests"
        done
        ;;
    table:*)
        shape=${part#table:}
        echo "== $shape: transformers and tokenwire's defaults =="
        PYTHONUNBUFFERED=1 timeout 100 python3 benches/gpu/hf_anchor.py "$shape"
        # shellcheck disable=SC2046
        {
            eb defaults engine-bench 60 $(bf16 "$shape") --batch 1,8,32 --prompt 128
            eb square-only engine-bench 60 $(bf16 "$shape") --batch 1,8,32 --prompt 128 \
                --coop-wide-rows 1000000
        }
        ;;
    splitk:*)
        shape=${part#splitk:}
        echo "== $shape: split k and the wide coop tile against their alternatives =="
        # shellcheck disable=SC2046
        {
            eb default engine-bench 90 $(bf16 "$shape") --batch 1,8,32 --prompt 128
            eb no-split engine-bench 90 $(bf16 "$shape") --batch 1,8,32 --prompt 128 --coop-split 0
            eb wide engine-bench 90 $(bf16 "$shape") --batch 1,8,32 --prompt 128 --coop-tile 128
            eb coop-rows-8 engine-bench 60 $(bf16 "$shape") --batch 8 --prompt 128 --coop-rows 8
            eb profile engine-bench 120 $(bf16 "$shape") --batch 8,32 --prompt 128 --profile
        }
        ;;
    bench:*)
        shape=${part#bench:}
        echo "== engine-bench $shape =="
        # shellcheck disable=SC2046
        eb "bench-$shape" engine-bench 280 $(bf16 "$shape") --batch 1,8,32 --prompt 128 --profile
        ;;
    long:*)
        shape=${part#long:}
        echo "== $shape at 1,024 cached tokens =="
        # shellcheck disable=SC2046
        eb "long-$shape" engine-bench 120 $(bf16 "$shape") --batch 1 --prompt 1024 --profile
        # shellcheck disable=SC2046
        has_base && eb "long-$shape-base" engine-bench-base 120 $(bf16 "$shape") \
            --batch 1 --prompt 1024 --profile
        ;;
    base:*)
        shape=${part#base:}
        echo "== $shape: this build against the base build =="
        if has_base; then
            for round in $(seq 1 "${ROUNDS:-2}"); do
                for b in engine-bench-base engine-bench; do
                    # shellcheck disable=SC2046
                    eb "$b-r$round" "$b" 120 $(bf16 "$shape") --batch 1,8,32 --prompt 128
                done
            done
        fi
        ;;
    tune:*)
        shape=${part#tune:}
        echo "== $shape: the split and mat-vec switches =="
        # shellcheck disable=SC2046
        {
            eb default engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128
            eb unroll-2 engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --mat-vec-unroll 2
            eb unroll-4 engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --mat-vec-unroll 4
            eb no-fused-norm engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --no-fused-norm
            eb p1024 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024
            eb p1024-wg128 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-workgroups 128
            eb p1024-wg2048 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-workgroups 2048
            eb p1024-min16 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-min-split 16
            eb p1024-min64 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-min-split 64
        }
        ;;
    ab:*)
        shape=${part#ab:}
        echo "== kernel choices on $shape =="
        # shellcheck disable=SC2046
        {
            eb ab-b32 engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 32
            eb ab-b32-tiled engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 32 --mat-vec-rows 8
            eb ab-default engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 1,8
            eb ab-no-fused-glu engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 1,8 --no-fused-glu
            eb ab-no-fused-norm engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 1,8 --no-fused-norm
            eb ab-no-subgroups engine-bench 120 $(bf16 "$shape") --prompt 128 --batch 1,8 --no-subgroups
        }
        ;;
    coop:*)
        shape=${part#coop:}
        echo "== $shape: cooperative-matrix products =="
        for t in wgpu_kernels wgpu_engine; do
            CI=true TOKENWIRE_REQUIRE_COOP=1 timeout 360 ".gpu/bin/$t" coop --nocapture 2>&1 | quiet |
                tee -a "$runs/tests" | grep -E "cooperative|nmse|test result|panicked"
        done
        # shellcheck disable=SC2046
        {
            for round in 1 2; do
                eb "no-coop-r$round" engine-bench 150 $(bf16 "$shape") --batch 1,8,16,32,64 --prompt 128 --no-coop
                eb "coop-r$round" engine-bench 150 $(bf16 "$shape") --batch 1,8,16,32,64 --prompt 128
            done
            eb coop-rows-4 engine-bench 90 $(bf16 "$shape") --batch 4,8,16 --prompt 128 --coop-rows 4
            eb coop-rows-64 engine-bench 90 $(bf16 "$shape") --batch 4,8,16 --prompt 128 --coop-rows 64
            eb coop-slab-32 engine-bench 90 $(bf16 "$shape") --batch 1,32 --prompt 128 --coop-slab 32
            eb coop-profile engine-bench 120 $(bf16 "$shape") --batch 32 --prompt 128 --profile
        }
        ;;
    quick:*)
        # The coop part cut to what fits a short call: the kernels' coop
        # parity, then one round without and with coop at batch 1 and 32
        # on a 512-token prompt (prefill on the matrix units is the question).
        shape=${part#quick:}
        echo "== $shape: cooperative-matrix products, quick =="
        CI=true TOKENWIRE_REQUIRE_COOP=1 timeout 120 .gpu/bin/wgpu_kernels coop --nocapture 2>&1 | quiet |
            tee -a "$runs/tests" | grep -E "cooperative|nmse|test result|panicked"
        # shellcheck disable=SC2046
        {
            eb no-coop engine-bench 60 $(bf16 "$shape") --batch 1,32 --prompt 512 --no-coop
            eb coop engine-bench 60 $(bf16 "$shape") --batch 1,32 --prompt 512
        }
        ;;
    loops:*)
        shape=${part#loops:}
        echo "== $shape: shaders without and with wgpu's loop counters =="
        # shellcheck disable=SC2046
        {
            for round in 1 2; do
                eb "unbounded-r$round" engine-bench 120 $(bf16 "$shape") --batch 1,8,32 --prompt 128
                eb "bounded-r$round" engine-bench 120 $(bf16 "$shape") --batch 1,8,32 --prompt 128 --loop-bounding
            done
            eb bounded-profile engine-bench 90 $(bf16 "$shape") --batch 1 --prompt 128 --profile --loop-bounding
        }
        ;;
    attn:*)
        shape=${part#attn:}
        echo "== $shape: decode attention's folded merge and K loads, each against its undoing =="
        # shellcheck disable=SC2046
        {
            for round in 1 2; do
                for v in default no-fold k-chunk-1; do
                    case $v in
                    default) x=() ;;
                    no-fold) x=(--no-fold-merge) ;;
                    k-chunk-1) x=(--decode-k-chunk 1) ;;
                    esac
                    eb "$v-r$round" engine-bench 60 $(bf16 "$shape") --batch 1,32 --prompt 128 "${x[@]}"
                    eb "$v-long-r$round" engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 "${x[@]}"
                done
            done
            eb attn-profile engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128 --profile
            eb attn-long-profile engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --profile
        }
        ;;
    batch32:*)
        shape=${part#batch32:}
        echo "== $shape: coop decode batches on the tall tile, against the square tile and against folded split sums =="
        # shellcheck disable=SC2046
        {
            for round in 1 2; do
                for v in default square fold; do
                    case $v in
                    default) x=() ;;
                    square) x=(--no-coop-tall) ;;
                    fold) x=(--coop-fold) ;;
                    esac
                    eb "$v-r$round" engine-bench 60 $(bf16 "$shape") --batch 16,32 --prompt 128 "${x[@]}"
                done
            done
            eb batch8-mat-vec engine-bench 60 $(bf16 "$shape") --batch 8 --prompt 128
            eb batch8-coop engine-bench 60 $(bf16 "$shape") --batch 8 --prompt 128 --coop-rows 8
            eb batch32-profile engine-bench 60 $(bf16 "$shape") --batch 32 --prompt 128 --profile
        }
        ;;
    submit:*)
        shape=${part#submit:}
        echo "== $shape: steps submitted in growing runs against one submission a step =="
        # shellcheck disable=SC2046
        {
            for round in $(seq 1 "${ROUNDS:-1}"); do
                for v in default whole; do
                    case $v in
                    default) x=() ;;
                    whole) x=(--first-submit 0) ;;
                    esac
                    eb "$v-r$round" engine-bench 60 $(bf16 "$shape") --batch 1,8,32 --prompt 128 "${x[@]}"
                    eb "$v-long-r$round" engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 "${x[@]}"
                done
            done
        }
        ;;
    rope:*)
        shape=${part#rope:}
        echo "== $shape: RoPE and the K/V write in the q|k|v mat-vec against their own dispatch; mat-vec unroll 4 =="
        # shellcheck disable=SC2046
        {
            for round in $(seq 1 "${ROUNDS:-1}"); do
                for v in default separate unroll-4; do
                    case $v in
                    default) x=() ;;
                    separate) x=(--no-fused-rope) ;;
                    unroll-4) x=(--mat-vec-unroll 4) ;;
                    esac
                    eb "$v-r$round" engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 "${x[@]}"
                done
            done
            eb sampled engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --sample 0.8,0.95 --profile
        }
        ;;
    switches:*)
        shape=${part#switches:}
        echo "== $shape: each default not yet measured on a GPU against its alternative, one run each =="
        # shellcheck disable=SC2046
        {
            eb default engine-bench 60 $(bf16 "$shape") --batch 1,8,32 --prompt 128
            eb default-long engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024
            eb separate-rope engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --no-fused-rope
            eb whole engine-bench 60 $(bf16 "$shape") --batch 1,8,32 --prompt 128 --first-submit 0
            eb no-fold engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128 --no-fold-merge
            eb no-fold-long engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --no-fold-merge
            eb k-chunk-1 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128 --decode-k-chunk 1
            eb square engine-bench 60 $(bf16 "$shape") --batch 16,32 --prompt 128 --no-coop-tall
            eb coop-fold engine-bench 60 $(bf16 "$shape") --batch 16,32 --prompt 128 --coop-fold
            eb unroll-4 engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --mat-vec-unroll 4
            eb sampled engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --sample 0.8,0.95 --profile
            eb host-sampled engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --sample 0.8,0.95 --host-sample
            eb sampled-freq engine-bench 60 $(bf16 "$shape") --batch 1,8 --prompt 128 --sample 0.8,0.95,0,0.5
            eb profile engine-bench 60 $(bf16 "$shape") --batch 1,32 --prompt 128 --profile
        }
        ;;
    hf:*)
        echo "== transformers eager on ${part#hf:} =="
        PYTHONUNBUFFERED=1 timeout 150 python3 benches/gpu/hf_anchor.py "${part#hf:}"
        ;;
    anchor)
        echo "== transformers eager, same shapes and card =="
        PYTHONUNBUFFERED=1 timeout 280 python3 benches/gpu/hf_anchor.py
        ;;
    anchors | gguf)
        echo "== transformers, llama.cpp (Vulkan) and tokenwire on one card =="
        [ "$part" = anchors ] &&
            PYTHONUNBUFFERED=1 timeout 150 python3 benches/gpu/hf_anchor.py tinyllama-1.1b
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl
        mkdir -p /tmp/llama
        python3 -c "import tarfile; tarfile.open('.llama/llama-bench.tar.xz').extractall('/tmp/llama')"
        for kind in f16 q8_0; do
            file=/tmp/tinyllama-$kind.gguf
            start=$(date +%s)
            PYTHONPATH=/tmp/site timeout 150 python3 scripts/make-bench-gguf.py "$file" "$kind" >/dev/null
            echo "-- $file written in $(($(date +%s) - start)) s, $(du -h "$file" | cut -f1)"
            echo "-- llama-bench $kind"
            LD_LIBRARY_PATH=/tmp/llama timeout 150 /tmp/llama/llama-bench -m "$file" -ngl 99 \
                -p 512,1024 -n 128 -r 2 2>&1 | grep -E '^\|' | tee "$runs/llama-$kind.md"
            for prompt in 512 1024; do
                eb "gguf-$kind-p$prompt" engine-bench 90 --gguf "$file" --backend wgpu --batch 1 \
                    --prompt "$prompt" --steps 32 ${EB_ARGS:-}
            done
            eb "gguf-$kind-tg128" engine-bench 90 --gguf "$file" --backend wgpu --batch 1 \
                --prompt 1 --steps 128 ${EB_ARGS:-}
            # F16 weights read as vec4<f16> (shader-f16, the default where
            # the device has it) or unpacked from u32 pairs.
            [ "$kind" = f16 ] && eb "gguf-$kind-p1024-no-shader-f16" engine-bench 90 --gguf "$file" \
                --backend wgpu --batch 1 --prompt 1024 --steps 32 --no-shader-f16 ${EB_ARGS:-}
            rm -f "$file"
        done
        ;;
    next:*)
        # Prefill passes of more rows than the default 512 (fewer weight
        # reads, more tiles for the narrow products), and decode attention
        # in one split (no merge dispatch) at short and long contexts.
        shape=${part#next:}
        echo "== $shape: rows per pass, and decode attention's splits =="
        # shellcheck disable=SC2046
        {
            eb rows-512 engine-bench 60 $(bf16 "$shape") --batch 8,32 --prompt 128
            eb rows-1024 engine-bench 60 $(bf16 "$shape") --batch 8,32 --prompt 128 --max-rows-per-pass 1024
            eb rows-4096 engine-bench 60 $(bf16 "$shape") --batch 32 --prompt 128 --max-rows-per-pass 4096
            eb p1024 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024
            eb p1024-rows-1024 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --max-rows-per-pass 1024
            eb p1024-one-split engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-min-split 100000
            eb p1024-min256 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 1024 --decode-min-split 256
            eb p128 engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128
            eb p128-one-split engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128 --decode-min-split 100000
            eb p128-profile engine-bench 60 $(bf16 "$shape") --batch 1 --prompt 128 --profile
        }
        ;;
    *)
        echo "unknown part $part (tests, bench:SHAPE, long:SHAPE, base:SHAPE, tune:SHAPE, ab:SHAPE, coop:SHAPE, quick:SHAPE, loops:SHAPE, splitk:SHAPE, table:SHAPE, next:SHAPE, attn:SHAPE, batch32:SHAPE, submit:SHAPE, rope:SHAPE, switches:SHAPE, hf:SHAPE, parity, anchor, anchors, gguf)"
        exit 2
        ;;
    esac
done
echo "== summary =="
python3 benches/gpu/summary.py "$runs"
