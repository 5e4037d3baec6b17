//! `acpo model init`, `acpo model export` and `acpo model logprobs`: a seeded random model, a
//! model directory transformers loads whole, and a model's log-probabilities of given token ids.

use anyhow::Context;

use crate::cli::ModelCommand;
use crate::Outcome;

/// `acpo model ...`.
pub fn run(cmd: ModelCommand) -> anyhow::Result<Outcome> {
    match cmd {
        ModelCommand::Init {
            config,
            out,
            seed,
            char_tokenizer,
            bpe_tokenizer,
            tokenizer_from,
        } => {
            use acpo::model::init::{InitTokenizer, TokenizerFiles, TokenizerKind};
            let kind = match (char_tokenizer, bpe_tokenizer, tokenizer_from) {
                (true, _, _) => Some(InitTokenizer::Kind(TokenizerKind::Char)),
                (_, true, _) => Some(InitTokenizer::Kind(TokenizerKind::Bpe)),
                (_, _, Some(dir)) => Some(InitTokenizer::Files(TokenizerFiles::Dir { dir })),
                _ => None,
            };
            println!("{}", acpo::model::init::create(&config, &out, seed, kind)?);
            Ok(Outcome::Success)
        }
        ModelCommand::Export {
            source,
            out,
            step,
            tokenizer_from,
        } => {
            let hub = acpo::hub::HubOptions::from_env();
            let done =
                acpo::run::export::export(&source, step, tokenizer_from.as_deref(), &out, &hub)?;
            println!("{done}");
            Ok(Outcome::Success)
        }
        ModelCommand::Logprobs {
            model,
            input,
            output,
            device,
            dtype,
        } => {
            let lines =
                acpo::model::score::score_file(&model, &input, device.into(), dtype.into())?;
            acpo::atomic::write(&output, lines.as_bytes()).context("cannot write")?;
            println!(
                "wrote {} scored sequences to {}",
                lines.lines().count(),
                output.display()
            );
            Ok(Outcome::Success)
        }
    }
}
