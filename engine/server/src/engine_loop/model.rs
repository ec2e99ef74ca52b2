//! What the engine loop serves ([`LoopModel`]): a tokenizer, the model's own context limit,
//! a description of the served weights, and a builder for its runner that the owner thread
//! calls (so weight packing or the upload to the device happens while the engine is not
//! ready). One constructor per runner; the loop does not know which one it got.
//!
//! Invariant: a combination that cannot run (a weight format the runner does not serve) is
//! refused here, before the owner thread starts.

use tidegate_runner::candle::{CandleRunner, weight_count_for};
use tidegate_runner::echo::{EchoConfig, EchoRunner, echo_tokenizer};
use tidegate_runner::error::{Error, Result};
use tidegate_runner::model::{ModelConfig, ModelFiles, Tokenizer};
use tidegate_runner::select::candle_dtype;
use tidegate_runner::{
    DeviceChoice, ModelRunner, PackedRunner, Placement, RunnerChoice, RunnerConfig, WeightChoice,
    WeightsPlan,
};

/// Builds a model's runner for a pool shape; runs on the owner thread.
pub type RunnerBuild = Box<dyn FnOnce(RunnerConfig) -> Result<Box<dyn ModelRunner>> + Send>;

/// How the weights are served, for `/v1/models`, logs and the bench's roofline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedWeights {
    /// `q4_1 79% + q8_0 21%`, `bf16 (candle, cuda:0)`, `none`, ...
    pub label: String,
    /// Weight bytes read per decoded token (0 when not applicable).
    pub bytes_per_token: usize,
    /// Weights multiplied per token (two FLOPs each).
    pub weight_count: usize,
    /// The kernels that multiply them (`int8 avx512-vnni, f32 avx512`, `candle`, `none`).
    pub kernels: String,
}

/// What the loop serves.
pub struct LoopModel {
    /// The model's tokenizer (its EOS ids end generations).
    pub tokenizer: Tokenizer,
    /// The model's own context limit (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// How the weights are served.
    pub weights: ServedWeights,
    /// Builds the runner.
    pub build: RunnerBuild,
}

impl LoopModel {
    /// A loaded checkpoint on the runner `placement` names.
    pub fn for_files(
        files: ModelFiles,
        placement: Placement,
        weights: WeightChoice,
    ) -> Result<Self> {
        match placement.runner {
            RunnerChoice::Packed => Self::packed(files, weights),
            RunnerChoice::Candle => Self::candle(files, placement.device, weights),
        }
    }

    /// The packed CPU runner, in the formats `weights` gives.
    pub fn packed(files: ModelFiles, weights: WeightChoice) -> Result<Self> {
        let plan = WeightsPlan::new(&files.weights, &files.config, weights)?;
        Ok(LoopModel {
            tokenizer: files.tokenizer.clone(),
            max_position_embeddings: files.config.max_position_embeddings,
            weights: ServedWeights {
                label: plan.label(),
                bytes_per_token: plan.bytes_per_token(),
                weight_count: plan.weight_count(),
                kernels: tidegate_runner::kernels::describe(),
            },
            build: Box::new(move |rc| {
                let runner = PackedRunner::with_weights(&files, rc, weights)?;
                Ok(Box::new(runner) as Box<dyn ModelRunner>)
            }),
        })
    }

    /// The candle device runner on `device` (bf16 on CUDA, f32 on the CPU).
    pub fn candle(files: ModelFiles, device: DeviceChoice, weights: WeightChoice) -> Result<Self> {
        if !matches!(weights, WeightChoice::AsFile | WeightChoice::F32) {
            return Err(Error::Placement(format!(
                "--weights {weights:?} is a packed-runner format; the candle runner serves \
                 bf16 on CUDA and f32 on the CPU (use --weights as-file)"
            )));
        }
        let dtype = candle_dtype(device);
        let count = weight_count_for(&files.config);
        Ok(LoopModel {
            tokenizer: files.tokenizer.clone(),
            max_position_embeddings: files.config.max_position_embeddings,
            weights: candle_weights(dtype, count, format!("(candle, {device})")),
            build: Box::new(move |rc| {
                let runner = CandleRunner::new(&files, rc, device)?;
                Ok(Box::new(runner) as Box<dyn ModelRunner>)
            }),
        })
    }

    /// The candle device runner on random weights of `config`'s shapes, made on `device`
    /// (`bench --random-config`). There is no tokenizer: the byte-level one of the echo
    /// runner stands in so the loop can stream text, which a bench that sends token ids and
    /// ignores EOS never reads.
    pub fn candle_random(config: ModelConfig, device: DeviceChoice) -> Result<Self> {
        config.validate()?;
        let dtype = candle_dtype(device);
        let count = weight_count_for(&config);
        Ok(LoopModel {
            tokenizer: echo_tokenizer()?,
            max_position_embeddings: config.max_position_embeddings,
            weights: candle_weights(dtype, count, format!("random (candle, {device})")),
            build: Box::new(move |rc| {
                let runner = CandleRunner::random(&config, rc, device)?;
                Ok(Box::new(runner) as Box<dyn ModelRunner>)
            }),
        })
    }

    /// The echo runner (deterministic tokens, no weights): `serve --fake-model`.
    pub fn echo(echo: EchoConfig) -> Result<Self> {
        Ok(LoopModel {
            tokenizer: echo_tokenizer()?,
            max_position_embeddings: echo.context_length,
            weights: ServedWeights {
                label: "none".into(),
                bytes_per_token: 0,
                weight_count: 0,
                kernels: "none".into(),
            },
            build: Box::new(move |rc| {
                let runner = EchoRunner::new(&echo, rc)?;
                Ok(Box::new(runner) as Box<dyn ModelRunner>)
            }),
        })
    }
}

/// The candle runner's weights: `count` of them in `dtype`, labelled `bf16 <how>`.
fn candle_weights(dtype: tidegate_runner::DType, count: usize, how: String) -> ServedWeights {
    ServedWeights {
        label: format!("{} {how}", dtype.as_str()),
        bytes_per_token: count * dtype.size_in_bytes(),
        weight_count: count,
        kernels: "candle".into(),
    }
}
