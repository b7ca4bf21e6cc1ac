//! The most multiply-adds a second that one core can do with the AVX2
//! int8 kernels' instructions, measured rather than read from a table: the
//! ceiling that `quant-kernels`' tile figures are compared against.
//!
//! Each loop below runs, from registers only (no loads; the only chains
//! from one iteration to the next are its accumulators', a few fmas or 32
//! one-cycle adds, far shorter than an iteration), the instructions one of
//! `kernels/src/quant/x86.rs`'s AVX2 tiles issues for one weight row's
//! group of eight blocks against four tokens, 1,024 multiply-adds:
//!
//! * Q4_1: the nibbles unpacked once (`vpand`, `vpsrlw`) and the scales
//!   and minimums widened (`vcvtph2ps`); per token eight `vpmaddubsw`
//!   summed in i16 (`vpaddw`), one `vpmaddwd`, the conversion, the scale
//!   multiply and two fmas (the scale's and the minimum's);
//! * Q8_0 (the sign trick): the magnitudes once (`vpsignb`); per token
//!   eight `vpsignb` on the activations, eight `vpmaddubsw`, eight
//!   `vpmaddwd`, their `vpaddd`s, the conversion, multiply and fma;
//!
//! and, for the pipe they share, `vpmaddubsw` and `vpmaddwd` alone. The
//! clock is measured just before each loop with a chain of dependent
//! integer adds (one a cycle on every x86 core), so the figures are cycles,
//! not nanoseconds, as long as the core's boost holds for the loop.
//!
//! `int8-ceiling [seconds]` (default 1 per loop). x86_64 with AVX2, FMA
//! and F16C only.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("seconds: a number"))
        .unwrap_or(1.0);
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        eprintln!("int8-ceiling: this CPU lacks AVX2, FMA or F16C");
        std::process::exit(2);
    }
    x86::run(secs);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("int8-ceiling: x86_64 only");
    std::process::exit(2);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    /// One loop: its name, multiply-adds an iteration (0 where it only
    /// counts instructions), instructions an iteration, and the loop.
    type Loop = (&'static str, u64, u64, unsafe fn(u64));

    /// Runs each loop for about `secs` and prints its table.
    pub fn run(secs: f64) {
        let loops: [Loop; 4] = [
            ("vpmaddubsw alone", 0, 8, maddubs8),
            ("vpmaddwd alone", 0, 8, maddwd8),
            ("Q4_1 tile, a group x 4 tokens", 1024, 0, q4_1_group),
            (
                "Q8_0 tile (sign trick), a group x 4 tokens",
                1024,
                0,
                q8_0_group,
            ),
        ];
        println!(
            "loop                                         cycles/iter  per cycle   G MAC/s  GHz"
        );
        for (name, macs, insns, f) in loops {
            let ghz = clock_ghz();
            let iters = calibrate(f, secs);
            let t = Instant::now();
            // SAFETY: `main` checked AVX2, FMA and F16C, the loops' one
            // precondition; they write only registers their asm declares
            // clobbered (the C ABI's caller-saved ones).
            unsafe { f(iters) };
            let cycles = t.elapsed().as_secs_f64() * ghz * 1e9 / iters as f64;
            let (per_cycle, gmacs) = if macs > 0 {
                (macs as f64 / cycles, macs as f64 / cycles * ghz)
            } else {
                (insns as f64 / cycles, 0.0)
            };
            let unit = if macs > 0 { "MAC" } else { "insn" };
            println!(
                "{name:<44} {cycles:>10.2}  {per_cycle:>6.2} {unit:<4} {gmacs:>7.2}  {ghz:.2}"
            );
        }
    }

    /// Iterations of `f` that take about `secs`.
    fn calibrate(f: unsafe fn(u64), secs: f64) -> u64 {
        let mut n = 1u64 << 16;
        loop {
            let t = Instant::now();
            // SAFETY: as in `run`.
            unsafe { f(n) };
            let e = t.elapsed().as_secs_f64();
            if e > 0.05 {
                return ((n as f64) * secs / e).max(1.0) as u64;
            }
            n *= 4;
        }
    }

    /// The core's clock now: ten dependent adds an iteration, one a cycle.
    fn clock_ghz() -> f64 {
        let n = 50_000_000u64;
        let t = Instant::now();
        let mut x = 0u64;
        // SAFETY: integer adds on one register and a counter.
        unsafe {
            asm!(
                "2:",
                "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
                "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
                "dec {n}",
                "jnz 2b",
                x = inout(reg) x,
                n = inout(reg) n => _,
                options(nomem, nostack),
            );
        }
        std::hint::black_box(x);
        10.0 * n as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    /// `n` iterations (none for 0) of the instructions given, after setting
    /// the registers they read: `ymm0` all ones (-1 as bytes), `ymm1` ones
    /// as bytes, `ymm4` and `ymm10`-`ymm13` zero. Written once for every
    /// loop, so they differ only in what they time.
    macro_rules! looped {
        ($n:expr; $($insns:tt)*) => {
            if $n != 0 {
                asm!(
                    "vpcmpeqb ymm0, ymm0, ymm0",
                    "vpabsb ymm1, ymm0",
                    "vpxor ymm4, ymm4, ymm4",
                    "vxorps ymm10, ymm10, ymm10",
                    "vxorps ymm11, ymm11, ymm11",
                    "vxorps ymm12, ymm12, ymm12",
                    "vxorps ymm13, ymm13, ymm13",
                    "2:",
                    $($insns)*
                    "dec rcx",
                    "jnz 2b",
                    "vzeroupper",
                    inout("rcx") $n => _,
                    clobber_abi("C"),
                    options(nomem, nostack),
                );
            }
        };
    }

    /// Eight independent `vpmaddubsw` an iteration.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C. Runs `n` iterations (none for 0).
    unsafe fn maddubs8(n: u64) {
        unsafe {
            looped!(n;
                "vpmaddubsw ymm2, ymm1, ymm0", "vpmaddubsw ymm3, ymm1, ymm0",
                "vpmaddubsw ymm4, ymm1, ymm0", "vpmaddubsw ymm5, ymm1, ymm0",
                "vpmaddubsw ymm6, ymm1, ymm0", "vpmaddubsw ymm7, ymm1, ymm0",
                "vpmaddubsw ymm8, ymm1, ymm0", "vpmaddubsw ymm9, ymm1, ymm0",
            );
        }
    }

    /// Eight independent `vpmaddwd` an iteration.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C. Runs `n` iterations (none for 0).
    unsafe fn maddwd8(n: u64) {
        unsafe {
            looped!(n;
                "vpmaddwd ymm2, ymm1, ymm0", "vpmaddwd ymm3, ymm1, ymm0",
                "vpmaddwd ymm4, ymm1, ymm0", "vpmaddwd ymm5, ymm1, ymm0",
                "vpmaddwd ymm6, ymm1, ymm0", "vpmaddwd ymm7, ymm1, ymm0",
                "vpmaddwd ymm8, ymm1, ymm0", "vpmaddwd ymm9, ymm1, ymm0",
            );
        }
    }

    /// One token's work in the Q4_1 tile: eight byte products summed in
    /// i16, one widening `vpmaddwd`, then the float step (convert, scale
    /// product, two fmas into the token's accumulators `ymm12`, `ymm13`).
    macro_rules! q4_1_token {
        () => {
            concat!(
                "vpmaddubsw ymm2, ymm1, ymm0\n",
                "vpmaddubsw ymm3, ymm1, ymm0\n",
                "vpaddw ymm4, ymm2, ymm3\n",
                "vpmaddubsw ymm2, ymm1, ymm0\n",
                "vpmaddubsw ymm3, ymm1, ymm0\n",
                "vpaddw ymm5, ymm2, ymm3\n",
                "vpmaddubsw ymm2, ymm1, ymm0\n",
                "vpmaddubsw ymm3, ymm1, ymm0\n",
                "vpaddw ymm6, ymm2, ymm3\n",
                "vpmaddubsw ymm2, ymm1, ymm0\n",
                "vpmaddubsw ymm3, ymm1, ymm0\n",
                "vpaddw ymm7, ymm2, ymm3\n",
                "vpaddw ymm4, ymm4, ymm5\n",
                "vpaddw ymm6, ymm6, ymm7\n",
                "vpaddw ymm4, ymm4, ymm6\n",
                "vpmaddwd ymm4, ymm4, ymm0\n",
                "vcvtdq2ps ymm5, ymm4\n",
                "vmulps ymm6, ymm10, ymm11\n",
                "vfmadd231ps ymm12, ymm6, ymm5\n",
                "vfmadd231ps ymm13, ymm10, ymm11\n",
            )
        };
    }

    /// A Q4_1 group of eight blocks against four tokens.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C. Runs `n` iterations (none for 0).
    unsafe fn q4_1_group(n: u64) {
        unsafe {
            looped!(n;
                // The group's nibbles and scales, once for the four tokens.
                "vpand ymm14, ymm1, ymm0", "vpsrlw ymm15, ymm1, 4", "vpand ymm15, ymm15, ymm0",
                "vpand ymm14, ymm1, ymm0", "vpsrlw ymm15, ymm1, 4", "vpand ymm15, ymm15, ymm0",
                "vpand ymm14, ymm1, ymm0", "vpsrlw ymm15, ymm1, 4", "vpand ymm15, ymm15, ymm0",
                "vpand ymm14, ymm1, ymm0", "vpsrlw ymm15, ymm1, 4", "vpand ymm15, ymm15, ymm0",
                "vcvtph2ps ymm14, xmm1", "vcvtph2ps ymm15, xmm1",
                q4_1_token!(), q4_1_token!(), q4_1_token!(), q4_1_token!(),
            );
        }
    }

    /// Two of a Q8_0 token's eight vectors: the sign moved onto the
    /// activations, the byte products, widened and summed.
    macro_rules! q8_0_two {
        () => {
            concat!(
                "vpsignb ymm2, ymm0, ymm1\n",
                "vpmaddubsw ymm2, ymm1, ymm2\n",
                "vpmaddwd ymm2, ymm2, ymm0\n",
                "vpaddd ymm4, ymm4, ymm2\n",
                "vpsignb ymm3, ymm0, ymm1\n",
                "vpmaddubsw ymm3, ymm1, ymm3\n",
                "vpmaddwd ymm3, ymm3, ymm0\n",
                "vpaddd ymm4, ymm4, ymm3\n",
            )
        };
    }

    /// One token's work in the Q8_0 tile: its eight vectors, then the float
    /// step into the token's accumulator `ymm12`.
    macro_rules! q8_0_token {
        () => {
            concat!(
                q8_0_two!(),
                q8_0_two!(),
                q8_0_two!(),
                q8_0_two!(),
                "vcvtdq2ps ymm5, ymm4\n",
                "vmulps ymm6, ymm10, ymm11\n",
                "vfmadd231ps ymm12, ymm6, ymm5\n",
            )
        };
    }

    /// A Q8_0 group of eight blocks against four tokens (sign trick).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C. Runs `n` iterations (none for 0).
    unsafe fn q8_0_group(n: u64) {
        unsafe {
            looped!(n;
                // The group's magnitudes and scales, once for four tokens.
                "vpsignb ymm14, ymm1, ymm1", "vpsignb ymm15, ymm1, ymm1",
                "vpsignb ymm14, ymm1, ymm1", "vpsignb ymm15, ymm1, ymm1",
                "vpsignb ymm14, ymm1, ymm1", "vpsignb ymm15, ymm1, ymm1",
                "vpsignb ymm14, ymm1, ymm1", "vpsignb ymm15, ymm1, ymm1",
                "vcvtph2ps ymm14, xmm1",
                q8_0_token!(), q8_0_token!(), q8_0_token!(), q8_0_token!(),
            );
        }
    }
}
