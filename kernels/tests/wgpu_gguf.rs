//! A GGUF llama on the wgpu backend: its quantized matrices uploaded as
//! blocks and unpacked in the kernels, its q and k rows put back in Hugging
//! Face's order for the kernels' half-split RoPE. Checked against the CPU engine in f32
//! arithmetic (the interleaved RoPE on the file's own row order): the same
//! logits up to f32 rounding, and the same greedy tokens.

mod common;
mod wgpu_support;

use std::sync::Arc;

use tokenwire_kernels::backend::wgpu::WeightDtype;
use tokenwire_kernels::{ActivationPrecision, Engine, EngineOptions, WgpuBackend};
use wgpu_support::*;

#[test]
fn a_gguf_llama_on_wgpu_gives_the_cpu_engines_logits() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let cpu_opts = EngineOptions {
        num_blocks: Some(8),
        cpu_activations: ActivationPrecision::F32,
        ..EngineOptions::default()
    };
    let mut cpu = Engine::load(&path, &cpu_opts).expect("CPU engine");
    let gpu_opts = EngineOptions {
        num_blocks: Some(8),
        ..wgpu_options()
    };
    let Some(mut gpu) = or_skip(Engine::load(&path, &gpu_opts)) else {
        return;
    };
    // The device samples by itself; ask for the rows too.
    gpu.set_full_logits(true);
    // "<|im_start|>user\nWhat is the capital of France?" and a few more.
    let prompt = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47];
    let want = common::logits_alone(&mut cpu, &prompt);
    let got = common::logits_alone(&mut gpu, &prompt);
    let err = nmse(&got, &want);
    assert!(err < 1e-8, "normalised MSE {err}");
    assert_eq!(common::argmax(&got), common::argmax(&want));
    let a = cpu.generate_greedy(&prompt, 8, &[]).expect("cpu");
    let b = gpu.generate_greedy(&prompt, 8, &[]).expect("gpu");
    assert_eq!(a, b);
}

#[test]
fn a_gguf_files_blocks_stay_blocks_on_the_device() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let (model, _) = tokenwire_kernels::Model::load_gguf(&path).expect("model");
    let file_len = std::fs::metadata(&path).expect("file").len();
    let Some(gpu) = or_skip(WgpuBackend::new(Arc::new(model), 16, 8, &f32_options())) else {
        return;
    };
    let dts = gpu.weight_dtypes();
    assert!(dts.contains(&WeightDtype::Q4_1), "{dts:?}");
    assert!(!dts.contains(&WeightDtype::F32), "{dts:?}");
    // Every matrix read in a step fits in the file (an f32 copy would take
    // about 6x the file).
    assert!(
        gpu.weight_bytes() < file_len,
        "{} device bytes for a file of {file_len}",
        gpu.weight_bytes()
    );
}
