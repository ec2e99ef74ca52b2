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

/// Opens the candle device, with an error that says what to check when CUDA is not usable:
/// the driver's CUDA version beside the one this binary was built against.
pub fn open_device(device: DeviceChoice) -> Result<Device> {
    match device {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(n) => Device::new_cuda(n).map_err(|e| {
            let versions = CudaVersions {
                driver: cuda_probe::driver_version(),
                built: cuda_probe::BUILT,
            };
            Error::Placement(cuda_open_error(n, &e.to_string(), versions))
        }),
    }
}

/// CUDA versions as the driver API encodes them (`1000 × major + 10 × minor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaVersions {
    /// What the installed driver supports (`cuDriverGetVersion`); `None` when it cannot say.
    pub driver: Option<u32>,
    /// What this binary was built against (the toolkit cudarc's bindings were made for);
    /// `None` in a build without the `cuda` feature.
    pub built: Option<u32>,
}

/// `13000` → `13.0`.
pub fn cuda_version_text(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The oldest Linux driver branch for a CUDA major version (NVIDIA's release notes).
fn min_driver_for(major: u32) -> Option<u32> {
    match major {
        12 => Some(525),
        13 => Some(580),
        _ => None,
    }
}

/// The start error for a GPU that cannot be opened: the cause, both versions, and when the
/// driver is older than the toolkit, that it is (the most common cause on a fresh node).
pub fn cuda_open_error(n: usize, cause: &str, v: CudaVersions) -> String {
    let built = v.built.map_or("an unknown CUDA version".into(), |b| {
        format!("CUDA {}", cuda_version_text(b))
    });
    let driver = match v.driver {
        Some(d) => format!("the NVIDIA driver supports CUDA {}", cuda_version_text(d)),
        None => "the NVIDIA driver's CUDA version could not be read".into(),
    };
    let hint = match (v.driver, v.built) {
        (Some(d), Some(b)) if d < b => {
            let branch = min_driver_for(b / 1000)
                .map_or(String::new(), |m| format!(" (driver {m} or newer)"));
            format!(
                "the driver is too old: install one that supports CUDA {}{branch}",
                cuda_version_text(b)
            )
        }
        _ => "check that the GPU is visible to this container (NVIDIA_VISIBLE_DEVICES, the \
              device plugin's nvidia.com/gpu resource) and that the index exists"
            .into(),
    };
    format!(
        "--device cuda:{n}: cannot open the GPU ({cause}); {driver}, this binary was built \
         against {built}; {hint}"
    )
}

/// The driver's and the build's CUDA versions, read through cudarc's driver bindings.
#[cfg(feature = "cuda")]
mod cuda_probe {
    use candle_core::cuda_backend::cudarc::driver::sys;

    /// The toolkit version cudarc's bindings were generated for (picked at build time from
    /// the toolkit's nvcc).
    pub const BUILT: Option<u32> = Some(sys::CUDA_VERSION);

    /// `cuDriverGetVersion`: needs no `cuInit` and no device, so it answers even when
    /// opening the GPU failed, as long as the driver's library is there.
    #[allow(unsafe_code)]
    pub fn driver_version() -> Option<u32> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the call writes one int through a pointer to a live local and keeps nothing.
        let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            u32::try_from(v).ok().filter(|&v| v > 0)
        } else {
            None
        }
    }
}

/// Without the `cuda` feature no CUDA device is ever opened (placement refuses it first).
#[cfg(not(feature = "cuda"))]
mod cuda_probe {
    pub const BUILT: Option<u32> = None;

    pub fn driver_version() -> Option<u32> {
        None
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
        if !cfg!(feature = "cuda") {
            // Opening CUDA in a CPU build fails with the versions spelled out (unknown here).
            let open = open_device(DeviceChoice::Cuda(0)).unwrap_err().to_string();
            assert!(open.contains("cannot open the GPU"), "{open}");
            assert!(open.contains("this binary was built against"), "{open}");
        }
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

    #[test]
    fn a_cuda_open_error_names_both_versions_and_an_old_driver() {
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12040), "12.4");
        let old = CudaVersions {
            driver: Some(12040),
            built: Some(13000),
        };
        let e = cuda_open_error(0, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", old);
        for part in [
            "--device cuda:0",
            "DRIVER_MISMATCH",
            "driver supports CUDA 12.4",
            "built against CUDA 13.0",
            "too old",
            "driver 580 or newer",
        ] {
            assert!(e.contains(part), "{part:?} in {e}");
        }
        let ok = CudaVersions {
            driver: Some(13000),
            built: Some(13000),
        };
        let e = cuda_open_error(1, "CUDA_ERROR_NO_DEVICE", ok);
        assert!(!e.contains("too old") && e.contains("visible"), "{e}");
        let unknown = CudaVersions {
            driver: None,
            built: None,
        };
        let e = cuda_open_error(0, "x", unknown);
        assert!(
            e.contains("could not be read") && e.contains("unknown CUDA"),
            "{e}"
        );
    }
}
