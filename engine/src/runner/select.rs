//! Where a model runs (`--device cpu|cuda[:N]`) and on which runner (`--runner
//! packed|candle`), and the checks that turn a bad combination into a clear start-up error.
//!
//! Invariants: the packed runner runs only on the CPU; the default runner is packed on the
//! CPU and candle on CUDA; asking for CUDA in a build without the `cuda` feature fails before
//! anything is loaded, naming the feature and the image that has it.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};

use crate::error::{Error, Result};

/// `--device`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The host CPU.
    #[default]
    Cpu,
    /// CUDA device `N` (`cuda` is `cuda:0`).
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("{s:?}: expected cpu, cuda or cuda:N");
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(bad),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// `--runner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerChoice {
    /// This crate's SIMD kernels on packed (optionally quantized) weights; CPU only.
    Packed,
    /// candle tensors on the device (bf16 weights on CUDA, f32 on the CPU).
    Candle,
}

impl fmt::Display for RunnerChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunnerChoice::Packed => "packed",
            RunnerChoice::Candle => "candle",
        })
    }
}

/// A checked device + runner pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Where it runs.
    pub device: DeviceChoice,
    /// Which implementation.
    pub runner: RunnerChoice,
}

impl Placement {
    /// The pair for `device` and an optional `--runner`, or why it cannot run in this build.
    pub fn resolve(device: DeviceChoice, runner: Option<RunnerChoice>) -> Result<Self> {
        let runner = runner.unwrap_or(match device {
            DeviceChoice::Cpu => RunnerChoice::Packed,
            DeviceChoice::Cuda(_) => RunnerChoice::Candle,
        });
        if let DeviceChoice::Cuda(_) = device {
            if runner == RunnerChoice::Packed {
                return Err(Error::Placement(format!(
                    "--runner packed runs only on the CPU; use --runner candle with --device {device}"
                )));
            }
            if !cfg!(feature = "cuda") {
                return Err(Error::Placement(format!(
                    "--device {device}: this binary was built without CUDA support; use a build \
                     with the `cuda` cargo feature (the engine's -cuda image)"
                )));
            }
        }
        Ok(Placement { device, runner })
    }

    /// The placement everything used before `--device` existed: packed on the CPU.
    pub fn cpu_packed() -> Self {
        Placement {
            device: DeviceChoice::Cpu,
            runner: RunnerChoice::Packed,
        }
    }
}

/// Opens the candle device, with an error that says what to check when CUDA is not usable.
pub fn open_device(device: DeviceChoice) -> Result<Device> {
    match device {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(n) => Device::new_cuda(n).map_err(|e| {
            Error::Placement(format!(
                "--device cuda:{n}: cannot open the GPU ({e}); check that the device is visible \
                 to this container and that the NVIDIA driver supports the CUDA version this \
                 binary was built with"
            ))
        }),
    }
}

/// The weight dtype of the candle runner on `device`: bf16 on CUDA; f32 on the CPU, where
/// candle's bf16 matmul widens both operands to f32 on every call (so bf16 would only be
/// slower there, with no memory traffic saved).
pub fn candle_dtype(device: DeviceChoice) -> DType {
    match device {
        DeviceChoice::Cpu => DType::F32,
        DeviceChoice::Cuda(_) => DType::BF16,
    }
}

/// Free and total bytes of the device's memory; `None` for the CPU (its memory is sized
/// from the container's limit instead, see `kv_sizing`).
pub fn device_memory(device: DeviceChoice) -> Result<Option<(u64, u64)>> {
    match device {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Cuda(_) => cuda_memory(&open_device(device)?).map(Some),
    }
}

#[cfg(feature = "cuda")]
fn cuda_memory(device: &Device) -> Result<(u64, u64)> {
    let cuda = device.as_cuda_device()?;
    let (free, total) = cuda
        .cuda_stream()
        .context()
        .mem_get_info()
        .map_err(|e| Error::Placement(format!("querying the GPU's memory: {e}")))?;
    Ok((free as u64, total as u64))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory(_: &Device) -> Result<(u64, u64)> {
    Err(Error::Placement(
        "this binary was built without CUDA support (the `cuda` cargo feature)".into(),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn devices_parse_and_bad_pairs_are_refused() {
        assert_eq!("cpu".parse::<DeviceChoice>(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("CUDA:3".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(3)));
        assert!("gpu".parse::<DeviceChoice>().is_err());
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
        let cpu = Placement::resolve(DeviceChoice::Cpu, None).unwrap();
        assert_eq!(cpu.runner, RunnerChoice::Packed);
        let err = Placement::resolve(DeviceChoice::Cuda(0), Some(RunnerChoice::Packed));
        assert!(err.unwrap_err().to_string().contains("only on the CPU"));
        let cuda = Placement::resolve(DeviceChoice::Cuda(0), None);
        if cfg!(feature = "cuda") {
            assert_eq!(cuda.unwrap().runner, RunnerChoice::Candle);
        } else {
            assert!(
                cuda.unwrap_err()
                    .to_string()
                    .contains("`cuda` cargo feature")
            );
        }
    }
}
