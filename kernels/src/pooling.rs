//! The pooling a model declares for its embeddings: a sentence-transformers
//! `Pooling` module beside a Hugging Face model (Qwen3-Embedding's
//! `1_Pooling/config.json` says `pooling_mode_lasttoken`), or a GGUF file's
//! `<arch>.pooling_type`. tokenwire computes the mean and the last token's
//! state; a model that declares another mode (`cls`, `max`, ...) is told
//! apart, so the server can say so instead of guessing.

use serde_json::Value;
use tokenwire_core::Pooling;
use tokenwire_gguf::GgufFile;

use crate::model_dir::ModelDir;

/// What a model says about pooling its embeddings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeclaredPooling {
    /// Nothing (most generative models).
    #[default]
    None,
    /// A mode tokenwire computes.
    Supported(Pooling),
    /// A mode it does not: its name and where it was declared.
    Unsupported(String),
}

impl DeclaredPooling {
    /// The declared mode, when tokenwire computes it.
    pub fn supported(&self) -> Option<Pooling> {
        match self {
            DeclaredPooling::Supported(p) => Some(*p),
            _ => None,
        }
    }
}

/// sentence-transformers' flags, in its own order of precedence for the
/// ones tokenwire computes.
const MODES: [(&str, Option<Pooling>); 6] = [
    ("pooling_mode_lasttoken", Some(Pooling::Last)),
    ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
    ("pooling_mode_cls_token", None),
    ("pooling_mode_max_tokens", None),
    ("pooling_mode_mean_sqrt_len_tokens", None),
    ("pooling_mode_weightedmean_tokens", None),
];

/// The Pooling module of a sentence-transformers model in `dir`
/// (`modules.json` names its folder; `1_Pooling` without one). A file that
/// is there but unreadable declares nothing.
pub fn declared_in_dir(dir: &ModelDir) -> DeclaredPooling {
    let folder = dir
        .read_json("modules.json")
        .ok()
        .and_then(|m| {
            m.as_array()?
                .iter()
                .find(|e| e["type"].as_str().is_some_and(|t| t.ends_with(".Pooling")))
                .and_then(|e| e["path"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| "1_Pooling".into());
    let name = format!("{folder}/config.json");
    if !dir.exists(&name) {
        return DeclaredPooling::None;
    }
    match dir.read_json(&name) {
        Ok(cfg) => from_sentence_transformers(&cfg, &name),
        Err(_) => DeclaredPooling::None,
    }
}

/// The mode a sentence-transformers Pooling config turns on (`file` names
/// it in the message of one tokenwire does not compute).
pub fn from_sentence_transformers(cfg: &Value, file: &str) -> DeclaredPooling {
    let on = |key: &str| cfg[key].as_bool() == Some(true);
    let mut unsupported = None;
    for (key, pooling) in MODES {
        if on(key) {
            match pooling {
                Some(p) => return DeclaredPooling::Supported(p),
                None => {
                    unsupported.get_or_insert(key.trim_start_matches("pooling_mode_"));
                }
            }
        }
    }
    match unsupported {
        Some(mode) => DeclaredPooling::Unsupported(format!("`{mode}` ({file})")),
        None => DeclaredPooling::None,
    }
}

/// A GGUF file's `<arch>.pooling_type` (llama.cpp's numbers: 0 none, 1
/// mean, 2 cls, 3 last, 4 rank).
pub fn declared_in_gguf(file: &GgufFile) -> DeclaredPooling {
    let Ok(Some(arch)) = file.str("general.architecture") else {
        return DeclaredPooling::None;
    };
    let key = format!("{arch}.pooling_type");
    match file.uint(&key) {
        Ok(Some(1)) => DeclaredPooling::Supported(Pooling::Mean),
        Ok(Some(3)) => DeclaredPooling::Supported(Pooling::Last),
        Ok(Some(2)) => DeclaredPooling::Unsupported(format!("`cls` ({key} = 2)")),
        Ok(Some(4)) => DeclaredPooling::Unsupported(format!("`rank` ({key} = 4)")),
        Ok(Some(n)) if n != 0 => DeclaredPooling::Unsupported(format!("{key} = {n}")),
        _ => DeclaredPooling::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sentence_transformers_flags_name_the_mode() {
        let qwen3_embedding = json!({"word_embedding_dimension": 1024,
            "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false,
            "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false,
            "pooling_mode_weightedmean_tokens": false, "pooling_mode_lasttoken": true,
            "include_prompt": true});
        assert_eq!(
            from_sentence_transformers(&qwen3_embedding, "f"),
            DeclaredPooling::Supported(Pooling::Last)
        );
        let mean = json!({"pooling_mode_mean_tokens": true});
        assert_eq!(
            from_sentence_transformers(&mean, "f"),
            DeclaredPooling::Supported(Pooling::Mean)
        );
        let cls = json!({"pooling_mode_cls_token": true});
        let d = from_sentence_transformers(&cls, "1_Pooling/config.json");
        assert_eq!(
            d,
            DeclaredPooling::Unsupported("`cls_token` (1_Pooling/config.json)".into())
        );
        assert_eq!(d.supported(), None);
        assert_eq!(
            from_sentence_transformers(&json!({}), "f"),
            DeclaredPooling::None
        );
    }

    #[test]
    fn a_directory_s_modules_name_the_pooling_folder() {
        let root = std::env::temp_dir().join(format!("tw-pooling-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("2_Pool")).expect("mkdir");
        let dir = ModelDir::new(&root);
        assert_eq!(declared_in_dir(&dir), DeclaredPooling::None);
        std::fs::write(
            root.join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
               {"idx":1,"name":"1","path":"2_Pool","type":"sentence_transformers.models.Pooling"}]"#,
        )
        .expect("write");
        std::fs::write(
            root.join("2_Pool/config.json"),
            r#"{"pooling_mode_mean_tokens": true}"#,
        )
        .expect("write");
        assert_eq!(
            declared_in_dir(&dir),
            DeclaredPooling::Supported(Pooling::Mean)
        );
        std::fs::write(root.join("2_Pool/config.json"), "not json").expect("write");
        assert_eq!(declared_in_dir(&dir), DeclaredPooling::None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
