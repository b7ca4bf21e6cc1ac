//! The default model built into the binary: stories260K (a 260K-parameter
//! llama trained on TinyStories by Andrej Karpathy, MIT License; origin and
//! checks in `models/stories260K/README.md`). With it, `tokenwire serve`
//! without `--model` streams real (childish) stories on a fresh clone, with
//! nothing to download. Its 1 MB of files load through the same code as a
//! model directory ([`ModelDir`]), the weights read in place, not copied.

use crate::model_dir::{BuiltinFiles, ModelDir};

/// The name the built-in model is served under.
pub const STORIES260K_NAME: &str = "stories260K";

/// Bytes aligned for reading in place: f32 tensors are read as `&[f32]`
/// straight from the file's bytes, which `include_bytes!` alone places at
/// any address.
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

macro_rules! model_file {
    ($name:literal) => {{
        static BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/stories260K/",
            $name
        )));
        ($name, &BYTES.0 as &[u8])
    }};
}

/// stories260K's files, as in `models/stories260K/`.
static STORIES260K_FILES: BuiltinFiles = &[
    model_file!("config.json"),
    model_file!("generation_config.json"),
    model_file!("model.safetensors"),
    model_file!("tokenizer.json"),
    model_file!("tokenizer_config.json"),
];

/// The repository directory the built-in files were read from at build
/// time (`models/stories260K`), for this workspace's tests and tools.
pub fn stories260k_source_dir() -> std::path::PathBuf {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../models/stories260K").into()
}

/// The built-in stories260K model's files.
pub fn stories260k() -> ModelDir {
    ModelDir::builtin(STORIES260K_NAME, STORIES260K_FILES)
}
